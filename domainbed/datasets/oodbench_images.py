"""OoD-Bench's correlation-shift image datasets (Ye et al. 2022, "OoD-Bench: Quantifying
and Understanding Two Dimensions of Out-of-Distribution Generalization"): CelebA_Blond and
NICO_Mixed, with the cell counts of the paper's Tables 10 and 9.

``CelebA_Blond``: environments [unbalanced_1, unbalanced_2, balanced] (OoD-Bench's names; two
training environments and a balanced test one), y = Blond_Hair, spurious attribute = Male.
Cells (Table 10): unbalanced_1 blond M 462 / F 11,671, not-blond M 11,671 / F 462;
unbalanced_2 blond M 924 / F 11,209, not-blond M 11,209 / F 924; balanced 362 per cell
(49,980 images; the paper's "27,040" is a typo: the authors' split files hold these counts).
Built from the CelebA release (layout of ``domainbed.datasets.subpopulation.CelebA``, all
official partitions pooled): per cell, the matching images in file-name order are permuted
with ``RandomState(data_seed)`` and cut into balanced, unbalanced_1, unbalanced_2 in that
order. Where the authors' split lists ``celeba/blond_split/{tr_env1,tr_env2,te_env}_df.csv``
are present (a `filename` column), their images are used instead. The OoD-Bench repository
publishes them as pickles, which are never read here (unpickling runs code): convert them
once with ``domainbed-download --convert_blond_split_pickles`` (``convert_blond_split_pickles``).

``NICO_Mixed``: environments [train1, train2, val, test] (OoD-Bench's NICOMixed), y = animal
(0) / vehicle (1), attribute = context (on_snow, in_forest, on_beach, on_grass). Cells
(Table 9): train1 animal 10/400/10/400, vehicle 400/10/400/10; train2 animal 20/390/20/390,
vehicle 390/20/390/20; val 50 each; test animal 90/10/90/10, vehicle 10/90/10/90 (4,080).
Layout: ``DATA_DIR/NICO/{animal,vehicle}/images/<category>/<context>/<image>``. With the
authors' lists ``DATA_DIR/NICO/mixed_split_corrected/env_{train1,train2,val,test}.csv``
present they are used (rows: path, category, context, superclass); otherwise each cell's
images (sorted paths, all categories) are permuted with ``RandomState(data_seed)`` and cut
in environment order. OoD-Bench selects on the val environment: DEFAULT_TEST_ENVS [2, 3].
"""
import os
from typing import Any

import numpy as np

from domainbed.datasets.layout import (
    check_sampled_files,
    find_root,
    pandas_module,
    require_files,
)
from domainbed.datasets.subpopulation import SubpopulationDataset, group_names, read_celeba
from domainbed.hparams import Hparam
from domainbed.registry import register_dataset
from oodutils.csv_out import csv_text, csv_value
from oodutils.errors import UserError
from oodutils.fileio import atomic_write_text

CELEBA_BLOND_CELLS = {  # env -> {(blond, male): count}
    "unbalanced_1": {(1, 1): 462, (1, 0): 11671, (0, 1): 11671, (0, 0): 462},
    "unbalanced_2": {(1, 1): 924, (1, 0): 11209, (0, 1): 11209, (0, 0): 924},
    "balanced": {(1, 1): 362, (1, 0): 362, (0, 1): 362, (0, 0): 362},
}
CELEBA_CUT_ORDER = ("balanced", "unbalanced_1", "unbalanced_2")
AUGMENTED = {"data_augmentation": Hparam(True, lambda r: True, "OoD-Bench augments (DomainBed)",
                                         choices=(False, True))}
NICO_CONTEXTS = ["on_snow", "in_forest", "on_beach", "on_grass"]
NICO_SUPERCLASSES = ["animal", "vehicle"]
NICO_CELLS = {  # env -> {(superclass, context): count}
    "train1": {**{("animal", c): n for c, n in zip(NICO_CONTEXTS, (10, 400, 10, 400))},
               **{("vehicle", c): n for c, n in zip(NICO_CONTEXTS, (400, 10, 400, 10))}},
    "train2": {**{("animal", c): n for c, n in zip(NICO_CONTEXTS, (20, 390, 20, 390))},
               **{("vehicle", c): n for c, n in zip(NICO_CONTEXTS, (390, 20, 390, 20))}},
    "val": {(s, c): 50 for s in NICO_SUPERCLASSES for c in NICO_CONTEXTS},
    "test": {**{("animal", c): n for c, n in zip(NICO_CONTEXTS, (90, 10, 90, 10))},
             **{("vehicle", c): n for c, n in zip(NICO_CONTEXTS, (10, 90, 10, 90))}},
}


