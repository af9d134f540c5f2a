"""Tiny datasets written in each benchmark's real on-disk layout (for the loader tests)."""
import csv
import json
import os
import subprocess
import sys

import numpy as np
from PIL import Image

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CELEBA_ATTRIBUTES = (
    "5_o_Clock_Shadow Arched_Eyebrows Attractive Bags_Under_Eyes Bald Bangs Big_Lips Big_Nose "
    "Black_Hair Blond_Hair Blurry Brown_Hair Bushy_Eyebrows Chubby Double_Chin Eyeglasses "
    "Goatee Gray_Hair Heavy_Makeup High_Cheekbones Male Mouth_Slightly_Open Mustache "
    "Narrow_Eyes No_Beard Oval_Face Pale_Skin Pointy_Nose Receding_Hairline Rosy_Cheeks "
    "Sideburns Smiling Straight_Hair Wavy_Hair Wearing_Earrings Wearing_Hat Wearing_Lipstick "
    "Wearing_Necklace Wearing_Necktie Young").split()
IDENTITIES = ["male", "female", "LGBTQ", "christian", "muslim", "other_religions", "black",
              "white"]


def save_image(path, seed, size=8):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rng = np.random.RandomState(seed)
    Image.fromarray(rng.randint(0, 255, (size, size, 3), dtype=np.uint8)).save(path)


