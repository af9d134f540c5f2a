"""Parquet fixtures in the Hugging Face Hub's layout (``DIR/data/train-00000-of-00001.parquet``
with the ``datasets`` features in the schema), written by the tests with the `datasets`
library, as ``push_to_hub`` leaves a repository."""
import io
import os

from PIL import Image


def encoded_png(size, colour):
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, "PNG")
    return buffer.getvalue()


def noise_png(side):
    image = Image.frombytes("RGB", (side, side), os.urandom(side * side * 3))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def write_hub_folder(root, domains=("sketch", "art_painting", "photo"),
                     classes=("dog", "cat", "bird"), per_class=3, label_names=True,
                     file_name="train-00000-of-00001.parquet", bad=None, noise_side=None):
    """root/data/<file_name>: columns image (Image), domain (string), region (string:
    north/south by row parity), label (ClassLabel `classes`, or plain ints when not
    `label_names`). `bad`: {row: bytes} replacing those rows' image bytes. Returns the
    rows as (domain, label, region) in order. `noise_side`: images of random pixels that
    size (incompressible: a file of known bulk, e.g. to break a transfer half way)."""
    import datasets
    columns = {"image": [], "domain": [], "region": [], "label": []}
    for d, domain in enumerate(domains):
        for c in range(len(classes)):
            for k in range(per_class):
                row = len(columns["domain"])
                data = (bad or {}).get(row) or (
                    noise_png(noise_side) if noise_side else
                    encoded_png((20 + k, 18 + c), (50 * d, 60 * c, 30 * k)))
                columns["image"].append({"bytes": data, "path": None})
                columns["domain"].append(domain)
                columns["region"].append("north" if row % 2 else "south")
                columns["label"].append(c)
    label = datasets.ClassLabel(names=list(classes)) if label_names else \
        datasets.Value("int64")
    features = datasets.Features({"image": datasets.Image(), "domain": datasets.Value("string"),
                                  "region": datasets.Value("string"), "label": label})
    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    datasets.Dataset.from_dict(columns, features=features).to_parquet(
        os.path.join(root, "data", file_name))
    return list(zip(columns["domain"], columns["label"], columns["region"]))
