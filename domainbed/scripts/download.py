"""Download datasets and pretrained weights: `python -m domainbed.scripts.download
--data_dir DIR --datasets Waterbirds CivilComments ...` or `--weights resnet50`.

Nothing else in the project downloads: training reads what is on disk and says clearly
what is missing. Every download goes through ``domainbed.downloading`` (resumable,
checksum-verified where the source publishes one, extracted into a temp dir and renamed into
place only when complete); WILDS datasets go through the ``wilds`` package's downloader, into
a temp root renamed into place when it returns. One line per dataset; a non-zero exit when
any failed (e.g. offline). Datasets that cannot be fetched automatically print where to get
them and the layout expected. TerraIncognita and DomainNet are arranged after unpacking as
DomainBed's script arranges them (``domainbed.download_layouts``).
"""
import argparse
import os
import shutil
import sys
import tempfile
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from domainbed.download_layouts import (
    TERRA_ANNOTATIONS_DIR,
    TERRA_IMAGES_DIR,
    arrange_terra_incognita,
    read_camera_trap_annotations,
    remove_domain_net_duplicates,
)
from domainbed.downloading import (
    LOCK_FILE,
    accept,
    check_file,
    expected_sha256,
    extract,
    fetch,
    fetch_and_extract,
    lock_path,
    read_lock,
    record,
    tree_digest,
)
from domainbed.hub_mirrors import MIRRORS, download_from_hub
from oodutils.cli import (
    DATA_DIR_HELP,
    DEFAULT_DATA_DIR,
    ArgumentParser,
    add_logging_flags,
    add_option,
    check_outputs,
    configure_logging,
)
from oodutils.errors import UserError, epilog_example, require, run_cli
from oodutils.log import get_logger

logger = get_logger(__name__)

EPILOG = epilog_example("domainbed-download", "domainbed.scripts.download",
                        "--data_dir ./data --datasets MNIST PACS VLCS")

GDRIVE = "https://drive.google.com/uc?id="
STANFORD_DRO = "https://nlp.stanford.edu/data/dro/"
DOMAIN_NET = "http://csr.bu.edu/ftp/visda/2019/multi-source/"  # DomainBed's sources
LILA_CCT = "https://storage.googleapis.com/public-datasets-lila/caltechcameratraps/"
__all__ = ["fetch", "extract", "main", "DATASETS"]


@dataclass
class Archive:
    """An archive unpacked into DATA_DIR/<subdir>, then top-level entries renamed, then
    `prune(into, names)` (e.g. DomainNet's duplicates) before the tree is recorded."""
    url: str
    name: str
    subdir: str = ""
    renames: dict = field(default_factory=dict)
    sha256: str | None = None
    prune: Callable | None = None

    def run(self, data_dir: str) -> None:
        into = os.path.join(data_dir, self.subdir)
        if self.url.startswith(GDRIVE):
            placed = extract(gdrive_fetch(self.url, os.path.join(into, self.name),
                                          self.sha256), into)
        else:
            placed = fetch_and_extract(self.url, into, self.name, sha256=self.sha256)
        for src, dst in self.renames.items():
            target = os.path.join(into, dst)
            if os.path.isdir(target):
                shutil.rmtree(target)
            os.replace(os.path.join(into, src), target)
        names = sorted({self.renames.get(n, n) for n in placed})
        if self.prune:
            self.prune(into, names)
        record(os.path.join(into, self.name), tree=names, tree_sha256=tree_digest(into, names))

    def verify(self, data_dir: str) -> Any:
        return verify_extracted(os.path.join(data_dir, self.subdir), self.name, self.url,
                                self.sha256)


