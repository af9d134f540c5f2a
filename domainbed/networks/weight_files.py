"""A weights file read safely and checked: only tensors (safetensors, or
``torch.load(weights_only=True)``; a TorchScript archive or a pickled object is refused, since
loading one runs the code stored in it), a regular file of bounded size, whose sha256 matches
the prefix a published file carries in its name (torchvision's ``resnet18-f37072fd.pth``)."""
import hashlib
import io
import os
import re
import warnings
import zipfile
from typing import Any

import torch

from oodutils.errors import UserError, require
from oodutils.untrusted import open_input, read_input

MAX_WEIGHTS_BYTES = 64 << 30   # a weights file is read whole; larger is not a model file


_sha256_memo: dict[Any, Any] = {}


def file_sha256(path: str) -> Any:
    """sha256 of a regular file (memoized per path, size and modification time; a FIFO
    or device is one error line, never a hang)."""
    stat = os.stat(path)
    key = (os.path.abspath(path), stat.st_size, stat.st_mtime_ns)
    if key not in _sha256_memo:
        digest = hashlib.sha256()
        with open_input(path, "weights file", follow=True) as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        _sha256_memo[key] = digest.hexdigest()
    return _sha256_memo[key]

_HASH_IN_NAME = re.compile(r"-([0-9a-f]{8,64})\.(?:pth|pt|bin|safetensors)$")


def check_name_hash(path: str, sha256: str | None = None) -> None:
    """A file named like torchvision's `resnet18-f37072fd.pth` carries the first hex digits
    of its sha256 (`sha256`: the hash of the bytes read, else the file's): a file that
    does not match them is not the published one."""
    match = _HASH_IN_NAME.search(os.path.basename(path))
    sha256 = (sha256 or file_sha256(path)) if match else ""
    if match and not sha256.startswith(match.group(1)):
        raise UserError(f"weights file {path} does not match the sha256 prefix "
                        f"{match.group(1)} in its name (got {sha256[:8]}); it is "
                        "damaged or not the published file: download it again (a file of "
                        "your own whose name only looks like a hash: rename it)")


def _is_torchscript_archive(data: Any) -> bool:
    """A TorchScript archive is a zip with a `code/` folder (torch.save's zips have none)."""
    if not zipfile.is_zipfile(io.BytesIO(data)):
        return False
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return any(name.split("/")[1:2] == ["code"] for name in archive.namelist())


def read_state_dict(path: str, option: str = "") -> Any:
    """A state dict from a .safetensors or torch file, read without running code: only
    tensors and plain containers (torch.load weights_only), never a TorchScript archive,
    whose loading runs the code stored in it. The file is read once, a regular file only
    (a FIFO never hangs the read); `option`: the flag that named it (--weights), whose
    file must not be a symlink either (the zoo's files, found in caches, may be)."""
    data = read_input(path, option or "weights file", MAX_WEIGHTS_BYTES,
                      follow=not option)
    check_name_hash(path, hashlib.sha256(data).hexdigest())
    if path.endswith(".safetensors"):
        return _safetensors_state(path, data)
    try:
        if _is_torchscript_archive(data):  # torch 2.4's torch.load would load it, not refuse
            raise RuntimeError("a TorchScript archive")
        with warnings.catch_warnings():  # torch warns of TorchScript before refusing it
            warnings.simplefilter("ignore", UserWarning)
            state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # an unpickler refusal, a TorchScript archive, a damaged file
        raise UserError(  # torch's own text advises weights_only=False: not repeated here
            f"cannot read weights file {path} as tensors only ({type(e).__name__}); "
            "weights are loaded only from "
            "safetensors or plain torch state dicts, never TorchScript archives or "
            "pickled objects, because loading those runs code stored in the file (OpenAI's "
            "CLIP .pt files are TorchScript: use the open_clip_model.safetensors file of the "
            "backbone's Hugging Face repository instead)") from None
    for key in ("state_dict", "model", "model_dict"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict):
        raise UserError(f"weights file {path} holds a {type(state).__name__}, not a state "
                        "dict of tensors")
    return state


def _safetensors_state(path: str, data: Any) -> Any:
    """The tensors of a safetensors file's bytes; a malformed one (a huge or torn header,
    bad JSON, an unknown dtype, offsets past its end, a pickle under that name) is one
    error line."""
    load = require("safetensors.torch", extra="backbones").load
    try:
        return load(data)
    except Exception as e:   # SafetensorError, or a dtype torch lacks
        reason = " ".join(str(e).split())[:200] or type(e).__name__
        raise UserError(f"weights file {path} is not a valid safetensors file ({reason})"
                        ) from None
