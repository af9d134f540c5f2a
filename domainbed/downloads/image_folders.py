"""Where DomainBed's image-folder datasets come from (VLCS, PACS, OfficeHome,
TerraIncognita, DomainNet; SVIRO and Spawrious, also image folders) and what two of them
need after their archives are unpacked, done as DomainBed's download script does it, so
the loaders of ``domainbed.datasets.image_folders`` find DomainBed's layout:

* DomainNet: the six domain zips unpack to ``domain_net/<domain>/<class>/<image>``; the
  images DomainBed lists as duplicates (``download_data/domain_net_duplicates.txt``, its
  file, 9,431 paths) are then deleted.
* TerraIncognita: Caltech Camera Traps' ECCV'18 images (``eccv_18_all_images_sm/<file>``)
  and the five ECCV'18 annotation files (COCO Camera Traps JSON). The images of locations
  38, 46, 100 and 43 whose annotations name one of ten categories go to
  ``terra_incognita/location_<L>/<category>/<file>``; an image annotated with two of them
  is in both folders, an image whose annotations name none of them is left out.
"""
import os
import shutil
import tempfile
from dataclasses import dataclass

from domainbed.downloads.fetching import extract, fetch, record, tree_digest
from domainbed.downloads.sources import GDRIVE, Archive, Source, verify_extracted
from oodutils.errors import UserError
from oodutils.untrusted import NotRegularFile, parse_json, read_regular_bytes

DOMAIN_NET_DUPLICATES = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                     "download_data", "domain_net_duplicates.txt")

TERRA_LOCATIONS = ("38", "46", "100", "43")
TERRA_CATEGORIES = ("bird", "bobcat", "cat", "coyote", "dog", "empty", "opossum", "rabbit",
                    "raccoon", "squirrel")
TERRA_IMAGES_DIR = "eccv_18_all_images_sm"
TERRA_ANNOTATIONS_DIR = "eccv_18_annotation_files"
TERRA_ANNOTATION_FILES = ("cis_test_annotations.json", "cis_val_annotations.json",
                          "train_annotations.json", "trans_test_annotations.json",
                          "trans_val_annotations.json")
MAX_ANNOTATION_BYTES = 1 << 30


def remove_domain_net_duplicates(root: str, domains: list[str]) -> int:
    """Delete the listed duplicates under root/<domain> for each unpacked `domains` folder
    (a listed file that is absent is passed over, as DomainBed does); how many went."""
    removed = 0
    with open(DOMAIN_NET_DUPLICATES, encoding="utf-8") as listed:
        for line in listed:
            parts = line.strip().split("/")
            if parts[0] not in domains or ".." in parts:
                continue
            path = os.path.join(root, *parts)
            if os.path.isfile(path) and not os.path.islink(path):
                os.remove(path)
                removed += 1
    return removed


def _read_annotation_file(path: str) -> dict:
    try:
        data = parse_json(read_regular_bytes(path, MAX_ANNOTATION_BYTES))
    except (OSError, NotRegularFile) as e:
        raise UserError(f"TerraIncognita: cannot read the annotations {path} ({e})") from None
    if not isinstance(data, dict) or not all(
            isinstance(data.get(k), list) for k in ("images", "annotations", "categories")):
        raise UserError(f"TerraIncognita: {path} is not a COCO Camera Traps annotation file "
                        "(images, annotations and categories lists)")
    return data


def read_camera_trap_annotations(folder: str) -> dict[str, list]:
    """The images, annotations and categories of the five ECCV'18 files, merged."""
    merged: dict[str, list] = {"images": [], "annotations": [], "categories": []}
    for name in TERRA_ANNOTATION_FILES:
        data = _read_annotation_file(os.path.join(folder, name))
        for key in merged:
            merged[key].extend(data[key])
    return merged


def terra_incognita_placements(annotations: dict) -> dict[str, tuple[str, list[str]]]:
    """{image file name: (location, [category, ...])} for every image of the kept
    locations, with the kept categories its annotations name (possibly none)."""
    try:
        names = {c["id"]: c["name"] for c in annotations["categories"]}
        categories_of: dict[object, list[str]] = {}
        for a in annotations["annotations"]:
            categories = categories_of.setdefault(a["image_id"], [])
            if names[a["category_id"]] not in categories:
                categories.append(names[a["category_id"]])
        placements: dict[str, tuple[str, list[str]]] = {}
        for image in annotations["images"]:
            location = str(image["location"])
            if location not in TERRA_LOCATIONS:
                continue
            _, kept = placements.setdefault(image["file_name"], (location, []))
            kept += [c for c in categories_of.get(image["id"], [])
                     if c in TERRA_CATEGORIES and c not in kept]
    except (KeyError, TypeError) as e:
        raise UserError(f"TerraIncognita: an annotation entry lacks a field or names an "
                        f"unknown category ({type(e).__name__}: {e})") from None
    return placements


def _plain_relative(file_name: object) -> list[str]:
    parts = str(file_name).replace("\\", "/").split("/")
    if os.path.isabs(str(file_name)) or any(p in ("", ".", "..") for p in parts):
        raise UserError(f"TerraIncognita: the annotations name the image {file_name!r}, "
                        "which is not a plain relative path; refusing to place it")
    return parts


def arrange_terra_incognita(images_dir: str, annotations: dict, destination: str) -> int:
    """Move the kept images from images_dir into destination/location_<L>/<category>/
    (a copy for an image's second category); how many files were placed. As DomainBed,
    every kept location gets its folder, even where none of its images is kept."""
    placed = 0
    for file_name, (location, categories) in sorted(
            terra_incognita_placements(annotations).items()):
        parts = _plain_relative(file_name)
        folder = os.path.join(destination, f"location_{location}")
        os.makedirs(folder, exist_ok=True)
        first = None
        for category in categories:
            target = os.path.join(folder, category, *parts)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if first is None:
                source = os.path.join(images_dir, *parts)
                if not os.path.isfile(source) or os.path.islink(source):
                    raise UserError(f"TerraIncognita: the annotated image {source} is not in "
                                    "the images archive")
                os.replace(source, target)
                first = target
            else:
                shutil.copyfile(first, target)
            placed += 1
    return placed


@dataclass
class CameraTraps:
    """TerraIncognita: Caltech Camera Traps' ECCV'18 images and annotations (two archives
    into DATA_DIR), arranged as DomainBed does in a temp folder renamed to
    DATA_DIR/<folder> when complete; the archives are removed only then."""
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

    def verify(self, data_dir: str) -> str:
        return verify_extracted(data_dir, self.images_name, self.images_url)


DOMAIN_NET = "http://csr.bu.edu/ftp/visda/2019/multi-source/"  # DomainBed's sources
LILA_CCT = "https://storage.googleapis.com/public-datasets-lila/caltechcameratraps/"

SOURCES: dict[str, list[Source]] = {
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
}
