"""WILDS image datasets with DomainBed's environment definitions: WILDSCamelyon (5 hospitals)
and WILDSFMoW (6 regions), read through the ``wilds`` package from a local root.

Layout: what ``wilds`` (or ``python -m domainbed.scripts.download``) leaves under DATA_DIR:
``DATA_DIR/camelyon17_v1.0/{RELEASE_v1.0.txt, metadata.csv, patches/...}`` and
``DATA_DIR/fmow_v1.1/{RELEASE_v1.1.txt, rgb_metadata.csv, country_code_mapping.csv,
images/rgb_img_<i>.png}``. Nothing is downloaded here.

Environments as DomainBed's WILDSDataset: one per sorted distinct value of the metadata field
(``hospital`` / ``region``), named ``hospital_<v>`` / ``region_<v>``. Example id: the index of
the example in the WILDS dataset. Transforms: DomainBed's (resize, and its augmentation on
training environments when ``data_augmentation``); ``image_size`` defaults to 96 for Camelyon
(its patches' native size, as Salaudeen et al. 2025, "Are Domain Generalization Benchmarks
with Accuracy on the Line Misspecified?", use them) and 224 for FMoW.
"""
import os
from typing import Any

import numpy as np

from domainbed.datasets.base import MultipleDomainDataset
from domainbed.datasets.image_folders import ImageEnvironment, make_transforms
from domainbed.datasets.layout import check_sampled_files, fingerprint_columns
from domainbed.hparams import Hparam
from domainbed.registry import register_dataset
from oodutils.errors import UserError, require


class WILDSImageDataset(MultipleDomainDataset):
    """Environments = sorted values of one WILDS metadata field (DomainBed's definition)."""
    METADATA_FIELD: Any = None
    WILDS_NAME: Any = None      # the wilds package's dataset name (for get_dataset)
    CHECKPOINT_FREQ = 1000
    N_WORKERS = 4
    input_path: Any   # (wilds dataset, index) -> the example's file: each subclass's own

    def __init__(self, root: str, test_envs: Any, hparams: dict[str, Any]) -> None:
        dataset = self.open_wilds(root)
        field = dataset.metadata_fields.index(self.METADATA_FIELD)
        values = dataset.metadata_array[:, field].numpy()
        distinct = sorted(set(values.tolist()))
        expected = [f"{self.METADATA_FIELD}_{v}" for v in distinct]
        if expected != list(self.ENVIRONMENTS):
            raise UserError(f"{self.registry_name}: the data under {dataset.data_dir} has "
                            f"environments {', '.join(expected)}; expected "
                            f"{', '.join(self.ENVIRONMENTS)} (partial or different release)")
        paths = [self.input_path(dataset, i) for i in range(len(dataset))]
        check_sampled_files(self.registry_name, paths, dataset.data_dir)
        y = dataset.y_array.numpy().astype(np.int64)
        size = int((hparams or {}).get("image_size", self.INPUT_SHAPE[1]))
        augment = bool((hparams or {}).get("data_augmentation", True))
        self.datasets = []
        for i, v in enumerate(distinct):
            keep = np.flatnonzero(values == v)
            train_t, eval_t = make_transforms(i not in test_envs, augment, size)
            self.datasets.append(ImageEnvironment(
                [paths[k] for k in keep], y[keep], keep, train_transform=train_t,
                eval_transform=eval_t, training=i not in test_envs))
        self.input_shape = (3, size, size)
        self.num_classes = int(dataset.n_classes)
        self.data_source = f"wilds:{os.path.abspath(dataset.data_dir)}"
        self.data_fingerprint = fingerprint_columns(values, y, [
            os.path.relpath(p, dataset.data_dir) for p in paths])

    def open_wilds(self, root: str) -> Any:
        wilds = require("wilds", extra="wilds")
        try:
            return wilds.get_dataset(self.WILDS_NAME, root_dir=root, download=False)
        except (FileNotFoundError, OSError, KeyError, ValueError) as e:
            raise UserError(
                f"{self.registry_name}: no complete WILDS {self.WILDS_NAME} release under "
                f"{root} ({type(e).__name__}: {e}); run `python -m domainbed.scripts.download "
                f"--datasets {self.registry_name} --data_dir DATA_DIR`") from None


@register_dataset("WILDSCamelyon")
class WILDSCamelyon(WILDSImageDataset):
    ENVIRONMENTS = ["hospital_0", "hospital_1", "hospital_2", "hospital_3", "hospital_4"]
    INPUT_SHAPE = (3, 96, 96)
    METADATA_FIELD = "hospital"
    WILDS_NAME = "camelyon17"
    HPARAMS = {"image_size": Hparam(96, lambda r: 96, "side patches are resized to", low=8,
                                    high=1024)}

    def input_path(self, dataset: Any, i: int) -> str:
        return os.path.join(dataset.data_dir, dataset._input_array[i])


@register_dataset("WILDSFMoW")
class WILDSFMoW(WILDSImageDataset):
    ENVIRONMENTS = [f"region_{i}" for i in range(6)]
    INPUT_SHAPE = (3, 224, 224)
    METADATA_FIELD = "region"
    WILDS_NAME = "fmow"
    HPARAMS = {"image_size": Hparam(224, lambda r: 224, "side images are resized to", low=8,
                                    high=1024)}

    def input_path(self, dataset: Any, i: int) -> str:
        return os.path.join(dataset.data_dir, "images", f"rgb_img_{dataset.full_idxs[i]}.png")
