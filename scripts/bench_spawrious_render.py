"""Time the procedural Spawrious backend: render and write N images of one cell, one process.

    python scripts/bench_spawrious_render.py                  # 24 images at 224 px
    python scripts/bench_spawrious_render.py --images 60 --size 224 --location jungle

Times the worker the generator runs per chunk (render, PNG encoding, atomic write) with
CPU time of this process, and prints seconds per image and images per CPU-minute. The
test suite checks what the images are, not how fast they come: this is where the figure
is measured (report it with the machine's load).
"""
import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from spawrious.constants import BREEDS, LOCATIONS  # noqa: E402
from spawrious.generate import _render_chunk, prepare_output  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=24)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--location", default="jungle", choices=LOCATIONS)
    ap.add_argument("--breed", default="labrador", choices=BREEDS)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = prepare_output(os.path.join(tmp, "bench"), "procedural", 0, {"size": args.size},
                             args.images)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        _render_chunk((out, 0, args.size, 0, args.location, args.breed,
                       list(range(args.images))))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    per_image = cpu / args.images
    print(f"{args.images} images at {args.size} px ({args.location}, {args.breed}): "
          f"{per_image:.4f} CPU s/image, {60 / per_image:,.0f} images per CPU-minute "
          f"(wall {wall:.2f} s)")


if __name__ == "__main__":
    main()