def verify_extracted(into: Any, archive_name: str, url: str, sha256: str | None = None) -> str:
    """The tree extracted from `archive_name` (or the archive, while it is on disk) against
    the lock in `into`."""
    archive = os.path.join(into, archive_name)
    entry = read_lock(into).get(archive_name, {})
    if os.path.isfile(archive) and expected_sha256(archive, sha256):
        check_file(archive, expected_sha256(archive, sha256), url)
        return f"{archive_name} matches its sha256"
    names, recorded = entry.get("tree"), entry.get("tree_sha256")
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names)
            and isinstance(recorded, str)):
        raise UserError(f"nothing recorded for {archive_name} in {lock_path(into)}: "
                        "download it with this version to verify it later")
    if tree_digest(into, names) != recorded:
        raise UserError(f"the files extracted from {archive_name} ({', '.join(names)} in "
                        f"{into}) changed since they were downloaded")
    return f"{', '.join(names)} as extracted from {archive_name}"


@dataclass
class CameraTraps:
    """TerraIncognita: Caltech Camera Traps' ECCV'18 images and annotations (two archives
    into DATA_DIR), arranged as DomainBed does (``domainbed.download_layouts``) in a temp
    folder renamed to DATA_DIR/<folder> when complete; the archives are removed only then."""
    images_url: str
    annotations_url: str
    images_name: str = "eccv_18_all_images_sm.tar.gz"
    annotations_name: str = "eccv_18_annotations.tar.gz"
    folder: str = "terra_incognita"

    def run(self, data_dir: str) -> None:
        archives = [fetch(self.images_url, os.path.join(data_dir, self.images_name)),
                    fetch(self.annotations_url, os.path.join(data_dir, self.annotations_name))]
        staging = tempfile.mkdtemp(prefix=f".{self.folder}-", dir=data_dir)
        try:
            for archive in archives:
                extract(archive, staging, remove=False)
            annotations = read_camera_trap_annotations(os.path.join(staging,
                                                                    TERRA_ANNOTATIONS_DIR))
            arranged = os.path.join(staging, self.folder)
            arrange_terra_incognita(os.path.join(staging, TERRA_IMAGES_DIR), annotations,
                                    arranged)
            target = os.path.join(data_dir, self.folder)
            if os.path.isdir(target):
                shutil.rmtree(target)
            os.replace(arranged, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        for archive in archives:
            os.remove(archive)
        record(archives[0], tree=[self.folder], tree_sha256=tree_digest(data_dir,
                                                                        [self.folder]))

    def verify(self, data_dir: str) -> Any:
        return verify_extracted(data_dir, self.images_name, self.images_url)


@dataclass
class File:
    """A single file saved as DATA_DIR/<subdir>/<name>."""
    url: str
    name: str
    subdir: str = ""
    sha256: str | None = None

    def run(self, data_dir: str) -> None:
        dst = os.path.join(data_dir, self.subdir, self.name)
        if self.url.startswith(GDRIVE):
            gdrive_fetch(self.url, dst, self.sha256)
        else:
            fetch(self.url, dst, sha256=self.sha256)

    def verify(self, data_dir: str) -> Any:
        return verify_file(os.path.join(data_dir, self.subdir, self.name), self.url,
                           self.sha256)


@dataclass
class Wilds:
    """A WILDS dataset through the wilds package's downloader (DATA_DIR/<name>_v<version>)."""
    name: str

    def run(self, data_dir: str) -> None:
        try:
            from wilds import get_dataset
        except ImportError:
            raise UserError("WILDS downloads need the wilds package: "
                            "pip install 'domainbed[wilds]'") from None
        tmp = tempfile.mkdtemp(prefix=".wilds-", dir=data_dir)
        try:
            try:
                dataset = get_dataset(self.name, root_dir=tmp, download=True)
            except UserError:
                raise
            except Exception as e:  # wilds raises many kinds; the user needs one line
                raise UserError(f"could not download WILDS {self.name} ({type(e).__name__}: "
                                f"{e}); is the network reachable?") from None
            folder = os.path.basename(os.path.normpath(dataset.data_dir))
            target = os.path.join(data_dir, folder)
            if os.path.isdir(target):
                shutil.rmtree(target)
            os.replace(os.path.join(tmp, folder), target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        # the wilds package records no checksum: trust on first use, for --verify
        record(target, wilds=self.name, tree=[folder], tree_sha256=tree_digest(data_dir,
                                                                               [folder]))

    def verify(self, data_dir: str) -> str:
        entries = {k: v for k, v in read_lock(data_dir).items() if v.get("wilds") == self.name}
        if not entries:
            raise UserError(f"nothing recorded for WILDS {self.name} in {lock_path(data_dir)}"
                            ": download it with this version to verify it later")
        for folder, entry in entries.items():
            if tree_digest(data_dir, [folder]) != entry.get("tree_sha256"):
                raise UserError(f"the files of WILDS {self.name} ({os.path.join(data_dir, folder)})"
                                " changed since they were downloaded")
        return f"{', '.join(entries)} as downloaded"


@dataclass
class Manual:
    """A dataset behind a licence or login: where to get it and the layout expected."""
    where: str
    layout: str

    def run(self, data_dir: str) -> str:
        print(f"  get it from {self.where}\n  and place it as {os.path.join(data_dir, '')}"
              f"{self.layout}")
        return "manual"

    def verify(self, data_dir: str) -> None:
        raise UserError("fetched by hand: no checksum to verify it against")


@dataclass
class TorchvisionMNIST:
    def run(self, data_dir: str) -> None:
        from torchvision.datasets import MNIST
        try:
            MNIST(data_dir, train=True, download=True)
            MNIST(data_dir, train=False, download=True)
        except (RuntimeError, urllib.error.URLError, OSError) as e:
            raise UserError(f"could not download MNIST into {data_dir} ({e})") from None

    def verify(self, data_dir: str) -> str:
        """torchvision records MNIST's md5s and checks them at download; again here."""
        from torchvision.datasets import MNIST
        from torchvision.datasets.utils import check_integrity
        raw = os.path.join(data_dir, "MNIST", "raw")
        for name, md5 in MNIST.resources:
            name = os.path.basename(name)
            if not check_integrity(os.path.join(raw, name), md5):
                raise UserError(f"{os.path.join(raw, name)} is missing or does not match "
                                "torchvision's md5")
        return f"{len(MNIST.resources)} files match torchvision's md5s"


def verify_file(path: str, url: str, sha256: str | None) -> str:
    """A file on disk against its published or recorded checksum (a line saying which)."""
    expected = expected_sha256(path, sha256)
    if not os.path.isfile(path):
        raise UserError(f"{path} is not on disk: nothing to verify")
    if not expected:
        raise UserError(f"no checksum published or recorded for {path}: download it with "
                        "this version to verify it later")
    check_file(path, expected, url)
    return f"{os.path.basename(path)} matches its {'published' if sha256 else 'recorded'} " \
           "sha256"


def gdrive_fetch(url: str, dst: str, sha256: str | None = None) -> Any:
    """Google Drive through gdown (no Range support there), then verified against the
    published or recorded checksum (recorded on first use) and renamed into place."""
    gdown = require("gdown", extra="download")
    expected = expected_sha256(dst, sha256)
    if os.path.lexists(dst):
        if expected:
            check_file(dst, expected, url)
        return dst
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(dst)}.", suffix=".partial",
                               dir=os.path.dirname(os.path.abspath(dst)))
    os.close(fd)
    try:
        if gdown.download(url, tmp, quiet=not sys.stderr.isatty()) is None:
            raise UserError(f"could not download {url}; is the network reachable?")
    except UserError:
        os.unlink(tmp)
        raise
    except Exception as e:
        os.unlink(tmp)
        raise UserError(f"could not download {url} ({e}); is the network reachable?") from None
    return accept(tmp, dst, url, sha256)


