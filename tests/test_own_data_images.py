"""Own data (``folder:``, ``csv:``): every file is checked to be a regular, decodable image
within the size limit before training starts; a bad one is one error line naming the file
and why (never a traceback mid-training, never a hang on a FIFO), and
``--skip_bad_images`` leaves the bad ones out with a count.

The bad files are written by the tests: a text file named .png, a JPEG cut in half (and
one missing only its end marker), a PNG whose header says 30000x30000 (a decompression
bomb; only its header is written), a PNG cut in half, a FIFO and a folder named x.png."""
import io
import os
import struct
import subprocess
import sys
import zlib

import pytest
from PIL import Image

from domainbed.datasets.image_checks import bytes_problem, file_problem
from domainbed.registry import get_dataset_class
from domainbed.training.config import RunConfig
from domainbed.training.loop import build_run_data
from oodutils.errors import UserError
from tests.test_own_data import REPO, csv_rows, image_tree, write_csv

HPARAMS = {"image_size": 16, "data_augmentation": False}


def _png_header_only(width, height):
    """A PNG whose IHDR claims width x height (the pixels are never written)."""
    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height,
                                                             8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b""))


def _encoded(fmt):
    buffer = io.BytesIO()
    Image.effect_noise((120, 90), 60).convert("RGB").save(buffer, fmt)
    return buffer.getvalue()


def write_bad(path, kind):
    """Write the bad file `kind` at `path`; returns the words its error line must hold."""
    if kind == "text":
        path.write_text("not an image at all\n")
        return "is not an image"
    if kind == "truncated_jpeg":
        data = _encoded("JPEG")
        path.write_bytes(data[: len(data) // 2])
        return "truncated JPEG"
    if kind == "jpeg_without_end":
        path.write_bytes(_encoded("JPEG")[:-2])
        return "truncated JPEG"
    if kind == "truncated_png":
        data = _encoded("PNG")
        path.write_bytes(data[: len(data) // 2])
        return "damaged PNG"
    if kind == "bomb":
        path.write_bytes(_png_header_only(30000, 30000))
        return "decompression bomb"
    if kind == "fifo":
        os.mkfifo(path)
        return "is a FIFO"
    if kind == "folder":
        path.mkdir()
        return "is a folder"
    raise AssertionError(kind)


KINDS = ["text", "truncated_jpeg", "jpeg_without_end", "truncated_png", "bomb", "fifo",
         "folder"]


def test_good_images_pass_and_each_bad_kind_is_named(tmp_path):
    for fmt in ("JPEG", "PNG", "BMP", "WEBP"):
        (tmp_path / f"ok.{fmt}").write_bytes(_encoded(fmt))
        assert file_problem(tmp_path / f"ok.{fmt}") is None
        assert bytes_problem(_encoded(fmt)) is None
    jpeg_with_trailer = _encoded("JPEG") + b"\0" * 10000   # bytes after the end marker
    assert bytes_problem(jpeg_with_trailer) is None
    for kind in KINDS:
        path = tmp_path / f"bad_{kind}.png"
        words = write_bad(path, kind)
        assert words in file_problem(path), kind
    assert "more than the limit of 100" in bytes_problem(_encoded("PNG"), max_pixels=100)
    (tmp_path / "empty.jpg").write_bytes(b"")
    assert file_problem(tmp_path / "empty.jpg") == "is empty"


def _config(name, **changes):
    return RunConfig(dataset=name, test_envs=[0], **changes)


def _build(name, **changes):
    config = _config(name, **changes)
    return build_run_data(get_dataset_class(name), config, dict(HPARAMS))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layout", ["folder", "csv"])
def test_a_bad_file_is_one_error_naming_it_before_training(tmp_path, kind, layout):
    if kind == "folder" and layout == "folder":
        pytest.skip("in a folder: dataset a sub-folder is walked into, not read as a file")
    root = image_tree(tmp_path / "mine", domains=("a", "b"), per_class=2)
    words = write_bad(root / "b" / "dog" / "x.png", kind)
    rows = csv_rows(domains=("a", "b"), per_class=2) + [("b/dog/x.png", 1, "b", 2)]
    name = f"folder:{root}" if layout == "folder" else f"csv:{write_csv(root / 'm.csv', rows)}"
    with pytest.raises(UserError) as caught:
        _build(name)
    message = str(caught.value)
    assert "\n" not in message and "x.png" in message and words in message
    assert "--skip_bad_images" in message


def test_skip_bad_images_leaves_them_out_with_a_count(tmp_path):
    root = image_tree(tmp_path / "mine", domains=("a", "b"), per_class=3)
    name = f"folder:{root}"
    clean = _build(name)
    write_bad(root / "b" / "dog" / "x.png", "fifo")
    write_bad(root / "a" / "cat" / "y.jpg", "truncated_jpeg")
    heard = []
    config = _config(name, skip_bad_images=True)
    import domainbed.training.loop as loop
    data = loop.build_run_data(get_dataset_class(name), config, dict(HPARAMS))
    sizes = [len(env) for env in data.dataset]
    assert sizes == [len(env) for env in clean.dataset] == [6, 6]
    assert all("x.png" not in p and "y.jpg" not in p for env in data.dataset for p in env.paths)
    assert data.dataset.data_fingerprint != clean.dataset.data_fingerprint
    from domainbed.datasets.image_checks import check_environments
    fresh = loop.build_dataset(get_dataset_class(name), "unused", [0], dict(HPARAMS), 0)
    assert check_environments(fresh, skip_bad=True, log=heard.append) == 2
    assert "skipped 2 bad image(s)" in heard[0]
    assert [len(env) for env in fresh] == [6, 6]


def test_skipping_every_image_of_a_class_in_a_domain_is_refused(tmp_path):
    root = image_tree(tmp_path / "mine", domains=("a", "b"), per_class=1)
    os.remove(root / "b" / "dog" / "0.jpg")
    write_bad(root / "b" / "dog" / "0.png", "text")
    with pytest.raises(UserError, match="class 'dog' has no images in domain 'b'"):
        _build(f"folder:{root}", skip_bad_images=True)


def test_train_with_a_fifo_in_the_csv_exits_with_one_line(tmp_path):
    root = image_tree(tmp_path / "mine", domains=("a", "b"), per_class=1)
    write_bad(root / "a" / "cat" / "x.png", "fifo")
    rows = csv_rows(domains=("a", "b"), per_class=1) + [("a/cat/x.png", 0, "a", 0)]
    csv = write_csv(root / "m.csv", rows)
    proc = subprocess.run(
        [sys.executable, "-m", "domainbed.scripts.train", "--dataset", f"csv:{csv}",
         "--steps", "1", "--output_dir", str(tmp_path / "out")],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "x.png" in lines[0] and "is a FIFO" in lines[0], lines
