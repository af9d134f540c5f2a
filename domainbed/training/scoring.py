"""Scoring a finished model on every environment split into an ordinary run directory
(`domainbed-evaluate`): one of our checkpoints (model.pkl, model_step{N}.pkl,
model_best.pkl, an --export_selected model.pkl) or an outside classifier
(`domainbed.networks.classifiers`). The run directory is a training run's: one
results.jsonl record with the `--metrics` keys, predictions, confusion matrices, `done`;
so outside models join collect_results, the leaderboard, accuracy-on-the-line fits and
OODSelect zoos.

Checkpoints are read with ``torch.load(weights_only=True)``: tensors, numbers, strings and
plain containers only. DomainBed's own model.pkl files hold numpy scalars in their
hyperparameters: a full pickle, whose loading runs code named in the file; they load only
when the user passes ``trust_pickle=True`` for a file they trust.
"""
import hashlib
import io
import json
import os
import re
import warnings
from typing import Any

import torch

from domainbed import run_hparams
from domainbed.networks import backbones, classifiers
from domainbed.networks.weight_files import MAX_WEIGHTS_BYTES
from domainbed.registry import get_algorithm_class
from domainbed.training import arithmetic
from domainbed.training.config import RunConfig
from domainbed.training.evaluation import RunContext, evaluate
from domainbed.training.loop import (
    build_run_data,
    data_args,
    evaluated_splits,
    pick_memory_format,
    write_checkpoint,
)
from oodutils.errors import UserError, load_error_reason
from oodutils.pinned_dir import PinnedDir
from oodutils.untrusted import parse_json, read_input, read_regular_bytes

CHECKPOINT_KEYS = ("args", "model_hparams", "model_dict", "model_input_shape",
                   "model_num_classes", "model_num_domains")



def read_checkpoint(path: str, trust_pickle: bool = False) -> tuple[Any, ...]:
    """(the saved dict of one of our (or DomainBed's) checkpoints, the sha256 of the bytes
    it was read from). The file is read once, a regular file that is no symlink (a FIFO
    never hangs it); one that is not tensors and plain containers only is refused unless
    `trust_pickle`."""
    data = read_input(path, "--checkpoint", MAX_WEIGHTS_BYTES)
    sha256 = hashlib.sha256(data).hexdigest()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            saved = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:   # a pickle's refused global, a torn zip, not torch at all
        if "Unsupported global" not in str(e):   # damaged, or not a torch file at all
            raise UserError(f"--checkpoint {path} cannot be read: damaged, or not a torch "
                            f"checkpoint ({type(e).__name__})") from None
        if not trust_pickle:
            raise UserError(
                f"--checkpoint {path} is a full pickle, not tensors and plain values only "
                f"({load_error_reason(e)}); loading it would run code named in the file. If "
                f"you made it or trust it completely (DomainBed's own model.pkl files hold "
                f"numpy objects), pass --trust_pickle") from None
        try:
            saved = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
        except Exception as e2:
            raise UserError(f"--checkpoint {path} cannot be read ({type(e2).__name__})"
                            ) from None
    missing = [k for k in CHECKPOINT_KEYS if not isinstance(saved, dict) or k not in saved]
    if missing:
        raise UserError(f"--checkpoint {path} is not a DomainBed checkpoint (no "
                        f"{', '.join(missing)})")
    return saved, sha256


def checkpoint_step(path: str, saved_args: Any, dataset_cls: Any) -> Any:
    """The training step the checkpoint holds: from model_step{N}.pkl, from the
    model_best.json or selection.json beside it, else the run's last step."""
    match = re.fullmatch(r"model_step(\d+)\.pkl", os.path.basename(path))
    if match:
        return int(match.group(1))
    folder = os.path.dirname(os.path.abspath(path))
    beside = {"model_best.pkl": "model_best.json", "model.pkl": "selection.json"}
    side = beside.get(os.path.basename(path))
    if side:
        try:   # beside a shared run's model: a symlink or FIFO there counts as absent
            step = parse_json(read_regular_bytes(os.path.join(folder, side), 1 << 20))
            step = step.get("step") if isinstance(step, dict) else None
            if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
                return step
        except OSError:
            pass
    steps = saved_args.get("steps") or getattr(dataset_cls, "N_STEPS", 1)
    return max(int(steps) - 1, 0)


def checkpoint_hparams(saved: Any) -> Any:
    """The checkpoint's hyperparameters over today's defaults (a DomainBed checkpoint
    lacks the ones this project added), as plain Python values."""
    args = saved["args"]
    hparams = run_hparams.default_hparams(args["algorithm"], args["dataset"])
    hparams.update({k: v.item() if hasattr(v, "item") else v
                    for k, v in saved["model_hparams"].items()})
    return hparams


def checkpoint_algorithm(saved: Any, hparams: dict[str, Any]) -> Any:
    """The saved algorithm, rebuilt and loaded (no pretrained weights fetched: the state
    dict holds every weight)."""
    algorithm_cls = get_algorithm_class(saved["args"]["algorithm"])
    algorithm = algorithm_cls(tuple(saved["model_input_shape"]), saved["model_num_classes"],
                              saved["model_num_domains"], {**hparams, "pretrained": False})
    try:
        algorithm.load_state_dict(saved["model_dict"])
    except RuntimeError as e:
        raise UserError(f"the checkpoint's weights do not fit {saved['args']['algorithm']}: "
                        f"{' '.join(str(e).split())[:300]}") from None
    return algorithm


