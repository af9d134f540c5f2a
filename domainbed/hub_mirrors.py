"""PACS and Office-Home from their Hugging Face Hub mirrors (``domainbed-download --source
hub``), arranged in DomainBed's folder layout so that sweeps, records and published rows are
the same as from the original archives.

Each mirror is pinned to a revision (a commit; None: the commit ``main`` points at on the
first download, recorded then). Its parquet files are fetched with ``huggingface_hub``
(its cache; resumed when interrupted; ``HF_ENDPOINT`` names another server), and each
file's sha256 is recorded in the checksum lock beside the data on first use and checked on
every later download: a changed file is refused in one line. The rows are then written as
``DATA_DIR/<DIRNAME>/<domain folder>/<class folder>/<row>.<ext>``: the domain folders are
DomainBed's names (the mirror's domain values mapped by ``DOMAIN_DIRS``), the class folders
the label column's ClassLabel names; DomainBed's loader sorts both, which gives DomainBed's
environment and class order when the mirror's class names are DomainBed's folder names
(PACS: checked against the mirror's dataset card; Office-Home's mirror not inspected yet).
"""
import io
import os
import shutil
from dataclasses import dataclass
from typing import Any

from domainbed.downloading import file_digest, lock_path, record, recorded_sha256
from oodutils.errors import UserError

INSTALL = "pip install 'oodbed[hub]'"


@dataclass(frozen=True)
class HubMirror:
    repo: str
    revision: str | None        # pinned commit; None: main's commit, recorded on first use
    dirname: str                # DomainBed's folder under DATA_DIR
    domain_dirs: tuple = ()     # DomainBed's domain folders; the mirror's values map onto
                                # them ignoring case, spaces and underscores
    domain_column: str = "domain"
    label_column: str = "label"
    image_column: str = "image"


MIRRORS = {
    "PACS": HubMirror("flwrlabs/pacs", "9c6f80edcd5320a55a39b1e84120dcfa25c8ce9b", "PACS",
                      ("art_painting", "cartoon", "photo", "sketch")),
    "OfficeHome": HubMirror("flwrlabs/office-home", None, "office_home",
                            ("Art", "Clipart", "Product", "Real World")),
}


def _key(text: str) -> Any:
    return "".join(ch for ch in str(text).lower() if ch.isalnum())


def domain_folder(name: str, mirror: Any, value: Any) -> Any:
    """DomainBed's folder for the mirror's domain `value` (one error line when none)."""
    for folder in mirror.domain_dirs:
        if _key(folder) == _key(value):
            return folder
    raise UserError(f"{name}: the mirror's domain {value!r} is none of DomainBed's "
                    f"{', '.join(mirror.domain_dirs)} (not the mirror's schema?)")


def _hub() -> Any:
    try:
        import huggingface_hub
    except ImportError:
        raise UserError(f"--source hub needs huggingface_hub: {INSTALL}") from None
    return huggingface_hub


def _first_line(error: Any) -> Any:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def fetch_parquet_files(name: str, mirror: Any, data_dir: str) -> tuple[Any, ...]:
    """(commit, [local parquet paths]) of the mirror at its revision, each file checked
    against the sha256 the lock beside the data recorded on first use."""
    hub = _hub()
    revision = mirror.revision or _recorded_revision(name, data_dir)
    try:
        info = hub.HfApi().dataset_info(mirror.repo, revision=revision)
        commit = info.sha
        files = sorted(s.rfilename for s in info.siblings or []
                       if s.rfilename.endswith(".parquet"))
        if not files:
            raise UserError(f"{name}: the Hub mirror {mirror.repo}@{commit} holds no parquet "
                            f"files")
        paths = [hub.hf_hub_download(mirror.repo, f, repo_type="dataset", revision=commit)
                 for f in files]
    except UserError:
        raise
    except Exception as e:   # huggingface_hub raises HTTP, OS and value errors
        raise UserError(f"{name}: cannot download the Hub mirror {mirror.repo} (revision "
                        f"{revision or 'main'}): {_first_line(e)}") from None
    for file_name, path in zip(files, paths):
        check_recorded(name, mirror, data_dir, commit, file_name, path)
    record(_lock_key(data_dir, mirror), revision=commit, repo=mirror.repo)
    return commit, paths


def _lock_key(data_dir: str, mirror: Any, file_name: str = "") -> Any:
    """The lock entry (a path beside the data) of the mirror or of one of its files."""
    suffix = f"/{file_name}" if file_name else ""
    return os.path.join(data_dir, f"hub:{mirror.repo}{suffix}".replace("/", "__"))


def _recorded_revision(name: str, data_dir: str) -> Any:
    mirror = MIRRORS[name]
    from domainbed.downloading import read_lock
    entry = read_lock(os.path.abspath(data_dir)).get(
        os.path.basename(_lock_key(data_dir, mirror)), {})
    return entry.get("revision")


def check_recorded(name: str, mirror: Any, data_dir: str, commit: Any, file_name: str,
                   path: str) -> Any:
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


def write_layout(name: str, mirror: Any, parquet_paths: Any, data_dir: str) -> Any:
    """The mirror's rows as DATA_DIR/<dirname>/<domain>/<class>/<row>.<ext>, written into a
    temporary folder and renamed into place when complete. Returns {domain: images}."""
    import pyarrow.parquet as pq
    from PIL import Image
    target = os.path.join(data_dir, mirror.dirname)
    staging = os.path.join(data_dir, f".{mirror.dirname}.partial-{os.getpid()}")
    if os.path.isdir(staging):
        shutil.rmtree(staging)
    os.makedirs(staging)   # the umask's mode, as every other output
    counts: dict[Any, Any] = {}
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


def _class_names(name: str, table: Any, mirror: Any, path: str) -> list[Any]:
    """The label column's ClassLabel names from the schema the datasets library wrote."""
    import json
    meta = (table.schema.metadata or {}).get(b"huggingface")
    try:
        features = json.loads(meta)["info"]["features"]  # type: ignore[arg-type]
        names = features[mirror.label_column]["names"]
    except (TypeError, KeyError, ValueError):
        raise UserError(f"{name}: {os.path.basename(path)} has no ClassLabel names for "
                        f"{mirror.label_column!r} (not the mirror's schema)") from None
    return list(names)


def download_from_hub(name: str, data_dir: str) -> str:
    """Fetch the mirror of dataset `name` and write DomainBed's layout; one summary line."""
    mirror = MIRRORS[name]
    commit, paths = fetch_parquet_files(name, mirror, data_dir)
    counts = write_layout(name, mirror, paths, data_dir)
    sizes = ", ".join(f"{d} {n}" for d, n in sorted(counts.items()))
    return (f"done from {mirror.repo}@{commit[:12]} into "
            f"{os.path.join(data_dir, mirror.dirname)} ({sizes})")
