"""Time linear probes on cached frozen features against full fine-tuning (CPU, 2 threads).

    python scripts/bench_linear_probe.py                       # ResNet-18, 96 px, 3 x 1000
    python scripts/bench_linear_probe.py --per_env 500 --steps 500 --later_runs 2

A synthetic three-environment image set (a class signal plus noise, in memory) trains
ERM with a ResNet-18 (random initialization: the cost is the same as with ImageNet
weights) through the real training loop (`domainbed.training.loop.run`): the first
`linear_probe` run (it extracts and caches every example's features), `--later_runs` more
linear-probe runs with other learning rates (cache hits), and a full fine-tuning run of
`--full_steps` steps and one checkpoint whose set-up, per-step and per-checkpoint times
are extrapolated to `--steps` steps and their checkpoints (a full run would take hours).
Prints JSON: wall times, runs per hour and the speed-up of a later linear-probe run over a
full run.
"""
import json
import os
import shutil
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from domainbed import hparams as hp  # noqa: E402
from domainbed import run_hparams  # noqa: E402
from domainbed.algorithms.erm import ERM  # noqa: E402
from domainbed.datasets.base import (  # noqa: E402
    MultipleDomainDataset,
    TensorEnvironment,
    fingerprint_arrays,
)
from domainbed.training import feature_cache  # noqa: E402
from domainbed.training import loop as training
from domainbed.training.config import RunConfig  # noqa: E402
from oodutils.cli import ArgumentParser, add_option  # noqa: E402


def synthetic_images(per_env, size, n_classes=4):
    """A MultipleDomainDataset class: per environment, per_env images of `size` px."""

    class Synthetic(MultipleDomainDataset):
        ENVIRONMENTS = ["0", "1", "2"]
        INPUT_SHAPE = (3, size, size)
        N_WORKERS = 0

        def __init__(self, root, test_envs, hparams, data_seed=0):
            g = torch.Generator().manual_seed(data_seed)
            self.input_shape, self.num_classes, self.datasets = self.INPUT_SHAPE, n_classes, []
            for e in range(3):
                y = torch.randint(0, n_classes, (per_env,), generator=g)
                x = torch.randn(per_env, 3, size, size, generator=g)
                x[:, e % 3] += 0.5 * y.view(-1, 1, 1).float()
                ids = torch.arange(per_env) + e * per_env
                self.datasets.append(TensorEnvironment(x, y, ids.numpy()))
            self.data_source = f"synthetic:{per_env}x{size}"
            self.data_fingerprint = fingerprint_arrays(*[d.x for d in self.datasets])

    return Synthetic


def timed_run(dataset_cls, out, steps, checkpoint_freq, cache, threads, **hparams_overrides):
    args = RunConfig.from_argv(["--test_envs", "0", "--output_dir", out, "--steps", str(steps),
                       "--checkpoint_freq",
                       str(checkpoint_freq), "--data_dir", out, "--feature_cache_dir", cache,
                       "--num_threads", str(threads), "--skip_model_save"])
    hparams = hp.draw(run_hparams.hparam_space(ERM, dataset_cls), 0)
    hparams.update(backbone="resnet18", pretrained=False, batch_size=32)
    hparams.update(hparams_overrides)
    os.makedirs(out, exist_ok=True)
    start = time.perf_counter()
    training.run(args, hparams, ERM, dataset_cls, log=lambda m: None)
    return time.perf_counter() - start


def time_full_finetuning(dataset_cls, out, n_steps, threads):
    """Set-up, per-step and per-checkpoint seconds of a full fine-tuning run (TrainingRun's
    own pieces: n_steps steps, then one checkpoint), for extrapolation."""
    args = RunConfig.from_argv(["--test_envs", "0", "--output_dir", out, "--data_dir", out,
                       "--feature_cache_dir", "none",
                       "--num_threads", str(threads), "--skip_model_save"])
    hparams = hp.draw(run_hparams.hparam_space(ERM, dataset_cls), 0)
    hparams.update(backbone="resnet18", pretrained=False, batch_size=32, transfer="full")
    os.makedirs(out, exist_ok=True)
    start = time.perf_counter()
    run = training.TrainingRun(args, hparams, ERM, dataset_cls, log=lambda m: None)
    run.restore()
    setup = time.perf_counter() - start
    start = time.perf_counter()
    for step in range(n_steps):
        run.train_step(step)
    per_step = (time.perf_counter() - start) / n_steps
    start = time.perf_counter()
    run.checkpoint(n_steps - 1)
    return setup, per_step, time.perf_counter() - start


