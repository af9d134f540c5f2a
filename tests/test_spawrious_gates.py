"""Measurable gates of the procedural backend (small images, small CNNs, CPU):
backgrounds alone give the location; with backgrounds balanced across breeds the breed
is learnable; the fur colour carries no breed information."""
import multiprocessing

import numpy as np
import pytest
import torch
import torch.nn as nn

from spawrious.constants import BREEDS, FUR, LOCATIONS, TIMES_OF_DAY
from spawrious.dogs import fur_colour
from spawrious.procedural import render, render_background_only
from spawrious.prompts import PromptSpec, enumerate_prompts

SIZE = 32
N_TRAIN, N_TEST = 2400, 600


def _balanced_example(i):
    """Breed cycles, location and the other factors drawn independently of it."""
    rng = np.random.default_rng(10_000 + i)
    breed = BREEDS[i % 4]
    location = LOCATIONS[int(rng.integers(6))]
    spec = enumerate_prompts(breed, location)[int(rng.integers(72))]
    image, mask = render(spec, i, SIZE, return_mask=True)
    return image, i % 4, LOCATIONS.index(location), FUR.index(spec.fur), mask


def _background_crop(i):
    rng = np.random.default_rng(20_000 + i)
    loc = int(rng.integers(6))
    image = render_background_only(LOCATIONS[loc], i, SIZE,
                                   TIMES_OF_DAY[int(rng.integers(len(TIMES_OF_DAY)))])
    half = SIZE // 2
    y, x = rng.integers(0, SIZE - half + 1, 2)
    return image[y:y + half, x:x + half], loc


def _map(fn, n):
    with multiprocessing.get_context("fork").Pool(2) as pool:
        return pool.map(fn, range(n), chunksize=64)


@pytest.fixture(scope="module")
def balanced():
    rows = _map(_balanced_example, N_TRAIN + N_TEST)
    return {"x": np.stack([r[0] for r in rows]), "breed": np.array([r[1] for r in rows]),
            "location": np.array([r[2] for r in rows]), "fur": np.array([r[3] for r in rows]),
            "mask": np.stack([r[4] for r in rows])}


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _cnn(n_out, c=16):
    def block(i, o):
        return nn.Sequential(nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o),
                             nn.ReLU())
    return nn.Sequential(block(3, c), nn.MaxPool2d(2), block(c, 2 * c), nn.MaxPool2d(2),
                         block(2 * c, 4 * c), nn.MaxPool2d(2), block(4 * c, 4 * c),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * c, n_out))


def _fit_accuracy(x_train, y_train, x_test, y_test, n_out, epochs, lr=3e-3, batch=64):
    torch.manual_seed(0)
    to_t = lambda a: (torch.tensor(a).permute(0, 3, 1, 2).float() / 255 - 0.5) / 0.25  # noqa: E731
    xtr, xte = to_t(x_train), to_t(x_test)
    ytr, yte = torch.tensor(y_train), torch.tensor(y_test)
    model = _cnn(n_out)
    opt = torch.optim.Adam(model.parameters(), lr)
    steps = epochs * ((len(xtr) + batch - 1) // batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=steps)
    for _ in range(epochs):
        model.train()
        perm = torch.randperm(len(xtr))
        for i in range(0, len(xtr), batch):
            idx = perm[i:i + batch]
            xb = xtr[idx]
            flip = torch.rand(len(idx)) < 0.5
            xb = torch.where(flip[:, None, None, None], xb.flip(3), xb)
            loss = nn.functional.cross_entropy(model(xb), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    model.eval()
    with torch.no_grad():
        return (model(xte).argmax(1) == yte).float().mean().item()


def test_location_from_background_crops(two_threads):
    rows = _map(_background_crop, 1500)
    x, y = np.stack([r[0] for r in rows]), np.array([r[1] for r in rows])
    acc = _fit_accuracy(x[:1200], y[:1200], x[1200:], y[1200:], 6, epochs=6)
    assert acc >= 0.95, acc


@pytest.mark.slow
def test_breed_learnable_with_balanced_backgrounds(balanced, two_threads):
    d = balanced
    # backgrounds really are balanced across breeds
    table = np.zeros((4, 6))
    np.add.at(table, (d["breed"], d["location"]), 1)
    assert table.min() > 0.6 * table.mean()
    acc = _fit_accuracy(d["x"][:N_TRAIN], d["breed"][:N_TRAIN], d["x"][N_TRAIN:],
                        d["breed"][N_TRAIN:], 4, epochs=10)
    assert acc >= 0.90, acc


def _nearest_centroid_accuracy(features, labels, n_train):
    xtr, ytr, xte, yte = features[:n_train], labels[:n_train], features[n_train:], labels[n_train:]
    mu, sd = xtr.mean(0), xtr.std(0) + 1e-9
    centroids = np.stack([((xtr[ytr == k] - mu) / sd).mean(0) for k in range(4)])
    dist = (((xte - mu) / sd)[:, None, :] - centroids[None]) ** 2
    return float((dist.sum(-1).argmin(1) == yte).mean())


def test_fur_colour_carries_no_breed_information(balanced):
    # the coat colour is a function of the fur attribute and the image's RNG only
    for fur in FUR:
        colours = [fur_colour(fur, np.random.default_rng(7)) for _ in BREEDS]
        assert all(np.array_equal(colours[0], c) for c in colours)
    # same prompt factors and seed, different breed: the same coat colour on the dog
    means = []
    for breed in BREEDS:
        spec = PromptSpec(breed, "snow", "brown", "", "bright sunny day", 4)
        image, mask = render(spec, 3, 96, return_mask=True)
        means.append(image[mask > 0.99].astype(float).mean(0))
    assert np.ptp(np.stack(means), axis=0).max() < 25
    # the prompt's fur is balanced within every breed (blocks of 72 cover all prompts)
    d = balanced
    table = np.zeros((4, len(FUR)))
    np.add.at(table, (d["breed"], d["fur"]), 1)
    assert table.min() > 0.75 * table.mean()
    # the mean colour of the dog's pixels does not predict the breed
    feats = np.stack([d["x"][i][d["mask"][i] > 0.9].astype(float).mean(0)
                      if (d["mask"][i] > 0.9).any() else np.zeros(3) for i in range(len(d["x"]))])
    acc = _nearest_centroid_accuracy(feats, d["breed"], N_TRAIN)
    assert acc < 0.36, acc


def test_render_is_deterministic_and_sized():
    spec = enumerate_prompts("corgi", "beach")[5]
    a, b = render(spec, 11, 40), render(spec, 11, 40)
    assert a.shape == (40, 40, 3) and a.dtype == np.uint8 and np.array_equal(a, b)
    assert not np.array_equal(a, render(spec, 12, 40))
    assert render(spec, 11, (24, 48)).shape == (24, 48, 3)


def test_locations_look_different():
    """Mean colours of the six scenes are far apart (a sanity check of the palettes)."""
    means = np.stack([np.mean([render_background_only(loc, s, 32).reshape(-1, 3).mean(0)
                               for s in range(5)], axis=0) for loc in LOCATIONS])
    dist = np.sqrt(((means[:, None] - means[None]) ** 2).sum(-1))
    assert dist[~np.eye(6, dtype=bool)].min() > 20
