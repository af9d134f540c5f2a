"""One place where benchmark scripts record their figures for the docs' Benchmarks page.

Each benchmark script ends with ``record(key, what=..., headline=..., peer=..., ...)``: that
writes ``docs/benchmarks/<key>.json`` (the figure, the command that produced it, this
machine's description and today's date). The MkDocs hook (``scripts/gen_docs.py``) renders
every such file into ``docs/benchmarks.md``, so the page holds what the scripts last
measured, never a number typed by hand. Scripts import it with
``sys.path.insert(0, os.path.dirname(__file__))`` (the scripts folder is not a package).
"""
import datetime
import json
import os
import platform
import re
from pathlib import Path

FIGURES = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
KEY = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu():
    try:
        import torch
        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:  # a benchmark without torch still records its figure
        pass
    return None


def machine():
    """This machine in words: cores, CPU model, GPU if any, and the load when measured."""
    cores = os.cpu_count() or 1
    text = f"{cores}-core {_cpu_model()}"
    gpu = _gpu()
    if gpu:
        text += f", {gpu}"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    if load is not None and load > cores * 0.75:
        text += f" (loaded: load average {load:.1f} on {cores} cores; an upper bound)"
    return text


# the page's row is short: the details stay in the record
MAX_CHARS = {"what": 80, "headline": 60, "peer": 60}


def record(key, *, what, command, headline, peer, result, method=None, figures=FIGURES):
    """Write one figure for the Benchmarks page; returns the file written.

    `what` names what was measured, `headline` is the figure itself and `peer` what it is
    set against (DomainBed, a single run, the machine's limit), each a short phrase for the
    page's row; `result` holds every number (with units) and `method` says how it was
    measured where the command alone does not (repetitions, warm-up, what is timed).
    """
    if not KEY.match(key):
        raise ValueError(f"benchmark key {key!r}: use lower-case letters, digits, - and _")
    short = {"what": what, "headline": headline, "peer": peer}
    for name, text in short.items():
        if not text or len(text) > MAX_CHARS[name] or "|" in text:
            raise ValueError(f"benchmark {key}: {name} must be 1-{MAX_CHARS[name]} "
                             f"characters without '|', got {text!r}")
    entry = {"what": what, "headline": headline, "peer": peer, "command": command,
             "result": result, "method": method, "machine": machine(),
             "date": datetime.date.today().isoformat()}
    figures = Path(figures)
    figures.mkdir(parents=True, exist_ok=True)
    path = figures / f"{key}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(entry, indent=1) + "\n")
    os.replace(tmp, path)
    if figures == FIGURES:
        from gen_docs import write_benchmarks_page
        write_benchmarks_page()
    print(f"recorded benchmark figure {key}: {result}  ({path})")
    return path
