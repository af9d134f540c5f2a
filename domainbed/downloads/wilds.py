"""WILDS datasets through the ``wilds`` package's downloader (its URLs and versions), for
``domainbed.datasets.wilds`` and the WILDS versions of the subpopulation and text sets."""
import os
import shutil
import tempfile
from dataclasses import dataclass

from domainbed.downloads.fetching import lock_path, read_lock, record, tree_digest
from domainbed.downloads.sources import Source
from oodutils.errors import UserError, require


@dataclass
class Wilds:
    """A WILDS dataset through the wilds package's downloader (DATA_DIR/<name>_v<version>),
    into a temp root renamed into place when it returns."""
    name: str

    def run(self, data_dir: str) -> None:
        wilds = require("wilds", extra="wilds")
        tmp = tempfile.mkdtemp(prefix=".wilds-", dir=data_dir)
        try:
            try:
                dataset = wilds.get_dataset(self.name, root_dir=tmp, download=True)
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


SOURCES: dict[str, list[Source]] = {
    "WILDSCamelyon": [Wilds("camelyon17")],
    "WILDSFMoW": [Wilds("fmow")],
}
