"""Score a model on every environment split of a dataset into an ordinary run directory:
`domainbed-evaluate --checkpoint PATH | --model NAME [--weights FILE] --dataset D
--test_envs ... --output_dir DIR`. The directory holds what a training run writes (a
results.jsonl record with the --metrics keys, predictions, confusion matrices, `done`), so
the model joins collect_results tables, leaderboards, accuracy-on-the-line fits and
OODSelect zoos."""
import argparse
import sys
from typing import Any

from domainbed.hub_options import add_hf_flags, fold_hf_flags
from domainbed.training.config import EVAL_SPLITS_HELP, RunConfig
from oodutils.cli import (
    DATA_DIR_HELP,
    DEFAULT_DATA_DIR,
    ArgumentParser,
    add_logging_flags,
    add_option,
    check_outputs,
    configure_logging,
)
from oodutils.errors import UserError, epilog_example, run_cli
from oodutils.log import get_logger

logger = get_logger(__name__)
EPILOG = epilog_example("domainbed-evaluate", "domainbed.scripts.evaluate",
                        "--checkpoint sweeps/s1/RUN/model.pkl --output_dir evals/run1")
MODEL_HELP = ("an outside classifier: a backbone of the zoo (resnet50, clip_vit_b16, ...), "
              "timm:<model>, or hf:DIR (a Hugging Face image classifier saved on disk); "
              "read from local files only")
WEIGHTS_HELP = ("with --model: the classifier's state dict (safetensors or a torch file of "
                "tensors) with a head for the dataset's classes (open_clip towers: head.* and "
                "optionally visual.*); default: the zoo's ImageNet weights on disk")
CLASS_MAP_HELP = ("with --model: a JSON list, entry k the model output index (or list of "
                  "indices) of the dataset's class k, e.g. ImageNet classes")
TRUST_PICKLE_HELP = (
    "load a checkpoint that is a full pickle (DomainBed's own model.pkl holds numpy "
    "objects). Unsafe: loading a pickle runs code the file names, so a file from someone "
    "else can do anything your account can; pass it only for a file you made or trust")
# RunConfig fields the command passes on only when given (a checkpoint's own otherwise)
DATA_OPTIONS = ("dataset", "test_envs", "trial_seed", "data_seed", "holdout_fraction")


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="domainbed-evaluate", description=__doc__.split("\n\n")[0],
                       epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    add_option(source, "--checkpoint", metavar="PATH",
               help="one of our checkpoints: a run's model.pkl, model_step{N}.pkl, "
                    "model_best.pkl or an --export_selected model.pkl")
    add_option(source, "--model", metavar="NAME", help=MODEL_HELP)
    add_option(p, "--weights", default="", metavar="FILE", help=WEIGHTS_HELP)
    add_option(p, "--class_map", default="", metavar="FILE", help=CLASS_MAP_HELP)
    add_option(p, "--trust_pickle", action="store_true", help=TRUST_PICKLE_HELP)
    add_option(p, "--dataset", default=None,
               help="a registered dataset, folder:PATH, csv:PATH or hf:REPO_OR_DIR "
                    "(default with --checkpoint: the checkpoint's)")
    add_option(p, "--test_envs", type=int, nargs="+", default=None,
               help="default: the checkpoint's; with --model the dataset's default")
    add_option(p, "--output_dir", required=True, help="the run directory to write (new)")
    add_option(p, "--data_dir", default=DEFAULT_DATA_DIR, help=DATA_DIR_HELP)
    add_option(p, "--trial_seed", type=int, default=None,
               help="seed of the in/out split (default: the checkpoint's, else 0)")
    add_option(p, "--data_seed", type=int, default=None,
               help="seed that builds the environments (default: the checkpoint's, else 0)")
    add_option(p, "--holdout_fraction", type=float, default=None,
               help="fraction of each environment in its out split (default: the "
                    "checkpoint's, else 0.2)")
    add_option(p, "--metrics", nargs="+", default=[], metavar="METRIC",
               help="metrics beyond accuracy, as train's --metrics")
    add_option(p, "--eval_splits", nargs="+", default=["all"], metavar="SPLITS",
               help=EVAL_SPLITS_HELP)
    add_option(p, "--save_logits", action="store_true",
               help="also save per-example float16 logits with the predictions")
    add_option(p, "--eval_batch_size", type=int, default=64)
    add_option(p, "--weights_dir", default="",
               help="folder searched first for the zoo's weight files")
    add_hf_flags(p, add_option)
    add_logging_flags(p)
    return p


def run_options(args: Any) -> Any:
    """The RunConfig fields of the evaluation: those always set, and the data options
    only where given."""
    options = {"output_dir": args.output_dir, "data_dir": args.data_dir,
               "metrics": args.metrics, "eval_splits": args.eval_splits,
               "save_logits": args.save_logits, "eval_batch_size": args.eval_batch_size,
               "weights_dir": args.weights_dir}
    options.update({k: getattr(args, k) for k in DATA_OPTIONS if getattr(args, k) is not None})
    return options


def check_args(args: Any) -> None:
    if args.checkpoint and (args.weights or args.class_map):
        raise UserError("--weights and --class_map go with --model; a --checkpoint holds "
                        "its own weights")
    if args.model and args.trust_pickle:
        raise UserError("--trust_pickle goes with --checkpoint (outside models are read "
                        "from safetensors or tensor-only files, never pickles)")
    if args.model and not args.dataset:
        raise UserError("--model needs --dataset (the dataset to score it on)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args)
    check_outputs((args.output_dir, "--output_dir", True))
    if args.dataset:   # the --hf_* flags are part of an hf: dataset's name
        args.dataset = fold_hf_flags(args.dataset, vars(args))
    check_args(args)
    RunConfig.from_options(**run_options(args)).check_numbers()
    from domainbed.training import scoring
    if args.checkpoint:
        record = scoring.evaluate_checkpoint(args.checkpoint, run_options(args),
                                             args.trust_pickle)
    else:
        record = scoring.evaluate_model(args.model, run_options(args), args.weights,
                                        args.class_map)
    accs = [f"{k} {v:.3f}" for k, v in sorted(record.items())
            if k.startswith("env") and k.endswith("_acc") and isinstance(v, float)]
    print(f"run directory: {args.output_dir}")
    print(f"{record['args']['algorithm']} on {record['args']['dataset']}: " + "  ".join(accs))
    return 0


def cli() -> None:
    """The `domainbed-evaluate` console command ([project.scripts])."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    run_cli(main)