def main():
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    add_option(ap, "--per_env", type=int, default=1000, help="images per environment")
    add_option(ap, "--size", type=int, default=96)
    add_option(ap, "--steps", type=int, default=1000)
    add_option(ap, "--checkpoint_freq", type=int, default=200)
    add_option(ap, "--later_runs", type=int, default=3)
    add_option(ap, "--full_steps", type=int, default=5,
                    help="steps of the full fine-tuning run that is timed and extrapolated")
    add_option(ap, "--threads", type=int, default=2)
    add_option(ap, "--out", default="", help="also write the JSON here")
    opts = ap.parse_args()
    torch.set_num_threads(opts.threads)
    dataset_cls = synthetic_images(opts.per_env, opts.size)
    work = tempfile.mkdtemp(prefix="bench_linear_probe_")
    cache = os.path.join(work, "cache")
    try:
        run = lambda name, **kw: timed_run(dataset_cls, os.path.join(work, name),  # noqa: E731
                                           threads=opts.threads, **kw)
        feature_cache.STATS.clear()
        first = run("probe0", steps=opts.steps, checkpoint_freq=opts.checkpoint_freq,
                    cache=cache, transfer="linear_probe", lr=1e-3)
        later = [run(f"probe{i + 1}", steps=opts.steps, checkpoint_freq=opts.checkpoint_freq,
                     cache=cache, transfer="linear_probe", lr=10 ** (-2.0 - i / 2))
                 for i in range(opts.later_runs)]
        assert feature_cache.STATS == {"extracted": 1, "loaded": opts.later_runs}
        setup, per_step, per_eval = time_full_finetuning(
            dataset_cls, os.path.join(work, "full"), opts.full_steps, opts.threads)
        n_checkpoints = len(range(0, opts.steps, opts.checkpoint_freq)) + \
            int((opts.steps - 1) % opts.checkpoint_freq != 0)
        full = setup + per_step * opts.steps + per_eval * n_checkpoints
    finally:
        shutil.rmtree(work, ignore_errors=True)
    later_mean = sum(later) / len(later)
    report = {
        "machine": f"{os.cpu_count()} cpus visible, torch threads {opts.threads}",
        "images": 3 * opts.per_env, "size": opts.size, "steps": opts.steps,
        "checkpoints": n_checkpoints, "first_linear_probe_s": round(first, 2),
        "later_linear_probe_s": [round(t, 2) for t in later],
        "full_finetune_setup_s": round(setup, 2),
        "full_finetune_step_s": round(per_step, 3),
        "full_finetune_eval_s": round(per_eval, 2),
        "full_finetune_run_s_extrapolated": round(full, 1),
        "linear_probe_heads_per_hour": round(3600 / later_mean, 1),
        "full_finetune_runs_per_hour": round(3600 / full, 2),
        "speedup_later_probe_vs_full": round(full / later_mean, 1),
    }
    text = json.dumps(report, indent=2)
    print(text)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from benchfigures import record
    record("linear-probe", what="Linear probe on cached features (ResNet-18, 96 px)",
           headline=f"{max(report['later_linear_probe_s'])} s a run",
           peer=f"full fine-tuning ~{report['full_finetune_run_s_extrapolated']:.0f} s",
           command="python scripts/bench_linear_probe.py " + " ".join(sys.argv[1:]),
           result=f"{min(report['later_linear_probe_s'])}-{max(report['later_linear_probe_s'])}"
                  f" s a cached probe run vs ~{report['full_finetune_run_s_extrapolated']:.0f} s"
                  f" a full run ({report['speedup_later_probe_vs_full']}x)",
           method=f"{report['steps']} steps, {report['images']} images of {report['size']} px")
    if opts.out:
        with open(opts.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
