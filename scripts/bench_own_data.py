"""Own data: the cost of image_size with the MLP (20 training steps on a small `folder:`
tree, default 224 px against 32 px: wall time and model.pkl size), and the cost of the
image check before training (files per second on the same kind of files).

    python scripts/bench_own_data.py [--images 64] [--check_images 2000]
    python scripts/bench_own_data.py --hub     (the same check on an hf: folder)
    python scripts/bench_own_data.py --make_tree DIR   (only the small tree the datasets
        guide's examples train on: DIR/<domain>/<class>/*.jpg and DIR/manifest.csv)

Prints one line per measurement; write the figures (with `uptime`) into the notes."""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from PIL import Image


def image_tree(root, domains, classes, per_class, size=(160, 120)):
    for domain in domains:
        for cls in classes:
            os.makedirs(os.path.join(root, domain, cls), exist_ok=True)
            for k in range(per_class):
                image = Image.effect_noise(size, 40 + k).convert("RGB")
                image.save(os.path.join(root, domain, cls, f"{k}.jpg"), quality=90)


def train_seconds(root, out, image_size):
    hparams = {"arch": "mlp", "pretrained": False, "image_size": image_size}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "domainbed.scripts.train", "--dataset",
                    f"folder:{root}", "--algorithm", "ERM", "--test_envs", "0", "--steps",
                    "20", "--hparams", json.dumps(hparams), "--output_dir", out, "-q"],
                   check=True, capture_output=True)
    return time.perf_counter() - start, os.path.getsize(os.path.join(out, "model.pkl"))


def check_rate(root):
    from domainbed.datasets.image_checks import file_problem
    paths = [os.path.join(base, f) for base, _, files in os.walk(root) for f in files]
    start = time.perf_counter()
    bad = sum(file_problem(p) is not None for p in paths)
    seconds = time.perf_counter() - start
    return len(paths), bad, seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=16, help="images per class and domain")
    parser.add_argument("--check_images", type=int, default=2000)
    args = parser.parse_args()
    print(f"load: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "mine")
        image_tree(root, ("a", "b", "c"), ("cat", "dog"), args.images)
        for size in (224, 32):
            seconds, model_bytes = train_seconds(root, os.path.join(tmp, f"run{size}"), size)
            print(f"image_size {size}: 20 steps (MLP, whole command) {seconds:.1f} s, "
                  f"model.pkl {model_bytes / 1e6:.1f} MB")
        big = os.path.join(tmp, "check")
        per = max(1, args.check_images // 4)
        image_tree(big, ("a", "b"), ("cat", "dog"), per, size=(227, 227))
        n, bad, seconds = check_rate(big)
        print(f"image check: {n} JPEGs of 227x227 px in {seconds:.2f} s "
              f"({n / seconds:.0f} files/s), {bad} bad")
    print(f"load: {os.getloadavg()}")




def hub_check_rate(root, n):
    """hf: a local Hub-layout folder of n JPEGs (227 px): seconds to resolve the name
    (datasets.load_dataset, first time: its cache is built), to build the dataset, and to
    check every image."""
    import io

    import datasets
    from PIL import Image as PILImage

    from domainbed.registry import get_dataset_class
    images = []
    for _ in range(n):
        buffer = io.BytesIO()
        PILImage.effect_noise((227, 227), 40).convert("RGB").save(buffer, "JPEG")
        images.append({"bytes": buffer.getvalue(), "path": None})
    os.makedirs(os.path.join(root, "data"))
    features = datasets.Features({"image": datasets.Image(), "domain": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["cat", "dog"])})
    datasets.Dataset.from_dict({"image": images, "domain": [f"d{k % 2}" for k in range(n)],
                                "label": [(k // 2) % 2 for k in range(n)]},
                               features=features).to_parquet(
        os.path.join(root, "data", "train-00000-of-00001.parquet"))
    start = time.perf_counter()
    cls = get_dataset_class(f"hf:{root}")
    resolved = time.perf_counter()
    dataset = cls("unused", [0], {"image_size": 32})
    built = time.perf_counter()
    dataset.check_images()
    checked = time.perf_counter()
    return resolved - start, built - resolved, checked - built


def main_hub(n=2000):
    with tempfile.TemporaryDirectory() as tmp:
        seconds = hub_check_rate(os.path.join(tmp, "hub"), n)
        print(f"hf: {n} JPEGs: resolve {seconds[0]:.2f} s, build (with the first torchvision "
              f"import) {seconds[1]:.2f} s, check {seconds[2]:.2f} s "
              f"({n / seconds[2]:.0f} images/s); load {os.getloadavg()}")


def make_tree(root, domains=("indoor", "outdoor"), classes=("cat", "dog"), per_class=3):
    """The guide's `pets` example: a folder layout and its `path,label,domain` table."""
    image_tree(root, domains, classes, per_class, size=(32, 32))
    rows = [f"{d}/{c}/{k}.jpg,{c},{d}\n" for d in domains for c in classes
            for k in range(per_class)]
    with open(os.path.join(root, "manifest.csv"), "w") as f:
        f.write("path,label,domain\n" + "".join(rows))


if __name__ == "__main__":
    if "--make_tree" in sys.argv:
        make_tree(sys.argv[sys.argv.index("--make_tree") + 1])
    elif "--hub" in sys.argv:
        main_hub()
    else:
        main()