CELEBA = [Archive(GDRIVE + "1mb1R6dXfWbvk3DnlWOBO8pDeoBKOcLE6", "img_align_celeba.zip",
                  "celeba"),
          File(GDRIVE + "1acn0-nE4W7Wa17sIkKB0GtfW4Z41CMFB", "list_eval_partition.txt", "celeba"),
          File(GDRIVE + "11um21kRUuaUNoMl59TCe2fb01FNjqNms", "list_attr_celeba.txt", "celeba")]
CIVILCOMMENTS = [Wilds("civilcomments")]
DATASETS: dict[str, list[Any]] = {
    "MNIST": [TorchvisionMNIST()],
    "VLCS": [Archive(GDRIVE + "1skwblH1_okBwxWxmRsp9_qi15hyPpxg8", "VLCS.tar.gz")],
    "PACS": [Archive(GDRIVE + "1JFr8f805nMUelQWWmfnJR3y4_SYoN5Pd", "PACS.zip",
                     renames={"kfold": "PACS"})],
    "OfficeHome": [Archive(GDRIVE + "1uY0pj7oFsjMxRwaD3Sxy0jgel0fsYXLC", "office_home.zip",
                           renames={"OfficeHomeDataset_10072016": "office_home"})],
    "TerraIncognita": [CameraTraps(LILA_CCT + "eccv_18_all_images_sm.tar.gz",
                                   LILA_CCT + "eccv_18_annotations.tar.gz")],
    "DomainNet": [Archive(DOMAIN_NET + path, os.path.basename(path), "domain_net",
                          prune=remove_domain_net_duplicates)
                  for path in ("groundtruth/clipart.zip", "infograph.zip",
                               "groundtruth/painting.zip", "quickdraw.zip", "real.zip",
                               "sketch.zip")],
    "Spawrious": [Archive("https://www.dropbox.com/s/e40j553480h3f3s/spawrious224.tar.gz?dl=1",
                          "spawrious224.tar.gz")],
    "SVIRO": [Archive("https://sviro.kl.dfki.de/?wpdmdl=1731",
                      "sviro_grayscale_rectangle_classification.zip",
                      renames={"SVIRO_DOMAINBED": "sviro"})],
    "Waterbirds": [Archive(STANFORD_DRO + "waterbird_complete95_forest2water2.tar.gz",
                           "waterbirds.tar.gz", "waterbirds")],
    "WILDSWaterbirds": [Wilds("waterbirds")],
    "CelebA": CELEBA,
    "CelebA_Blond": CELEBA,
    "MetaShift": [Archive("https://www.dropbox.com/s/a7k65rlj4ownyr2/metashift.tar.gz?dl=1",
                          "metashift.tar.gz", "metashift")],
    "MultiNLI": [
        Archive(STANFORD_DRO + "multinli_bert_features.tar.gz", "multinli_bert_features.tar.gz",
                "multinli/glue_data/MNLI"),
        File("https://raw.githubusercontent.com/kohpangwei/group_DRO/master/dataset_metadata/"
             "multinli/metadata_random.csv", "metadata_random.csv", "multinli/data")],
    "CivilComments": CIVILCOMMENTS,
    "CivilCommentsIdentity": CIVILCOMMENTS,
    "WILDSCivilComments": CIVILCOMMENTS,
    "WILDSCamelyon": [Wilds("camelyon17")],
    "WILDSFMoW": [Wilds("fmow")],
    "NICO_Mixed": [Manual(
        "the NICO dataset page (https://nico.thumedialab.com, by request) and, for OoD-Bench's "
        "exact split, the lists in https://github.com/ynysjtu/ood_bench "
        "(datasets/NICO/mixed_split_corrected)",
        "NICO/{animal,vehicle}/images/<category>/<context>/<image>.jpg with contexts on_snow, "
        "in_forest, on_beach, on_grass (optional: NICO/mixed_split_corrected/env_*.csv)")],
}
def weight_sources() -> Any:
    """Every named backbone's published weights (file, URL, checksum): one table, in
    domainbed.networks.backbones, read by both the runs and this script."""
    from domainbed.networks.backbones import WEIGHT_SOURCES
    return WEIGHT_SOURCES


