"""The six Spawrious benchmarks as data: the single source of truth for every loader.

Canonical definitions are the authors' code (and DomainBed's SpawriousBenchmark): each
benchmark is (group, test, filler) with classes in the order bulldog, dachshund,
labrador, corgi, built by the authors' two formulas, scaled from 3,168 to `per_cell`:

O2O  env SC_group_1 (pool 0): int(0.97 N) images of each class on its own background,
     N - int(0.97 N) on the shared filler background;
     env SC_group_2 (pool 1): int(0.87 N) + (N - int(0.87 N)) the same way;
     env Test: each class on its test background, N from pool 0 and N from pool 1.
M2M  all from pool 0, N per cell: bulldog g0 | g1 | test t0 + t1, dachshund g1 | g0 |
     t1 + t0, labrador g2 | g3 | t2 + t3, corgi g3 | g2 | t3 + t2 (SC_group_1 | SC_group_2 | Test).

The authors' Test takes every file of its folders (3,168 in the released data); here
it takes the first N in sorted order, which is the same on the released data and
scales with N. Files are always selected in sorted name order.

Variant `paper_table2` uses the M2M columns of the paper's Table 2 instead (the paper's
M2M-Easy = code m2m_hard, M2M-Medium = code m2m_easy, M2M-Hard = the groups of code
m2m_medium with another per-environment assignment); its O2O columns equal the code's.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from oodutils.errors import UnknownNameError, UserError
from spawrious.constants import BREEDS, CLASS_LIST, DEFAULT_PER_CELL, LOCATIONS
from spawrious.layout import cell_dir, cell_relpath, list_images

ENVIRONMENTS = ("Test", "SC_group_1", "SC_group_2")
BENCHMARKS = ("o2o_easy", "o2o_medium", "o2o_hard", "m2m_easy", "m2m_medium", "m2m_hard")
VARIANTS = ("canonical", "paper_table2")
O2O_MU = (0.97, 0.87)    # spurious fraction in SC_group_1, SC_group_2

# (group, test, filler); positions follow BREEDS = (bulldog, dachshund, labrador, corgi)
#: benchmark -> (training locations, test locations, the O2O filler location or None)
CANONICAL: dict[str, tuple[tuple[str, ...], tuple[str, ...], Any]] = {
    "o2o_easy": (("desert", "jungle", "dirt", "snow"),
                 ("dirt", "snow", "desert", "jungle"), "beach"),
    "o2o_medium": (("mountain", "beach", "dirt", "jungle"),
                   ("jungle", "dirt", "beach", "snow"), "desert"),
    "o2o_hard": (("jungle", "mountain", "snow", "desert"),
                 ("mountain", "snow", "desert", "jungle"), "beach"),
    "m2m_easy": (("desert", "mountain", "dirt", "jungle"),
                 ("dirt", "jungle", "mountain", "desert"), None),
    "m2m_medium": (("beach", "snow", "mountain", "desert"),
                   ("desert", "mountain", "beach", "snow"), None),
    "m2m_hard": (("dirt", "jungle", "snow", "beach"),
                 ("snow", "beach", "dirt", "jungle"), None),
}

# Table 2's M2M columns: breed -> (SC_group_1 location, SC_group_2 location, test locations)
PAPER_TABLE2_M2M = {
    "m2m_easy": {"bulldog": ("dirt", "jungle", ("snow", "beach")),
                 "dachshund": ("jungle", "dirt", ("snow", "beach")),
                 "labrador": ("snow", "beach", ("dirt", "jungle")),
                 "corgi": ("beach", "snow", ("dirt", "jungle"))},
    "m2m_medium": {"bulldog": ("desert", "mountain", ("dirt", "jungle")),
                   "dachshund": ("mountain", "desert", ("dirt", "jungle")),
                   "labrador": ("dirt", "jungle", ("mountain", "desert")),
                   "corgi": ("jungle", "dirt", ("mountain", "desert"))},
    "m2m_hard": {"bulldog": ("beach", "snow", ("desert", "mountain")),
                 "dachshund": ("beach", "snow", ("desert", "mountain")),
                 "labrador": ("mountain", "desert", ("beach", "snow")),
                 "corgi": ("mountain", "desert", ("beach", "snow"))},
}
M2M_CLASS_GROUPS = (("bulldog", "dachshund"), ("labrador", "corgi"))


@dataclass(frozen=True)
class Selection:
    """`count` files, in sorted order, of one (pool, location, breed) folder, for `env`."""
    env: str
    pool: int
    location: str
    breed: str
    count: int
    role: str   # "spurious", "filler", "test"


@dataclass(frozen=True)
class Split:
    benchmark: str
    variant: str
    per_cell: int
    kind: str                 # "o2o" | "m2m"
    selections: tuple[Selection, ...]

    @property
    def environments(self) -> tuple[str, ...]:
        return ENVIRONMENTS

    def counts(self) -> dict[tuple[str, str, str], int]:
        """{(env, breed, location): count} summed over pools."""
        out: dict[tuple[str, str, str], int] = {}
        for s in self.selections:
            key = (s.env, s.breed, s.location)
            out[key] = out.get(key, 0) + s.count
        return out

    def summary_rows(self) -> list[tuple[str, str, str, int]]:
        """[(env, breed, location, count)] in environment, label, location order."""
        counts = self.counts()
        return [(e, b, loc, counts[(e, b, loc)]) for e in ENVIRONMENTS for b in CLASS_LIST
                for loc in LOCATIONS if (e, b, loc) in counts]


def check_benchmark(name: str) -> str:
    key = str(name).lower()
    if key not in BENCHMARKS:
        raise UnknownNameError("benchmark", name, BENCHMARKS)
    return key


def check_variant(name: str) -> str:
    if name not in VARIANTS:
        raise UnknownNameError("split variant", name, VARIANTS)
    return name


def _o2o(group: Sequence[str], test: Sequence[str], filler: str, n: int) -> list[Selection]:
    sels = []
    for env, pool, mu in (("SC_group_1", 0, O2O_MU[0]), ("SC_group_2", 1, O2O_MU[1])):
        k = int(mu * n)          # the authors' int(0.97 * 3168) = 3072, int(0.87 * 3168) = 2756
        for breed, loc in zip(BREEDS, group):
            sels.append(Selection(env, pool, loc, breed, k, "spurious"))
        for breed in BREEDS:
            if n - k:
                sels.append(Selection(env, pool, filler, breed, n - k, "filler"))
    for pool in (0, 1):
        for breed, loc in zip(BREEDS, test):
            sels.append(Selection("Test", pool, loc, breed, n, "test"))
    return sels


def _m2m_table(table: Mapping[str, tuple[str, str, tuple[str, ...]]], n: int) -> list[Selection]:
    sels = []
    for breed in BREEDS:
        env1, env2, tests = table[breed]
        sels.append(Selection("SC_group_1", 0, env1, breed, n, "spurious"))
        sels.append(Selection("SC_group_2", 0, env2, breed, n, "spurious"))
        for loc in tests:
            sels.append(Selection("Test", 0, loc, breed, n, "test"))
    return sels


def m2m_table_from_code(group: Sequence[str],
                        test: Sequence[str]) -> dict[str, tuple[str, str, tuple[str, ...]]]:
    """The authors' build_type2_combination as a breed -> (env1, env2, tests) table."""
    g, t = group, test
    return {"bulldog": (g[0], g[1], (t[0], t[1])), "dachshund": (g[1], g[0], (t[1], t[0])),
            "labrador": (g[2], g[3], (t[2], t[3])), "corgi": (g[3], g[2], (t[3], t[2]))}


