"""Every image of a user's dataset (``folder:``, ``csv:``, ``hf:``) is checked before
training starts, so that a bad file is one clear line instead of a traceback (or a hang)
in the middle of a run.

A file passes when it is a regular file (a FIFO, a device or a folder named ``x.png`` is
refused without being read: it is opened non-blocking and checked with ``fstat``), PIL
identifies it from its header, its width x height is at most ``MAX_IMAGE_PIXELS`` (PIL's
own decompression-bomb limit), PIL's ``verify`` accepts it (PNG: every chunk and its CRC)
and, for a JPEG, an end-of-image marker follows the last scan (a truncated JPEG has none;
PIL's ``verify`` does not look, and DomainBed's loaders set ``LOAD_TRUNCATED_IMAGES``, so
it would otherwise decode grey padding silently). No file is fully decoded: the check
reads headers, PNG chunks and a JPEG's tail.

``check_environments(dataset, skip_bad, log)`` runs the check over a dataset's image
environments: the first bad file is one UserError line (with how many are bad in all and
``--skip_bad_images``), or, with ``skip_bad``, the bad files are dropped and counted.
"""
import io
import os
import stat
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

from domainbed.datasets.layout import fingerprint_columns
from oodutils.errors import UserError

MAX_IMAGE_PIXELS = 89_478_485   # PIL's default Image.MAX_IMAGE_PIXELS
JPEG_TAIL = 4096                # bytes of a JPEG's end read first for its end marker
_SOS, _EOI = b"\xff\xda", b"\xff\xd9"
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _kind(mode: Any) -> Any:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def file_problem(path: str, max_pixels: Any = MAX_IMAGE_PIXELS) -> Any:
    """Why the file at `path` is not a usable image, or None when it is."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        return f"cannot be opened ({e.strerror})"
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        return f"is {_kind(mode)}, not a regular image file"
    with os.fdopen(fd, "rb") as f:
        return stream_problem(f, max_pixels)


def bytes_problem(data: Any, max_pixels: Any = MAX_IMAGE_PIXELS) -> Any:
    """Why the encoded image `data` (bytes) is not a usable image, or None."""
    return stream_problem(io.BytesIO(data), max_pixels)


def stream_problem(f: Any, max_pixels: Any = MAX_IMAGE_PIXELS) -> str | None:
    """Why the seekable binary stream `f` does not hold a usable image, or None."""
    size = f.seek(0, io.SEEK_END)
    if size == 0:
        return "is empty"
    f.seek(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            image = Image.open(f)
        except Image.DecompressionBombError:
            return f"has more than {2 * Image.MAX_IMAGE_PIXELS:,} pixels (a decompression bomb)"  # type: ignore[operator]
        except Image.UnidentifiedImageError:
            return "is not an image (PIL recognises no image format in it)"
        except Exception as e:  # PIL raises many kinds on garbage; each one is "not an image"
            return f"is not an image PIL can read ({_reason(e)})"
        width, height = image.size
        if width * height > max_pixels:
            return (f"is {width}x{height} pixels, more than the limit of {max_pixels:,} "
                    f"(a decompression bomb?)")
        fmt = image.format
        try:
            image.verify()
        except Exception as e:
            return f"is a damaged {fmt} image ({_reason(e)})"
    if fmt == "JPEG" and not _jpeg_complete(f, size):
        return "is a truncated JPEG (no end-of-image marker after its last scan)"
    return None


def _reason(error: Any) -> Any:
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return text[:200]


def _jpeg_complete(f: Any, size: Any) -> bool:
    """An end-of-image marker after the last start-of-scan: the tail first, the whole
    file only when the tail does not settle it (trailing bytes after the marker)."""
    f.seek(max(0, size - JPEG_TAIL))
    tail = f.read()
    if tail.rfind(_EOI) > tail.rfind(_SOS):
        return True
    f.seek(0)
    data = f.read()
    return data.rfind(_EOI) > data.rfind(_SOS) >= 0


def check_environments(dataset: Any, skip_bad: bool = False,
                       log: Callable[[str], Any] | None = None) -> int:
    """Check every image of `dataset`'s environments (each with ``paths`` or an
    ``image_problem(i)`` method); raise one UserError for the first bad one, or with
    `skip_bad` drop the bad ones from their environments (``keep(indices)``), fold them into
    the data fingerprint and return how many were dropped."""
    name = getattr(dataset, "registry_name", type(dataset).__name__)
    bad = []   # (environment index, example index, where, why)
    for e, env in enumerate(dataset.datasets):
        for i in range(len(env)):
            why = env.image_problem(i)
            if why:
                bad.append((e, i, env.describe(i), why))
    if not bad:
        return 0
    if not skip_bad:
        _, _, where, why = bad[0]
        more = f" ({len(bad)} bad images in all)" if len(bad) > 1 else ""
        raise UserError(f"{name}: {where} {why}{more}; fix or remove it, or pass "
                        f"--skip_bad_images to train without the bad images")
    for e, env in enumerate(dataset.datasets):
        drop = {i for be, i, _, _ in bad if be == e}
        if drop:
            env.keep(np.asarray([i for i in range(len(env)) if i not in drop], dtype=np.int64))
        if not len(env):
            raise UserError(f"{name}: every image of environment {e} "
                            f"({dataset.ENVIRONMENTS[e]}) is bad; nothing left to use")
    dataset.data_fingerprint = fingerprint_columns(
        [dataset.data_fingerprint], [where for _, _, where, _ in bad])
    if log is not None:
        log(f"{name}: skipped {len(bad)} bad image(s) (--skip_bad_images), e.g. "
            f"{bad[0][2]} {bad[0][3]}")
    return len(bad)
