"""Train one model: `python -m domainbed.scripts.train --dataset D --algorithm A ...`
(DomainBed's flags, plus --data_seed, --precision, --save_logits, resume on rerun)."""
import argparse
import functools
import os
import sys
import traceback

from domainbed.errors import UserError, epilog_example, run_cli
from oodutils.cli import add_logging_flags
from oodutils.log import configure, get_logger

logger = get_logger(__name__)

EPILOG = epilog_example("domainbed-train", "domainbed.scripts.train",
                        "--data_dir ./data --dataset ColoredMNIST --algorithm ERM --test_envs 2 "
                        "--output_dir runs/erm --steps 100")


def parse_args(argv=None, configure_logging=False):
    """The run's arguments. -v / -q set the messages (with ``configure_logging``) and are
    then dropped: how chatty a run is is not part of what it is (its records' args)."""
    args = build_parser().parse_args(argv)
    verbosity = args.__dict__.pop("verbose") - args.__dict__.pop("quiet")
    if configure_logging:
        configure(verbosity)
    return args


@functools.lru_cache(maxsize=1)
def build_parser():
    p = argparse.ArgumentParser(description="Domain generalization: train one run",
                                epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data_dir", type=str, default="./domainbed/data/")
    p.add_argument("--dataset", type=str, default="ColoredMNIST")
    p.add_argument("--algorithm", type=str, default="ERM")
    p.add_argument("--task", type=str, default="domain_generalization",
                   choices=["domain_generalization", "domain_adaptation"])
    p.add_argument("--hparams", type=str, help="JSON-serialized hparams dict")
    p.add_argument("--hparams_seed", type=int, default=0,
                   help='seed for random hparams (0 means "default hparams")')
    p.add_argument("--trial_seed", type=int, default=0,
                   help="trial number (used for seeding split_dataset and random_hparams)")
    p.add_argument("--seed", type=int, default=0, help="seed for everything else")
    p.add_argument("--data_seed", type=int, default=0,
                   help="seed that builds the environments (same for every run of a sweep)")
    p.add_argument("--steps", type=int, default=None,
                   help="number of steps; default is the dataset's default")
    p.add_argument("--checkpoint_freq", type=int, default=None,
                   help="checkpoint every N steps; default is the dataset's default")
    p.add_argument("--test_envs", type=int, nargs="+", default=None,
                   help="default: the dataset's DEFAULT_TEST_ENVS, else [0]")
    p.add_argument("--output_dir", type=str, default="train_output")
    p.add_argument("--holdout_fraction", type=float, default=0.2)
    p.add_argument("--uda_holdout_fraction", type=float, default=0,
                   help="for domain adaptation, %% of test to use unlabeled for training")
    p.add_argument("--skip_model_save", action="store_true")
    p.add_argument("--save_model_every_checkpoint", action="store_true")
    p.add_argument("--save_logits", action="store_true",
                   help="also save per-example float16 logits with the predictions")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                   help="bf16 = bfloat16 autocast (needs AVX-512 BF16/AMX on CPU)")
    p.add_argument("--memory_format", default="auto",
                   choices=["auto", "channels_last", "contiguous"],
                   help="auto = channels-last on CPU or with bf16, contiguous otherwise")
    p.add_argument("--eval_splits", nargs="+", default=["all"], metavar="SPLITS",
                   help="splits to evaluate at each checkpoint, a union of: all (default, "
                        "DomainBed's), in, out, uda, test (test envs' splits), train "
                        "(training envs' splits), or names like env2_in; keys of splits "
                        "not evaluated are left out of the records")
    p.add_argument("--eval_batch_size", type=int, default=64)
    p.add_argument("--num_threads", type=int, default=0,
                   help="torch intra-op threads (0 = torch's default)")
    p.add_argument("--restart", action="store_true",
                   help="discard the run directory's resume state (e.g. a corrupt one) and "
                        "train from step 0; its old records are moved to results.jsonl.prev")
    p.add_argument("--weights_dir", type=str, default="",
                   help="folder searched first for backbone weight files")
    p.add_argument("--feature_cache_dir", type=str, default="",
                   help="frozen-feature cache of linear probes (default "
                        "~/.cache/domainbed/features; 'none' computes features every step)")
    add_logging_flags(p)
    return p