def cut_cells(pools: Any, cells_by_env: Any, order: Any, seed: int, name: str) -> Any:
    """{env: [pool indices]}: each cell's pool permuted once, then cut in `order`."""
    rng = np.random.RandomState(seed)
    chosen: Any = {env: [] for env in cells_by_env}
    for cell in sorted(pools, key=str):
        pool = np.asarray(pools[cell])[rng.permutation(len(pools[cell]))]
        need = sum(cells_by_env[env].get(cell, 0) for env in order)
        if need > len(pool):
            raise UserError(f"{name}: cell {cell} needs {need} images, the data has "
                            f"{len(pool)} (incomplete dataset?)")
        start = 0
        for env in order:
            n = cells_by_env[env].get(cell, 0)
            chosen[env].extend(pool[start:start + n].tolist())
            start += n
    return chosen


@register_dataset("CelebA_Blond")
class CelebA_Blond(SubpopulationDataset):
    """OoD-Bench's CelebA correlation-shift split (module docstring)."""
    ENVIRONMENTS = list(CELEBA_BLOND_CELLS)
    DEFAULT_TEST_ENVS = [2]  # OoD-Bench: train on the two unbalanced, test on balanced
    CLASSES = ["not_blond", "blond"]
    ATTRIBUTES = ["female", "male"]
    GROUP_NAMES = group_names(CLASSES, ATTRIBUTES)
    N_STEPS = 2001
    CHECKPOINT_FREQ = 200
    HPARAMS = AUGMENTED

    def __init__(self, root: str, test_envs: Any, hparams: dict[str, Any],
                 data_seed: int = 0) -> None:
        name = self.registry_name
        data_root, df, paths = read_celeba(name, root)
        y, a = df["y"].to_numpy(), df["a"].to_numpy()
        chosen = self.authors_split(data_root, df) or cut_cells(
            {(b, m): np.flatnonzero((y == b) & (a == m)) for b in (0, 1) for m in (0, 1)},
            CELEBA_BLOND_CELLS, CELEBA_CUT_ORDER, data_seed, name)
        rows = np.concatenate([np.asarray(chosen[e], dtype=np.int64) for e in self.ENVIRONMENTS])
        env = np.concatenate([np.full(len(chosen[e]), i) for i, e in
                              enumerate(self.ENVIRONMENTS)])
        self.build_image_environments(env, y[rows], a[rows], df["id"].to_numpy()[rows],
                                      [paths[r] for r in rows], test_envs, hparams, data_root)

    def authors_split(self, data_root: Any, df: Any) -> Any:
        """{env: row indices} from the authors' split lists (CSV), or None without them."""
        files = blond_split_files(data_root, ".csv")
        if not all(os.path.isfile(f) for f in files):
            if any(os.path.lexists(f) for f in blond_split_files(data_root, ".pickle")):
                raise UserError(
                    f"{self.registry_name}: {os.path.dirname(files[0])} holds the authors' "
                    "split as pickles, which are never read (unpickling runs any code the "
                    "file holds); convert them once with `domainbed-download --data_dir "
                    "DATA_DIR --convert_blond_split_pickles` if you trust where they came "
                    "from, or remove them to use the seeded split")
            return None
        pd = pandas_module()
        row_of = {f: i for i, f in enumerate(df["filename"])}
        out = {}
        for env, path in zip(self.ENVIRONMENTS, files):
            try:
                names = [csv_value(n) for n in pd.read_csv(path, dtype=str)["filename"]]
            except (ValueError, KeyError, OSError) as e:
                raise UserError(f"{self.registry_name}: cannot read {path} (a CSV with a "
                                f"`filename` column): {type(e).__name__}") from None
            missing = [n for n in names if n not in row_of]
            if missing:
                raise UserError(f"{self.registry_name}: {path} lists {missing[0]}, which is "
                                "not in list_attr_celeba.txt")
            out[env] = [row_of[n] for n in names]
        return out


BLOND_SPLIT_NAMES = ("tr_env1", "tr_env2", "te_env")  # OoD-Bench's file names, env order