def hub_hash_prefix(url: str) -> Any:
    stem = os.path.basename(url).rsplit(".", 1)[0]
    return stem.rsplit("-", 1)[1] if "-" in stem else None


def download_weights(name: str, weights_dir: str = "") -> Any:
    """The weights of backbone `name` into `weights_dir` (default: torch hub's checkpoints
    folder, where runs also look), checked against the published sha256 or its prefix."""
    import torch
    sources = weight_sources()
    if name not in sources:
        raise UserError(f"unknown weights {name!r}; valid: {', '.join(sources)}")
    source = sources[name]
    folder = weights_dir or os.path.join(torch.hub.get_dir(), "checkpoints")
    return fetch(source["url"], os.path.join(folder, source["file"]),
                 sha256=source["sha256"] or source["sha256_prefix"] or None)


def verify_weights(name: str, weights_dir: str = "") -> Any:
    """The weights file of backbone `name` on disk against its published or recorded sha256."""
    import torch
    source = weight_sources()[name]
    folder = weights_dir or os.path.join(torch.hub.get_dir(), "checkpoints")
    return verify_file(os.path.join(folder, source["file"]), source["url"],
                       source["sha256"] or source["sha256_prefix"] or None)


def verify_dataset(name: str, data_dir: str) -> Any:
    """Re-check each step of a dataset on disk; the lines saying what matched."""
    return "; ".join(step.verify(data_dir) for step in DATASETS[name])


