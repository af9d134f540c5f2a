"""Where the text datasets of ``domainbed.datasets.text`` come from: MultiNLI's features
from the group DRO authors' links, CivilComments through wilds."""
from domainbed.downloads.sources import Archive, File, Source
from domainbed.downloads.subpopulation import STANFORD_DRO
from domainbed.downloads.wilds import Wilds

CIVILCOMMENTS: list[Source] = [Wilds("civilcomments")]

SOURCES: dict[str, list[Source]] = {
    "MultiNLI": [
        Archive(STANFORD_DRO + "multinli_bert_features.tar.gz", "multinli_bert_features.tar.gz",
                "multinli/glue_data/MNLI"),
        File("https://raw.githubusercontent.com/kohpangwei/group_DRO/master/dataset_metadata/"
             "multinli/metadata_random.csv", "metadata_random.csv", "multinli/data")],
    "CivilComments": CIVILCOMMENTS,
    "CivilCommentsIdentity": CIVILCOMMENTS,
    "WILDSCivilComments": CIVILCOMMENTS,
}
