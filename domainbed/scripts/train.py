"""Train one model: `python -m domainbed.scripts.train --dataset D --algorithm A ...`
(DomainBed's flags, plus --data_seed, --precision, --save_logits, resume on rerun).
The options are `domainbed.RunConfig`'s fields; the parser is generated from it."""
import sys
from typing import Any

from domainbed.training.config import RunConfig, build_parser
from oodutils.errors import run_cli
from oodutils.log import configure, get_logger

logger = get_logger(__name__)


def parse_args(argv: list[str] | None = None,
               configure_logging: bool = False) -> RunConfig:
    """The run's RunConfig. -v / -q set the messages (with ``configure_logging``) and are
    then dropped: how chatty a run is is not part of what it is (its records' args)."""
    namespace = build_parser().parse_args(argv)
    if configure_logging:
        configure(namespace.verbose - namespace.quiet)
    return RunConfig.from_namespace(namespace)


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv, configure_logging=True)
    config.validate()   # names checked against the registries before training's imports
    from domainbed.training import distributed, run  # torch: once the flags are checked
    results = run.run_config(config, notify=logger.info)
    if not distributed.is_secondary_process():   # under torchrun: rank 0 says it once
        print(summary(config.output_dir, results), flush=True)


def summary(output_dir: str, results: Any) -> Any:
    """What the run left where: its directory and the last checkpoint's accuracies."""
    lines = [f"run directory: {output_dir}"]
    if results is None:
        lines.append("(already finished: its records are in results.jsonl)")
        return "\n".join(lines)
    accs = [f"{k} {v:.3f}" for k, v in sorted(results.items())
            if k.startswith("env") and k.endswith("_acc") and isinstance(v, float)]
    lines.append(f"step {results['step']}: " + "  ".join(accs))
    return "\n".join(lines)


def cli() -> None:
    """The `domainbed-train` console command ([project.scripts])."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    run_cli(main)