def check_output_dir(output_dir: str) -> None:
    """A new or empty folder: an evaluation never mixes with another run's records."""
    if os.path.lexists(os.path.join(output_dir, "results.jsonl")):
        raise UserError(f"--output_dir {output_dir!r} already holds a run (results.jsonl); "
                        f"choose a new folder")


def score(model: Any, config: RunConfig, data: Any, dataset_cls: Any, hparams: dict[str, Any],
          model_args: Any, step: int) -> Any:
    """Evaluate `model` (anything with predict(x)) on every split of `data` and write the
    run directory config.output_dir; returns its record."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = model.to(device)
    ctx = RunContext(device, config.precision, pick_memory_format("auto", device, "fp32"),
                     config.eval_batch_size, min(getattr(data.dataset, "N_WORKERS", 0),
                                                 os.cpu_count() or 1))
    named = evaluated_splits(data, config)
    group_names = getattr(data.dataset, "group_names", None)
    metrics, table, confusion = evaluate(
        model, named, ctx, len(group_names or []), config.save_logits,
        extra_metrics=config.metrics, num_classes=data.dataset.num_classes)
    model.eval()
    args = {**data_args(config, data.dataset, dataset_cls),   # one forward pass: single
            **arithmetic.args_entries(arithmetic.SINGLE, device), **model_args}
    record = {"step": step, **metrics, "mem_gb": 0.0, "hparams": hparams, "args": args}
    with PinnedDir.open(config.output_dir, create=True) as run_dir:
        write_checkpoint(run_dir, step, table, confusion, [json.dumps(record, sort_keys=True)])
        run_dir.write_text("done", "done\n", durable=True)
    return record


SPLIT_OPTIONS = ("dataset", "test_envs", "trial_seed", "data_seed", "holdout_fraction",
                 "uda_holdout_fraction", "task")


def evaluate_checkpoint(path: str, options: Any, trust_pickle: bool = False) -> Any:
    """Score a checkpoint. `options`: RunConfig fields the user gave (output_dir, data_dir,
    metrics, ...); the dataset, test environments and split seeds not given are the
    checkpoint's, so its `in`/`out` splits are those it was trained and selected on."""
    saved, sha256 = read_checkpoint(path, trust_pickle)
    saved_args = saved["args"]
    inherited = {k: saved_args[k] for k in SPLIT_OPTIONS
                 if saved_args.get(k) is not None and k not in options}
    config = RunConfig.from_options(**{**inherited, **options})
    dataset_cls = config.validate_data()
    check_output_dir(config.output_dir)
    hparams = checkpoint_hparams(saved)
    data = build_run_data(dataset_cls, config, hparams)
    if data.dataset.num_classes != saved["model_num_classes"] or \
            tuple(data.dataset.input_shape) != tuple(saved["model_input_shape"]):
        raise UserError(f"the checkpoint's model takes {tuple(saved['model_input_shape'])} "
                        f"inputs in {saved['model_num_classes']} classes; {config.dataset} has "
                        f"{tuple(data.dataset.input_shape)} inputs in "
                        f"{data.dataset.num_classes} classes")
    algorithm = checkpoint_algorithm(saved, hparams)
    model_args = {"algorithm": saved_args["algorithm"],
                  "hparams_seed": int(saved_args.get("hparams_seed") or 0),
                  "seed": int(saved_args.get("seed") or 0),
                  "evaluated_checkpoint": os.path.abspath(path),
                  "checkpoint_sha256": sha256,
                  "trained_on": {k: saved_args.get(k) for k in ("dataset", "test_envs")}}
    return score(algorithm, config, data, dataset_cls, hparams, model_args,
                 checkpoint_step(path, saved_args, dataset_cls))


def evaluate_model(name: str, options: Any, weights: str = "", class_map_file: str = "") -> Any:
    """Score an outside classifier (`domainbed.networks.classifiers`); `options`: RunConfig
    fields (dataset, test_envs, output_dir, ...)."""
    config = RunConfig.from_options(**options)
    dataset_cls = config.validate_data()
    check_output_dir(config.output_dir)
    if weights and not os.path.isfile(weights):
        raise UserError(f"--weights {weights!r} is not a file")
    backbones.set_weights_dir(config.weights_dir)
    hparams = run_hparams.resolve("ERM", config.dataset, 0, config.trial_seed, {},
                                  notify=lambda m: None)
    data = build_run_data(dataset_cls, config, hparams)
    class_map = (classifiers.read_class_map(class_map_file, data.dataset.num_classes)
                 if class_map_file else None)
    model, identity = classifiers.outside_classifier(
        name, data.dataset.input_shape, data.dataset.num_classes, weights, class_map)
    model_args = {"algorithm": name, "evaluated_model": identity}
    return score(model, config, data, dataset_cls, hparams, model_args, 0)