def write_waterbirds(data_dir, per_cell=2):
    """waterbirds/waterbird_complete95_forest2water2/{metadata.csv, <species>/<file>.jpg}:
    `per_cell` images per (split, y, place); returns the metadata rows."""
    root = os.path.join(data_dir, "waterbirds", "waterbird_complete95_forest2water2")
    rows, img_id = [], 1
    for split in (0, 1, 2):
        for y in (0, 1):
            for place in (0, 1):
                for _ in range(per_cell):
                    name = f"{y:03d}.Species_{y}/Species_{y}_{img_id:04d}.jpg"
                    save_image(os.path.join(root, name), img_id)
                    rows.append({"img_id": img_id, "img_filename": name, "y": y,
                                 "split": split, "place": place,
                                 "place_filename": f"/p/{place}/x.jpg"})
                    img_id += 1
    with open(os.path.join(root, "metadata.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return rows


def write_celeba(data_dir, cells, images=True):
    """celeba/{list_attr_celeba.txt, list_eval_partition.txt, img_align_celeba/}; `cells`:
    {(split, blond, male): count}. Returns the number of images (image files only where
    `images`)."""
    root = os.path.join(data_dir, "celeba")
    os.makedirs(os.path.join(root, "img_align_celeba"), exist_ok=True)
    attr_lines, part_lines, n = [], [], 0
    for (split, blond, male), count in sorted(cells.items()):
        for _ in range(count):
            n += 1
            name = f"{n:06d}.jpg"
            if images:
                save_image(os.path.join(root, "img_align_celeba", name), n)
            values = ["-1"] * len(CELEBA_ATTRIBUTES)
            values[CELEBA_ATTRIBUTES.index("Blond_Hair")] = "1" if blond else "-1"
            values[CELEBA_ATTRIBUTES.index("Male")] = "1" if male else "-1"
            attr_lines.append(name + " " + " ".join(f"{v:>2}" for v in values))
            part_lines.append(f"{name} {split}")
    with open(os.path.join(root, "list_attr_celeba.txt"), "w") as f:
        f.write(f"{n}\n" + " ".join(CELEBA_ATTRIBUTES) + " \n" + "\n".join(attr_lines) + "\n")
    with open(os.path.join(root, "list_eval_partition.txt"), "w") as f:
        f.write("\n".join(part_lines) + "\n")
    return n


def write_metashift(data_dir, per_folder=5):
    base = os.path.join(data_dir, "metashift", "MetaShift-Cat-Dog-indoor-outdoor")
    k = 0
    for folder in ("train/cat/cat(indoor)", "train/dog/dog(outdoor)", "test/cat/cat(outdoor)",
                   "test/dog/dog(indoor)"):
        for _ in range(per_folder):
            k += 1
            save_image(os.path.join(base, folder, f"{k:05d}.jpg"), k)
    return k


CIVIL_WORDS = {0: "kind thoughtful lovely neighbour", 1: "idiot stupid hateful garbage"}


def civil_rows(spec):
    """spec: list of (split, toxic, [identities]); the text carries the label's words."""
    rows = []
    for i, (split, toxic, present) in enumerate(spec):
        row = {"id": 1000 + i, "comment_text": f"{CIVIL_WORDS[toxic]} comment {i}",
               "split": split, "toxicity": 0.8 if toxic else 0.1}
        for identity in IDENTITIES:
            row[identity] = 0.9 if identity in present else (0.2 if i % 3 else "")
        row["identity_any"] = 1 if present else 0
        rows.append(row)
    return rows


def write_civilcomments(data_dir, spec, folder="civilcomments"):
    root = os.path.join(data_dir, folder)
    os.makedirs(root, exist_ok=True)
    rows = civil_rows(spec)
    with open(os.path.join(root, "all_data_with_identities.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[""] + list(rows[0]))
        writer.writeheader()
        writer.writerows({"": i, **r} for i, r in enumerate(rows))
    return rows


def default_civil_spec(per_cell=3):
    """Every split x label x identity, plus multi-identity and no-identity comments."""
    spec = []
    for split in ("train", "val", "test"):
        for toxic in (0, 1):
            for identity in IDENTITIES:
                spec += [(split, toxic, [identity])] * per_cell
            spec += [(split, toxic, ["male", "muslim"]), (split, toxic, ["female", "black",
                                                                         "white"])]
            spec += [(split, toxic, [])] * 2
    return spec


def train_cli(data_dir, out, dataset, hparams, *extra, env=None):
    cmd = [sys.executable, "-m", "domainbed.scripts.train", "--dataset", dataset,
           "--algorithm", "ERM", "--data_dir", str(data_dir), "--output_dir", str(out),
           "--steps", "3", "--checkpoint_freq", "2", "--num_threads", "1",
           "--hparams", json.dumps(hparams), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **(env or {})})


def write_nico(data_dir, per_cell_extra=3, contexts=("on_snow", "in_forest", "on_beach",
                                                      "on_grass")):
    """NICO/{animal,vehicle}/images/<category>/<context>/<n>.jpg as empty files: exactly the
    Table 9 pool of each (superclass, context) cell plus `per_cell_extra`, spread over two
    categories. Returns {(superclass, context): n_files}."""
    from domainbed.datasets.oodbench_images import NICO_CELLS
    sizes = {}
    for cells in NICO_CELLS.values():
        for cell, n in cells.items():
            sizes[cell] = sizes.get(cell, 0) + n
    for (superclass, context), n in sizes.items():
        sizes[(superclass, context)] = n + per_cell_extra
        for i in range(n + per_cell_extra):
            folder = os.path.join(data_dir, "NICO", superclass, "images",
                                  f"{superclass}_cat{i % 2}", context)
            os.makedirs(folder, exist_ok=True)
            open(os.path.join(folder, f"{i}.jpg"), "wb").close()
    return sizes


def write_camelyon(data_dir, per_hospital=2):
    """camelyon17_v1.0/{RELEASE_v1.0.txt, metadata.csv, patches/...} as WILDS ships it."""
    root = os.path.join(data_dir, "camelyon17_v1.0")
    os.makedirs(root, exist_ok=True)
    open(os.path.join(root, "RELEASE_v1.0.txt"), "w").close()
    lines = [",patient,node,x_coord,y_coord,tumor,slide,center,split"]
    k = 0
    for center in range(5):
        for j in range(per_hospital):
            patient, node, x, y = f"{center * 10 + j:03d}", j % 2, 100 + k, 200 + k
            name = (f"patches/patient_{patient}_node_{node}/"
                    f"patch_patient_{patient}_node_{node}_x_{x}_y_{y}.png")
            save_image(os.path.join(root, name), k, size=12)
            lines.append(f"{k},{patient},{node},{x},{y},{k % 2},{center * 2 + j},{center},0")
            k += 1
    with open(os.path.join(root, "metadata.csv"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return k


FMOW_REGIONS = {"CHN": "Asia", "FRA": "Europe", "KEN": "Africa", "USA": "Americas",
                "AUS": "Oceania"}


def write_fmow(data_dir, per_region=2):
    """fmow_v1.1/{RELEASE_v1.1.txt, rgb_metadata.csv, country_code_mapping.csv, images/}: six
    regions (the five of the mapping + Other for an unmapped country code)."""
    root = os.path.join(data_dir, "fmow_v1.1")
    os.makedirs(os.path.join(root, "images"), exist_ok=True)
    open(os.path.join(root, "RELEASE_v1.1.txt"), "w").close()
    with open(os.path.join(root, "country_code_mapping.csv"), "w") as f:
        f.write("alpha-3,region\n" + "".join(f"{c},{r}\n" for c, r in FMOW_REGIONS.items()))
    lines = ["split,img_filename,img_path,spatial_reference,epsg,category,visible,"
             "img_width,img_height,country_code,cloud_cover,timestamp,lat,lon"]
    codes = list(FMOW_REGIONS) + ["XXX"]
    k = 0
    for code in codes:
        for j in range(per_region):
            split = "train" if j == 0 else "test"
            year = 2012 if j == 0 else 2017
            lines.append(f"{split},x_{k}.jpg,p,ref,4326,{'airport' if k % 2 else 'zoo'},True,"
                         f"10,10,{code},0,{year}-05-01T00:00:00Z,0,0")
            save_image(os.path.join(root, "images", f"rgb_img_{k}.png"), k, size=12)
            k += 1
    with open(os.path.join(root, "rgb_metadata.csv"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return k


def write_multinli(data_dir, spec):
    """multinli/data/metadata_random.csv + glue_data/MNLI/cached_* (lists of group DRO's
    utils_glue.InputFeatures, bert-base-uncased ids). spec: [(split, label, negation, s1, s2)];
    rows go to the train file, then dev, then dev-mm, in order."""
    import types

    import torch
    from transformers import AutoTokenizer

    from domainbed.datasets.text import MNLI_FEATURE_FILES
    from domainbed.networks.text import minilm_path

    module = types.ModuleType("utils_glue")

    class InputFeatures:
        def __init__(self, input_ids, input_mask, segment_ids, label_id):
            self.input_ids, self.input_mask = input_ids, input_mask
            self.segment_ids, self.label_id = segment_ids, label_id

    InputFeatures.__module__ = "utils_glue"
    InputFeatures.__qualname__ = "InputFeatures"
    module.InputFeatures = InputFeatures
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    base = os.path.join(data_dir, "multinli")
    os.makedirs(os.path.join(base, "data"), exist_ok=True)
    os.makedirs(os.path.join(base, "glue_data", "MNLI"), exist_ok=True)
    thirds = np.array_split(np.arange(len(spec)), 3)
    sys.modules["utils_glue"] = module
    try:
        for file, rows in zip(MNLI_FEATURE_FILES, thirds):
            features = []
            for i in rows:
                _, label, _, s1, s2 = spec[i]
                enc = tokenizer(s1, s2, padding="max_length", max_length=128, truncation=True)
                features.append(InputFeatures(enc["input_ids"], enc["attention_mask"],
                                              enc["token_type_ids"], label))
            torch.save(features, os.path.join(base, "glue_data", "MNLI", file))
    finally:
        del sys.modules["utils_glue"]
    lines = [",gold_label,sentence2_has_negation,split"]
    lines += [f"{i},{label},{neg},{split}" for i, (split, label, neg, _, _) in enumerate(spec)]
    with open(os.path.join(base, "data", "metadata_random.csv"), "w") as f:
        f.write("\n".join(lines) + "\n")
