"""Own data: the cost of image_size with the MLP (20 training steps on a small `folder:`
tree, default 224 px against 32 px: wall time and model.pkl size), and the cost of the
image check before training (files per second on the same kind of files).

    python scripts/bench_own_data.py [--images 64] [--check_images 2000]

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
    for d, domain in enumerate(domains):
        for c, cls in enumerate(classes):
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


if __name__ == "__main__":
    main()
