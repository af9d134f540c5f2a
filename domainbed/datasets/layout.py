"""Layout checks shared by the dataset loaders: every loader says precisely what is missing
(which file, which dataset, how to get it) instead of failing with a traceback."""
import hashlib
import os
from typing import Any

import numpy as np

from oodutils.errors import UserError

FILE_SAMPLE = 256  # image files checked per dataset (evenly spaced, so the check stays cheap)


def download_hint(name: str, how: Any = None) -> Any:
    return how or (f"run `python -m domainbed.scripts.download --datasets {name} "
                   f"--data_dir DATA_DIR` and pass --data_dir DATA_DIR")


def find_root(name: str, data_dir: str, candidates: Any, marker: Any, how: Any = None) -> Any:
    """The first `data_dir/candidate` holding `marker`; a clear error naming the expected path
    otherwise (the first candidate is the canonical layout)."""
    for candidate in candidates:
        root = os.path.join(data_dir, candidate)
        if os.path.exists(os.path.join(root, marker)):
            return root
    expected = os.path.join(data_dir, candidates[0], marker)
    others = [os.path.join(c, marker) for c in candidates[1:]]
    also = f" (nor {', '.join(others)})" if others else ""
    raise UserError(f"{name}: {expected} not found{also}; {download_hint(name, how)}")


def require_files(name: str, root: str, relative_paths: Any, how: Any = None) -> None:
    """Each of `relative_paths` must exist under root, else a clear error naming it."""
    for rel in relative_paths:
        path = os.path.join(root, rel)
        if not os.path.exists(path):
            raise UserError(f"{name}: {path} not found (incomplete layout under {root}); "
                            f"{download_hint(name, how)}")


def check_sampled_files(name: str, paths: Any, root: str, how: Any = None) -> None:
    """A partial layout (metadata present, files missing) is named as such. Checks an evenly
    spaced sample of at most FILE_SAMPLE files so that loading stays fast on real data."""
    if not len(paths):
        raise UserError(f"{name}: the metadata under {root} lists no examples")
    picks = np.unique(np.linspace(0, len(paths) - 1, min(FILE_SAMPLE, len(paths))).astype(int))
    missing = [paths[i] for i in picks if not os.path.exists(paths[i])]
    if missing:
        raise UserError(f"{name}: partial layout under {root}: {len(missing)} of {len(picks)} "
                        f"sampled files are missing, e.g. {missing[0]}; "
                        f"{download_hint(name, how)}")


def fingerprint_columns(*columns: Any) -> Any:
    """A short stable hash of metadata columns (strings or numbers), in order."""
    digest = hashlib.sha256()
    for column in columns:
        arr = np.asarray(column)
        digest.update(f"{arr.dtype.kind}{arr.shape}".encode())
        if arr.dtype.kind in "OUS":
            digest.update("\x1f".join(map(str, arr.tolist())).encode("utf-8"))
        else:
            digest.update(np.ascontiguousarray(arr.astype(np.int64)).tobytes())
    return digest.hexdigest()[:16]


def pandas_module() -> Any:
    """pandas, imported when a dataset first reads a table (heavy: not when the registry
    loads the dataset modules)."""
    import pandas
    return pandas


def read_csv(name: str, path: str, columns: Any, how: Any = None, **kwargs: Any) -> Any:
    """pandas.read_csv with the required columns checked (a wrong layout is named)."""
    try:
        df = pandas_module().read_csv(path, **kwargs)
    except (OSError, ValueError) as e:
        raise UserError(f"{name}: cannot read {path} ({e})") from None
    absent = [c for c in columns if c not in df.columns]
    if absent:
        raise UserError(f"{name}: {path} lacks the column(s) {', '.join(absent)} (wrong or "
                        f"partial file; expected columns {', '.join(columns)}); "
                        f"{download_hint(name, how)}")
    return df
