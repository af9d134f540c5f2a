"""Analysis panels: accuracy on the line per dataset (``analysis.aotl``) and OODSelect
curves from an OODSelect output directory (``oodselect --output_dir DIR``).

Each panel returns (view, data): the view is what ``templates/macros.html.j2`` lays out
(its ``kind`` picks the macro; images are files written into the site's ``img/`` folder);
data goes into leaderboard.json. A panel that cannot be drawn says why.
The OODSelect folder is not trusted: only regular files inside it are read or copied (a
symlink, FIFO or device is refused), and a copy gets the site's file mode, never the
source's.
"""
import csv
import io
import os
from typing import Any

from analysis import aotl
from analysis.aotl.inputs import accuracies_from_records
from domainbed.leaderboard.pages import slug
from oodutils.errors import UserError
from oodutils.untrusted import copy_regular_file, parse_json, read_regular_bytes

OODSELECT_SUMMARY = "summary.csv"
OODSELECT_CURVE = "correlation_vs_size.png"
OODSELECT_COLUMNS = ("method", "n", "r_test", "r_test_lo", "r_test_hi", "r_val")
MAX_PANEL_FILE_BYTES = 64 << 20


def aotl_panel(records: Any, label: Any, site_dir: Any) -> tuple[Any, ...]:
    """Probit scatter, fit and well-specified verdict per leave-one-domain-out split of
    one dataset (all checkpoints of the runs with one test environment)."""
    try:
        acc = accuracies_from_records(records, split="out", checkpoints="all")
        table = aotl.per_ood_table(acc)
    except UserError as e:
        return {"kind": "aotl", "missing": str(e)}, {"missing": str(e)}
    dataset = acc.datasets()[0]
    splits, shown = [], []
    for row in table.to_dict("records"):
        ood = int(row["ood_env"])
        name: str | None
        name, error = f"img/aotl_{slug(label)}_env{ood}.png", None
        try:
            aotl.plot_split(acc, dataset, ood, os.path.join(site_dir, name))
        except UserError as e:
            name, error = None, str(e)
        split = {"ood_env": ood, "n": int(row["n"]), "slope": float(row["slope"]),
                 "r": float(row["r"]), "verdict": str(row["verdict"]),
                 "well_specified": bool(row["well_specified"]), "image": name}
        splits.append(split)
        shown.append({**split, "error": error})
    notices = list(acc.notices)
    view = {"kind": "aotl", "missing": None, "splits": shown, "notices": notices}
    return view, {"splits": splits, "notices": notices}


def check_oodselect_dir(path: Any) -> None:
    """Raise UserError unless `path` is an OODSelect output directory."""
    if not os.path.isdir(path):
        raise UserError(f"--oodselect {path!r} is not a directory")
    if not os.path.isfile(os.path.join(path, OODSELECT_SUMMARY)):
        raise UserError(f"--oodselect {path!r} has no {OODSELECT_SUMMARY} (is it the --output_dir "
                        "directory of python -m analysis.oodselect?)")


def _read_text(path: Any, name: str) -> Any:
    """A file of the OODSelect folder: a regular file in it (no symlink, FIFO or device),
    at most MAX_PANEL_FILE_BYTES, as text."""
    data = read_regular_bytes(os.path.join(path, name), MAX_PANEL_FILE_BYTES)
    return data.decode("utf-8", errors="replace")


def _read_summary(path: Any) -> list[Any]:
    try:
        return list(csv.DictReader(io.StringIO(_read_text(path, OODSELECT_SUMMARY))))
    except (OSError, csv.Error) as e:
        raise UserError(f"--oodselect {path!r}: cannot read {OODSELECT_SUMMARY} ({e})") from None


def _dataset_of(path: Any) -> Any:
    try:
        info = parse_json(_read_text(path, "subsets.json"))
    except OSError:
        return None
    dataset = (info.get("info") or {}).get("dataset") if isinstance(info, dict) else None
    return dataset if isinstance(dataset, str) else None


def read_oodselect(path: Any) -> dict[str, Any]:
    """{"dir", "dataset", "summary": rows} of one OODSelect output (nothing copied)."""
    check_oodselect_dir(path)
    return {"dir": path, "dataset": _dataset_of(path), "summary": _read_summary(path)}


def oodselect_panel(path: Any, number: Any, site_dir: Any) -> tuple[Any, ...]:
    """The correlation-vs-size curve and the summary table of one OODSelect output."""
    rows = _read_summary(path)
    dataset = _dataset_of(path)
    image = skipped = None
    if os.path.lexists(os.path.join(path, OODSELECT_CURVE)):
        image = f"img/oodselect_{number}.png"
        try:  # only a regular file inside the folder, written with the site's mode
            copy_regular_file(os.path.join(path, OODSELECT_CURVE),
                              os.path.join(site_dir, image), MAX_PANEL_FILE_BYTES)
        except OSError as e:
            image, skipped = None, f"{OODSELECT_CURVE} not copied: {e}"
    columns = [c for c in OODSELECT_COLUMNS if rows and c in rows[0]]
    view = {"kind": "oodselect", "title": dataset or path, "path": path, "image": image,
            "curve": OODSELECT_CURVE, "skipped": skipped, "columns": columns,
            "rows": [[_short(r[c]) for c in columns] for r in rows]}
    return view, {"dir": path, "dataset": dataset, "image": image, "summary": rows}


def _short(value: Any) -> Any:
    try:
        return f"{float(value):.3f}" if "." in value else value
    except ValueError:
        return value
