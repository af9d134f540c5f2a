"""The Spawrious datasets in the registry, on procedurally generated images; and a small
ERM run showing the spurious-background failure (OOD accuracy far below ID accuracy,
errors toward the class whose training background is the test background)."""
import numpy as np
import pytest
import torch
import torch.nn as nn

from domainbed.registry import get_dataset_class
from domainbed.run_hparams import default_hparams
from oodutils.errors import UserError
from spawrious.constants import CLASS_LIST, LOCATIONS
from spawrious.generate import generate_procedural_fast, prepare_output
from spawrious.splits import BENCHMARKS, build_split

N = 40
NAMES = ["SpawriousO2O_easy", "SpawriousO2O_medium", "SpawriousO2O_hard",
         "SpawriousM2M_easy", "SpawriousM2M_medium", "SpawriousM2M_hard"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    out = tmp_path_factory.mktemp("spawrious")
    ds = prepare_output(out, "procedural", 3, {"size": 32}, N)
    cells = [(p, loc, b) for p in (0, 1) for loc in LOCATIONS for b in CLASS_LIST]
    generate_procedural_fast(ds, 3, 32, N, cells, workers=2, log=lambda m: None)
    return str(out)


def _hparams(name, **kw):
    hp = default_hparams("ERM", name)
    hp.update(image_size=32, **kw)
    return hp


@pytest.mark.parametrize("name,bench", list(zip(NAMES, BENCHMARKS)))
def test_benchmark_environments(root, name, bench):
    cls = get_dataset_class(name)
    assert cls.ENVIRONMENTS == ["Test", "SC_group_1", "SC_group_2"]
    assert cls.CLASSES == ["bulldog", "corgi", "dachshund", "labrador"]
    assert len(cls.GROUP_NAMES) == 24 and cls.GROUP_NAMES[0] == "bulldog_beach"
    d = cls(root, [0], _hparams(name))
    assert d.num_classes == 4 and d.input_shape == (3, 32, 32) and len(d) == 3
    assert [len(e) for e in d] == [8 * N, 4 * N, 4 * N]
    expected = build_split(bench, N).counts()
    got = {}
    for env_name, env in zip(cls.ENVIRONMENTS, d):
        assert np.array_equal(env.groups, env.y.numpy() * 6 + env.locations)
        for y, loc in zip(env.y.tolist(), env.locations.tolist()):
            key = (env_name, CLASS_LIST[y], LOCATIONS[loc])
            got[key] = got.get(key, 0) + 1
        assert np.bincount(env.y.numpy()).tolist() == [len(env) // 4] * 4
    assert got == expected
    ids = np.concatenate([e.ids for e in d])
    assert len(np.unique(ids)) == len(ids)
    assert d.data_source.startswith("spawrious:procedural-seed3:") and len(d.data_fingerprint) == 16


def test_ids_name_files_across_benchmarks(root):
    a = get_dataset_class("SpawriousO2O_easy")(root, [0], _hparams("SpawriousO2O_easy"))
    b = get_dataset_class("SpawriousO2O_hard")(root, [0], _hparams("SpawriousO2O_hard"))
    ids_a = {i: p for e in a for i, p in zip(e.ids, e.paths)}
    ids_b = {i: p for e in b for i, p in zip(e.ids, e.paths)}
    shared = set(ids_a) & set(ids_b)
    assert shared and all(ids_a[i] == ids_b[i] for i in shared)


def test_items_and_transform_switch(root):
    d = get_dataset_class("SpawriousO2O_easy")(root, [0], _hparams("SpawriousO2O_easy"))
    train_env, test_env = d[1], d[0]
    assert train_env.transform is train_env.train_transform            # DomainBed's default
    assert train_env.train_transform is not train_env.eval_transform    # augmented
    assert test_env.transform is test_env.eval_transform
    assert test_env.train_transform is test_env.eval_transform          # never augmented
    x, y = test_env[0]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and int(y) == test_env.y[0]
    a, b = train_env.subset([0, 1, 2]), train_env.subset([3, 4])
    a.set_transform(False)
    assert a.transform is a.eval_transform and b.transform is b.train_transform
    assert train_env.transform is train_env.train_transform
    torch.testing.assert_close(a[1][0], train_env.subset([1]).set_transform(False)[0][0])
    assert a.paths == train_env.paths[:3] and np.array_equal(a.groups, train_env.groups[:3])
    no_aug = get_dataset_class("SpawriousO2O_easy")(
        root, [0], _hparams("SpawriousO2O_easy", data_augmentation=False))
    assert no_aug[1].train_transform is no_aug[1].eval_transform
    loader = torch.utils.data.DataLoader(a, batch_size=3)
    xb, yb = next(iter(loader))
    assert xb.shape == (3, 3, 32, 32) and yb.tolist() == a.y.tolist()


def test_data_dir_forms_and_errors(root, tmp_path):
    cls = get_dataset_class("SpawriousM2M_easy")
    d = cls(root + "/spawrious224", [0], _hparams("SpawriousM2M_easy"))
    assert len(d[1]) == 4 * N
    assert len(cls(root, [0], _hparams("SpawriousM2M_easy"), per_cell=10)[0]) == 80
    with pytest.raises(UserError, match="found 40"):
        cls(root, [0], _hparams("SpawriousM2M_easy"), per_cell=41)
    with pytest.raises(UserError, match="download"):
        cls(str(tmp_path / "missing"), [0], _hparams("SpawriousM2M_easy"))
    with pytest.raises(UserError, match="spawrious.generate"):
        cls(str(tmp_path), [0], _hparams("SpawriousM2M_easy"))


def _tensors(env):
    env.set_transform(False)
    xs, ys = zip(*[env[i] for i in range(len(env))])
    return torch.stack(xs), torch.stack(ys)


def test_erm_relies_on_the_spurious_background(root):
    """ERM on O2O-easy: near-perfect on held-out training-environment images, far worse on
    the test environment, where most errors name the class whose training background is
    the test background (bulldog on dirt -> labrador, ...)."""
    torch.manual_seed(0)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        d = get_dataset_class("SpawriousO2O_easy")(
            root, [0], _hparams("SpawriousO2O_easy", data_augmentation=False))
        xs, ys = zip(*[_tensors(d[i]) for i in (1, 2)])
        x, y = torch.cat(xs), torch.cat(ys)
        perm = torch.randperm(len(x))
        tr, ho = perm[: int(0.8 * len(x))], perm[int(0.8 * len(x)):]
        x_test, y_test = _tensors(d[0])
        model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 4))
        opt = torch.optim.Adam(model.parameters(), 3e-3)
        for _ in range(120):
            idx = tr[torch.randperm(len(tr))[:32]]
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            id_acc = (model(x[ho]).argmax(1) == y[ho]).float().mean().item()
            pred = model(x_test).argmax(1)
        ood_acc = (pred == y_test).float().mean().item()
    finally:
        torch.set_num_threads(before)
    assert id_acc >= 0.8, id_acc       # 0.91 measured (background alone: ~0.92)
    assert ood_acc <= id_acc - 0.4, (id_acc, ood_acc)
    # the class trained on each test background (O2O-easy: bulldog desert, dachshund
    # jungle, labrador dirt, corgi snow; tests: bulldog dirt, dachshund snow, ...)
    trained_on = {"desert": "bulldog", "jungle": "dachshund", "dirt": "labrador", "snow": "corgi"}
    spurious_class = torch.tensor([CLASS_LIST.index(trained_on[LOCATIONS[loc]])
                                   for loc in d[0].locations])
    wrong = pred != y_test
    assert (pred[wrong] == spurious_class[wrong]).float().mean() >= 0.7
