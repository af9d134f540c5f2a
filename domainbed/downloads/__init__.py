"""Downloads of datasets and weights, one module per dataset family beside
``domainbed.datasets`` (each declares ``SOURCES``: dataset name -> the steps that fetch
it), on the machinery of ``fetching`` (pooch). Nothing here imports torch, pooch or the Hub
libraries until a download runs, so the download command answers --help at once; the
dataset modules themselves import torch, which is why the sources live in this sibling
package rather than inside ``domainbed.datasets``."""
from domainbed.downloads import image_folders, mnist, subpopulation, text, wilds
from domainbed.downloads.hub_mirrors import MIRRORS
from domainbed.downloads.sources import Manual, Source
from oodutils.errors import UserError

DATASETS: dict[str, list[Source]] = {
    **mnist.SOURCES, **image_folders.SOURCES, **subpopulation.SOURCES, **text.SOURCES,
    **wilds.SOURCES, **subpopulation.OODBENCH_SOURCES}


def download_dataset(name: str, data_dir: str) -> str:
    """Runs each step of a dataset; 'manual' where the user must fetch it by hand."""
    outcome = "done"
    for step in DATASETS[name]:
        if step.run(data_dir) == "manual":
            outcome = "manual"
    return outcome


def verify_dataset(name: str, data_dir: str) -> str:
    """Re-check each step of a dataset on disk; the lines saying what matched."""
    return "; ".join(step.verify(data_dir) for step in DATASETS[name])


def download_original(name: str, data_dir: str, fetched: dict[int, str]) -> str | None:
    """Dataset `name` from its own links: a line saying what was done (None for a dataset
    fetched by hand, whose instructions are printed). `fetched` ({id of steps: name}) keeps
    datasets that read the same files (CelebA, CelebA_Blond) from fetching them twice."""
    steps = DATASETS[name]
    if id(steps) in fetched:
        return f"done (same files as {fetched[id(steps)]})"
    fetched[id(steps)] = name
    if isinstance(steps[0], Manual):
        print(f"{name}: cannot be downloaded automatically (licence or login):")
    try:
        outcome = download_dataset(name, data_dir)
    except UserError as e:
        if name not in MIRRORS:
            raise
        raise UserError(f"{e}; the Hub mirror may work: --source hub") from None
    return f"done ({data_dir})" if outcome == "done" else None
