"""WILDSCamelyon and WILDSFMoW through the wilds package from tiny WILDS-style roots."""
import numpy as np
import pytest

from domainbed.registry import get_dataset_class
from oodutils.errors import UserError
from tests.builders import read_records
from tests.dataset_fixtures import (
    train_cli,
    write_camelyon,
    write_fmow,
)
from tests.requirements import need_package

need_package("wilds")


def test_camelyon_hospitals(tmp_path):
    write_camelyon(tmp_path, per_hospital=3)
    ds = get_dataset_class("WILDSCamelyon")(str(tmp_path), [3], {"image_size": 16})
    assert [len(e) for e in ds] == [3] * 5 and ds.num_classes == 2
    assert np.concatenate([e.ids for e in ds]).tolist() == list(range(15))
    x, y = ds[0][0]
    assert tuple(x.shape) == (3, 16, 16) and ds.input_shape == (3, 16, 16)
    assert ds[4].y.tolist() == [0, 1, 0]


def test_camelyon_missing_and_partial(tmp_path):
    cls = get_dataset_class("WILDSCamelyon")
    with pytest.raises(UserError, match="no complete WILDS camelyon17 release"):
        cls(str(tmp_path), [3], {})
    write_camelyon(tmp_path, per_hospital=1)
    lines = (tmp_path / "camelyon17_v1.0" / "metadata.csv").read_text().splitlines()
    (tmp_path / "camelyon17_v1.0" / "metadata.csv").write_text("\n".join(lines[:3]) + "\n")
    with pytest.raises(UserError, match="environments hospital_0, hospital_1; expected"):
        cls(str(tmp_path), [3], {})


def test_fmow_regions(tmp_path):
    write_fmow(tmp_path, per_region=2)
    ds = get_dataset_class("WILDSFMoW")(str(tmp_path), [5], {"image_size": 16})
    assert ds.ENVIRONMENTS == [f"region_{i}" for i in range(6)]
    assert [len(e) for e in ds] == [2] * 6 and ds.num_classes == 62


@pytest.mark.slow
def test_camelyon_train_cli(tmp_path):
    write_camelyon(tmp_path, per_hospital=4)
    out = tmp_path / "run"
    proc = train_cli(tmp_path, out, "WILDSCamelyon", {"arch": "mlp", "mlp_width": 8,
                                                       "image_size": 8, "pretrained": False,
                                                       "batch_size": 4}, "--test_envs", "4")
    assert proc.returncode == 0, proc.stderr
    assert read_records(out)[-1]["args"]["env_names"][4] == "hospital_4"