def build_split(benchmark: str, per_cell: int = DEFAULT_PER_CELL,
                variant: str = "canonical") -> Split:
    benchmark, variant = check_benchmark(benchmark), check_variant(variant)
    per_cell = int(per_cell)
    if per_cell < 1:
        raise UserError(f"per-cell count must be >= 1, got {per_cell}")
    group, test, filler = CANONICAL[benchmark]
    if benchmark.startswith("o2o"):
        sels = _o2o(group, test, filler, per_cell)      # Table 2's O2O columns are the same
    elif variant == "paper_table2":
        sels = _m2m_table(PAPER_TABLE2_M2M[benchmark], per_cell)
    else:
        sels = _m2m_table(m2m_table_from_code(group, test), per_cell)
    return Split(benchmark, variant, per_cell, benchmark[:3], tuple(sels))


@dataclass(frozen=True)
class Example:
    env: str
    pool: int
    location: str
    breed: str
    position: int     # index of the file in its folder's sorted listing
    path: str         # relative to the dataset dir: "<pool>/<location>/<breed>/<name>"


def select_files(dataset_dir: str, split: Split) -> dict[str, list[Example]]:
    """The examples of every environment: {env: [Example, ...]} (sorted file selection).
    Raises UserError naming the first cell that holds too few images."""
    out: dict[str, list[Example]] = {env: [] for env in ENVIRONMENTS}
    listing: dict[tuple[int, str, str], list[str]] = {}
    for s in split.selections:
        key = (s.pool, s.location, s.breed)
        if key not in listing:
            listing[key] = list_images(cell_dir(dataset_dir, *key))
        names = listing[key]
        if len(names) < s.count:
            raise UserError(
                f"{split.benchmark} needs {s.count} images in {cell_dir(dataset_dir, *key)} "
                f"(pool {s.pool}, {s.location}, {s.breed}) but found {len(names)}; generate "
                f"them with `python -m spawrious.generate --per_cell {split.per_cell}` or "
                f"pass the per-cell count the data was made with")
        out[s.env].extend(Example(s.env, s.pool, s.location, s.breed, i,
                                  cell_relpath(s.pool, s.location, s.breed, names[i]))
                          for i in range(s.count))
    return out


def selected_counts(examples: Mapping[str, Sequence[Example]]) -> dict[tuple[str, str, str], int]:
    counts: dict[tuple[str, str, str], int] = {}
    for env, exs in examples.items():
        for ex in exs:
            key = (env, ex.breed, ex.location)
            counts[key] = counts.get(key, 0) + 1
    return counts


if __name__ == "__main__":  # python -m spawrious.splits runs spawrious.splits_cli
    import runpy
    runpy.run_module("spawrious.splits_cli", run_name="__main__", alter_sys=True)
