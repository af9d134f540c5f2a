"""domainbed.train: the train command's options as keyword arguments (the README runs a
real training through it; here the cheap checks)."""
import pytest

import domainbed
from oodutils.errors import UserError


def test_unknown_option_is_one_clear_error(tmp_path):
    with pytest.raises(UserError, match="unknown training option.*bogus; valid: algorithm"):
        domainbed.train(dataset="ColoredMNIST", output_dir=tmp_path / "r", bogus=1)


def test_bad_names_fail_before_any_work(tmp_path):
    with pytest.raises(UserError, match="unknown dataset"):
        domainbed.train(dataset="NoSuchDataset", output_dir=tmp_path / "r",
                        data_dir=str(tmp_path))
    assert not (tmp_path / "r").exists()