def validate(args, check_data_dir=True):
    from domainbed.registry import get_algorithm_class, get_dataset_class
    dataset_cls = get_dataset_class(args.dataset)
    algorithm_cls = get_algorithm_class(args.algorithm)
    if args.test_envs is None:
        args.test_envs = list(getattr(dataset_cls, "DEFAULT_TEST_ENVS", None) or [0])
    n_envs = len(dataset_cls.ENVIRONMENTS)
    bad = [e for e in args.test_envs if not 0 <= e < n_envs]
    if bad:
        raise UserError(f"test env {bad[0]} is out of range: {args.dataset} has {n_envs} "
                        f"environments (0..{n_envs - 1}: {', '.join(dataset_cls.ENVIRONMENTS)})")
    if len(set(args.test_envs)) != len(args.test_envs):
        raise UserError(f"--test_envs repeats an environment: {args.test_envs}")
    if len(args.test_envs) >= n_envs:
        raise UserError(f"every environment of {args.dataset} is a test environment "
                        f"(--test_envs {' '.join(map(str, args.test_envs))}); nothing to "
                        f"train on")
    if check_data_dir and not os.path.exists(args.data_dir):
        raise UserError(f"data directory {args.data_dir!r} does not exist")
    if check_data_dir and not os.path.isdir(args.data_dir):
        raise UserError(f"data directory {args.data_dir!r} is not a directory")
    if args.weights_dir and not os.path.isdir(args.weights_dir):
        raise UserError(f"--weights_dir {args.weights_dir!r} is not a directory")
    check_numbers(args)
    return algorithm_cls, dataset_cls


def check_numbers(args):
    import math
    if args.steps is not None and args.steps < 1:
        raise UserError("--steps must be at least 1")
    if args.checkpoint_freq is not None and args.checkpoint_freq < 1:
        raise UserError("--checkpoint_freq must be at least 1")
    if not (math.isfinite(args.holdout_fraction) and 0 < args.holdout_fraction < 1):
        raise UserError(f"--holdout_fraction must be in (0, 1), got {args.holdout_fraction}")
    if not (math.isfinite(args.uda_holdout_fraction) and 0 <= args.uda_holdout_fraction < 1):
        raise UserError(f"--uda_holdout_fraction must be in [0, 1), got "
                        f"{args.uda_holdout_fraction}")
    if args.eval_batch_size < 1:
        raise UserError(f"--eval_batch_size must be at least 1, got {args.eval_batch_size}")
    if args.num_threads < 0:
        raise UserError(f"--num_threads must be 0 (torch's default) or more, got "
                        f"{args.num_threads}")
    from domainbed.evaluation import check_eval_splits
    check_eval_splits(args.eval_splits)


def check_output_dir(path):
    """The output directory is (or can become) a writable directory: checked before
    training starts, not at the first checkpoint."""
    from domainbed.fileio import check_output_path
    check_output_path(path, "--output_dir", directory=True)


def make_output_dir(path):
    """Create the output directory and prove a file can be written in it."""
    import tempfile
    check_output_dir(path)
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".tmp-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UserError(f"--output_dir {path!r} is not writable ({e.strerror})") from None


def parse_overrides(args):
    """--hparams as a dict (the shared parser: one error line for bad JSON)."""
    from oodutils.cli import parse_json_object
    return parse_json_object(args.hparams, "--hparams")


def resolve_hparams(args, notify):
    from domainbed import hparams as hp
    return hp.resolve(args.algorithm, args.dataset, args.hparams_seed, args.trial_seed,
                      parse_overrides(args), notify=notify)


def check_job(argv, checked=None):
    """Everything main checks before training, creating nothing: the sweep checks every
    job with it before launching any (the data directory it checks itself). `checked`:
    a set remembering (algorithm, dataset, hparams) already found valid."""
    from domainbed import hparams as hp
    try:
        args = parse_args(argv)
    except SystemExit:
        raise UserError(f"invalid train arguments: {' '.join(map(str, argv))}") from None
    validate(args, check_data_dir=False)
    key = (args.algorithm, args.dataset, args.hparams)
    if checked is None or key not in checked:
        hp.check_overrides(args.algorithm, args.dataset, parse_overrides(args),
                           notify=lambda m: None)
        if checked is not None:
            checked.add(key)
    check_output_dir(args.output_dir)


def main(argv=None):
    from domainbed import training

    args = parse_args(argv, configure_logging=True)
    algorithm_cls, dataset_cls = validate(args)
    hparams = resolve_hparams(args, notify=logger.info)
    make_output_dir(args.output_dir)
    try:
        training.run(args, hparams, algorithm_cls, dataset_cls)
    except UserError as e:
        training.write_error(args.output_dir, f"error: {e}")
        raise
    except Exception:
        training.write_error(args.output_dir, traceback.format_exc())
        raise

def cli():
    """The `domainbed-train` console command ([project.scripts])."""
    from domainbed.errors import run_cli
    sys.exit(run_cli(main))


if __name__ == "__main__":
    run_cli(main)