def blond_split_files(celeba_root: Any, suffix: Any) -> list[Any]:
    return [os.path.join(celeba_root, "blond_split", f"{e}_df{suffix}")
            for e in BLOND_SPLIT_NAMES]


def convert_blond_split_pickles(celeba_root: Any) -> Any:
    """UNSAFE by nature: unpickles OoD-Bench's `blond_split/*_df.pickle` (the form the
    authors publish; unpickling runs any code a file holds) once, and writes the image
    names each lists as `*_df.csv`, the only form CelebA_Blond reads. Returns the CSVs."""
    pd = pandas_module()
    written = []
    for source, target in zip(blond_split_files(celeba_root, ".pickle"),
                              blond_split_files(celeba_root, ".csv")):
        if not os.path.isfile(source):
            raise UserError(f"no {source} to convert")
        names = [str(n) for n in pd.read_pickle(source).index]
        atomic_write_text(target, csv_text(["filename"], [[n] for n in names]))
        written.append(target)
    return written


@register_dataset("NICO_Mixed")
class NICO_Mixed(SubpopulationDataset):
    """OoD-Bench's NICO animal/vehicle mixed split (module docstring)."""
    ENVIRONMENTS = list(NICO_CELLS)
    DEFAULT_TEST_ENVS = [2, 3]
    CLASSES = list(NICO_SUPERCLASSES)
    ATTRIBUTES = list(NICO_CONTEXTS)
    GROUP_NAMES = group_names(CLASSES, ATTRIBUTES)
    CHECKPOINT_FREQ = 200
    HPARAMS = AUGMENTED

    def __init__(self, root: str, test_envs: Any, hparams: dict[str, Any],
                 data_seed: int = 0) -> None:
        name = self.registry_name
        base = find_root(name, root, ("NICO",), "animal")
        require_files(name, base, [f"{s}/images" for s in NICO_SUPERCLASSES])
        lists = os.path.join(base, "mixed_split_corrected")
        if os.path.isdir(lists):
            rel, env = self.authors_split(lists)
        else:
            rel, env = self.rule_split(base, data_seed)
        superclass = np.array([p.split("/")[0] for p in rel])
        context = np.array([p.split("/")[-2] for p in rel])
        bad = sorted(set(context) - set(NICO_CONTEXTS))
        if bad:
            raise UserError(f"{name}: unknown context folder {bad[0]!r} under {base}; "
                            f"expected {', '.join(NICO_CONTEXTS)}")
        y = np.array([NICO_SUPERCLASSES.index(s) for s in superclass])
        a = np.array([NICO_CONTEXTS.index(c) for c in context])
        paths = [os.path.join(base, *p.split("/")) for p in rel]
        check_sampled_files(name, paths, base)
        self.build_image_environments(env, y, a, np.arange(len(rel)), paths, test_envs,
                                      hparams, base)

    def rule_split(self, base: Any, data_seed: Any) -> tuple[Any, ...]:
        files: list[Any]
        pools: dict[Any, Any]
        files, pools = [], {}
        for s in NICO_SUPERCLASSES:
            images = os.path.join(base, s, "images")
            for category in sorted(os.listdir(images)):
                for context in NICO_CONTEXTS:
                    folder = os.path.join(images, category, context)
                    if not os.path.isdir(folder):
                        continue
                    for f in sorted(os.listdir(folder)):
                        pools.setdefault((s, context), []).append(len(files))
                        files.append(f"{s}/images/{category}/{context}/{f}")
        chosen = cut_cells(pools, NICO_CELLS, list(NICO_CELLS), data_seed, self.registry_name)
        rel = [files[i] for e in NICO_CELLS for i in chosen[e]]
        env = np.concatenate([np.full(len(chosen[e]), i) for i, e in enumerate(NICO_CELLS)])
        return rel, env

    def authors_split(self, lists: Any) -> tuple[Any, ...]:
        rel, env = [], []
        for i, e in enumerate(self.ENVIRONMENTS):
            path = os.path.join(lists, f"env_{e}.csv")
            if not os.path.exists(path):
                raise UserError(f"{self.registry_name}: {path} not found (partial "
                                "mixed_split_corrected folder)")
            with open(path) as f:
                for line in f:
                    parts = line.strip().split(",")
                    if len(parts) != 4:
                        continue
                    image, _, _, superclass = parts
                    rel.append(f"{superclass}/images/{image.replace(chr(92), '/')}")
                    env.append(i)
        return rel, np.asarray(env)
