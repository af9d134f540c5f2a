"""Where the subpopulation-shift datasets of ``domainbed.datasets.subpopulation`` and
``domainbed.datasets.oodbench_images`` come from: Waterbirds, CelebA (also read by
CelebA_Blond), MetaShift from their authors' links, WILDS' Waterbirds through wilds, and
NICO by hand (its page asks for a request)."""
from domainbed.downloads.sources import GDRIVE, Archive, File, Manual, Source
from domainbed.downloads.wilds import Wilds

STANFORD_DRO = "https://nlp.stanford.edu/data/dro/"

CELEBA: list[Source] = [
    Archive(GDRIVE + "1mb1R6dXfWbvk3DnlWOBO8pDeoBKOcLE6", "img_align_celeba.zip", "celeba"),
    File(GDRIVE + "1acn0-nE4W7Wa17sIkKB0GtfW4Z41CMFB", "list_eval_partition.txt", "celeba"),
    File(GDRIVE + "11um21kRUuaUNoMl59TCe2fb01FNjqNms", "list_attr_celeba.txt", "celeba")]

SOURCES: dict[str, list[Source]] = {
    "Waterbirds": [Archive(STANFORD_DRO + "waterbird_complete95_forest2water2.tar.gz",
                           "waterbirds.tar.gz", "waterbirds")],
    "WILDSWaterbirds": [Wilds("waterbirds")],
    "CelebA": CELEBA,
    "CelebA_Blond": CELEBA,
    "MetaShift": [Archive("https://www.dropbox.com/s/a7k65rlj4ownyr2/metashift.tar.gz?dl=1",
                          "metashift.tar.gz", "metashift")],
}

OODBENCH_SOURCES: dict[str, list[Source]] = {
    "NICO_Mixed": [Manual(
        "the NICO dataset page (https://nico.thumedialab.com, by request) and, for OoD-Bench's "
        "exact split, the lists in https://github.com/ynysjtu/ood_bench "
        "(datasets/NICO/mixed_split_corrected)",
        "NICO/{animal,vehicle}/images/<category>/<context>/<image>.jpg with contexts on_snow, "
        "in_forest, on_beach, on_grass (optional: NICO/mixed_split_corrected/env_*.csv)")],
}