def download_dataset(name: str, data_dir: str) -> Any:
    """Runs each step of a dataset; 'manual' where the user must fetch it by hand."""
    outcome = "done"
    for step in DATASETS[name]:
        if step.run(data_dir) == "manual":
            outcome = "manual"
    return outcome


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="domainbed-download",
                       description="Download datasets and pretrained weights",
                                epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_option(p, "--data_dir", type=str, default=DEFAULT_DATA_DIR, help=DATA_DIR_HELP)
    add_option(p, "--datasets", nargs="*", default=[],
                  help=f"any of: {', '.join(DATASETS)}")
    add_option(p, "--weights", nargs="*", default=[],
                  help="backbone names whose published weights to fetch (an unknown name "
                       "lists the valid ones)")
    add_option(p, "--weights_dir", type=str, default="",
                  help="where --weights go (default: torch hub's checkpoints folder); pass "
                        "the same folder to train --weights_dir")
    add_option(p, "--verify", action="store_true",
               help="download nothing: re-check the named --datasets / --weights on disk "
                    "against their published checksums, or the sha256 recorded at their "
                    f"first download ({LOCK_FILE} beside the data)")
    add_option(p, "--source", choices=("original", "hub"), default="original",
               help="original: the datasets' own links (DomainBed's); hub: the Hugging Face "
                    "Hub mirrors pinned to a revision (PACS, OfficeHome), each parquet "
                    "file's sha256 recorded on first use, written in DomainBed's layout")
    add_option(p, "--convert_blond_split_pickles", action="store_true",
               help="UNSAFE: unpickle OoD-Bench's DATA_DIR/celeba/blond_split/*_df.pickle "
                    "once and write the CSV lists CelebA_Blond reads. Unpickling runs any "
                    "code a file holds: use it only on files you fetched yourself from "
                    "the OoD-Bench repository, never on files someone else put there")
    add_logging_flags(p)
    return p


def check_request(args: Any) -> None:
    """A UserError unless every named dataset and weights file is known and something is
    named (the datasets' missing-data messages suggest commands that must pass this)."""
    unknown = [d for d in args.datasets if d not in DATASETS]
    if unknown:
        raise UserError(f"unknown dataset {unknown[0]!r}; downloadable: {', '.join(DATASETS)}")
    bad_weights = [w for w in args.weights if w not in weight_sources()]
    if bad_weights:
        raise UserError(f"unknown weights {bad_weights[0]!r}; valid: "
                        f"{', '.join(weight_sources())}")
    if not args.datasets and not args.weights:
        raise UserError("nothing to download: name --datasets and/or --weights")
    no_mirror = [d for d in args.datasets if d not in MIRRORS]
    if args.source == "hub" and no_mirror:
        raise UserError(f"--source hub: {no_mirror[0]} has no Hub mirror; mirrored: "
                        f"{', '.join(MIRRORS)}")
    if args.source == "hub" and args.verify:
        raise UserError("--verify checks the original downloads; a --source hub download "
                        "checks each parquet file against its recorded sha256 every time")


def main(argv: list[str] | None = None) -> Any:
    args = build_parser().parse_args(argv)
    configure_logging(args)
    if not args.verify:     # --verify only reads
        check_outputs((args.data_dir, "--data_dir", True))
    if args.convert_blond_split_pickles:
        from domainbed.datasets.oodbench_images import convert_blond_split_pickles
        for path in convert_blond_split_pickles(os.path.join(args.data_dir, "celeba")):
            print(f"wrote {path}")
        if not args.datasets and not args.weights:
            return
    check_request(args)
    os.makedirs(args.data_dir, exist_ok=True)
    if args.verify:
        return verify_all(args)
    fetched: dict[Any, Any] = {}
    if args.source == "hub":
        checks = [(n, lambda n=n: download_from_hub(n, args.data_dir))
                  for n in args.datasets]
    else:
        checks = [(n, lambda n=n: _download_one_dataset(n, args.data_dir, fetched))
                  for n in args.datasets]
    checks += [(n, lambda n=n: download_weights(n, args.weights_dir)) for n in args.weights]
    failed = run_each(checks)
    if failed:
        raise UserError(f"{len(failed)} of {len(checks)} downloads failed: {', '.join(failed)}")


def _download_one_dataset(name: str, data_dir: str, fetched: Any) -> Any:
    steps = DATASETS[name]
    if id(steps) in fetched:  # e.g. CelebA and CelebA_Blond read the same files
        return f"done (same files as {fetched[id(steps)]})"
    fetched[id(steps)] = name
    if name in MIRRORS:   # the original link failing: the Hub mirror is the way out
        try:
            return f"done ({data_dir})" if download_dataset(name, data_dir) == "done" else None
        except UserError as e:
            raise UserError(f"{e}; the Hub mirror may work: --source hub") from None
    if isinstance(steps[0], Manual):
        print(f"{name}: cannot be downloaded automatically (licence or login):")
    return f"done ({data_dir})" if download_dataset(name, data_dir) == "done" else None


def run_each(checks: Any) -> Any:
    """Run each (name, action): print "name: <what it returns>", or log its UserError and
    go on with the rest; the names that failed."""
    failed = []
    for name, action in checks:
        try:
            line = action()
            if line:
                print(f"{name}: {line}")
        except UserError as e:
            logger.error(f"{name}: error: {e}")
            failed.append(name)
    return failed


def verify_all(args: Any) -> None:
    """--verify: one line per dataset or weights file; a non-zero exit on any mismatch."""
    checks = [(n, lambda n=n: f"verified ({verify_dataset(n, args.data_dir)})")
              for n in args.datasets]
    checks += [(n, lambda n=n: f"verified ({verify_weights(n, args.weights_dir)})")
               for n in args.weights]
    failed = run_each(checks)
    if failed:
        raise UserError(f"{len(failed)} of {len(checks)} verifications failed: "
                        f"{', '.join(failed)}")


def cli() -> None:
    """The `domainbed-download` console command ([project.scripts])."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    run_cli(main)
