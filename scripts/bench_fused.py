"""Fused (stacked, vmapped) training against separate runs, per model: training step and
evaluation time for M models of one architecture on ColoredMNIST, on this machine.

    python scripts/bench_fused.py [--device cpu|cuda] [--models 1 4 16] [--steps 20] \\
        [--archs mlp mnist_cnn] [--threads 1] [--json out.json]

"separate" trains the M runs one after another (the local launcher's arithmetic, without
process start); "fused" trains them as one domainbed.launch.fused_training.FusedGroup. Both
draw the same minibatches. Reported: milliseconds per model-step and per model-evaluation
of the out splits, and the speed-up of fused over separate (above 1: fused is faster).
"""
import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

ARCH_HPARAMS = {"mlp": {"arch": "mlp", "mlp_width": 256}, "mnist_cnn": {"arch": "mnist_cnn"},
                "resnet_small": {"arch": "resnet_small"}}


def build_runs(arch, n_models, root, steps, threads):
    from domainbed.training.config import RunConfig
    from domainbed.training.loop import TrainingRun, build_run_data
    runs, data = [], None
    for i in range(n_models):
        hparams = dict(ARCH_HPARAMS[arch], lr=1e-3 * (1 + i % 3), batch_size=64)
        args = RunConfig.from_argv([
            "--dataset", "ColoredMNIST", "--algorithm", "ERM", "--data_dir", root,
            "--output_dir", os.path.join(root, f"run{i}"), "--test_envs", "2",
            "--steps", str(steps + 1), "--seed", str(i), "--num_threads", str(threads),
            "--eval_splits", "out", "--hparams", json.dumps(hparams)])
        algorithm_cls, dataset_cls = args.validate()
        resolved = args.resolve_hparams(notify=lambda m: None)
        data = data or build_run_data(dataset_cls, args, resolved)
        runs.append(TrainingRun(args, resolved, algorithm_cls, dataset_cls, log=lambda m: None,
                                data=data))
    return runs


def timed(fn, device):
    import torch
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def bench(arch, n_models, steps, threads, device):
    from domainbed.launch.fused_training import FusedGroup
    from domainbed.training.evaluation import evaluate
    with tempfile.TemporaryDirectory() as root:
        runs = build_runs(arch, n_models, root, steps, threads)
        for run in runs:   # warm-up
            run.train_step(0)

        def separate_steps():
            for step in range(1, steps + 1):
                for run in runs:
                    run.train_step(step)

        def separate_eval():
            for run in runs:
                evaluate(run.algorithm, run.named_splits, run.ctx, 0, False)
        sep_train, sep_eval = timed(separate_steps, device), timed(separate_eval, device)
        group = FusedGroup(runs)
        group.train_step(0)   # warm-up
        fused_train = timed(lambda: [group.train_step(s) for s in range(1, steps + 1)], device)
        fused_eval = timed(group.predict, device)
    per_step = 1000 / (n_models * steps)
    return {"arch": arch, "models": n_models, "device": device,
            "separate_ms_per_model_step": sep_train * per_step,
            "fused_ms_per_model_step": fused_train * per_step,
            "train_speedup": sep_train / fused_train,
            "separate_ms_per_model_eval": 1000 * sep_eval / n_models,
            "fused_ms_per_model_eval": 1000 * fused_eval / n_models,
            "eval_speedup": sep_eval / fused_eval}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--models", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--archs", nargs="+", default=["mlp", "mnist_cnn"],
                        choices=sorted(ARCH_HPARAMS))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda: no CUDA device here")
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""   # TrainingRun picks cuda when it can
    torch.set_num_threads(args.threads)
    rows = []
    print(f"{'arch':<12}{'models':>7}{'sep ms/step':>13}{'fused ms/step':>15}{'x':>7}"
          f"{'sep ms/eval':>13}{'fused ms/eval':>15}{'x':>7}")
    for arch in args.archs:
        for n in args.models:
            r = bench(arch, n, args.steps, args.threads, args.device)
            rows.append(r)
            print(f"{arch:<12}{n:>7}{r['separate_ms_per_model_step']:>13.2f}"
                  f"{r['fused_ms_per_model_step']:>15.2f}{r['train_speedup']:>7.2f}"
                  f"{r['separate_ms_per_model_eval']:>13.1f}{r['fused_ms_per_model_eval']:>15.1f}"
                  f"{r['eval_speedup']:>7.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from benchfigures import record
    result = "; ".join(
        f"{r['arch']} x{r['models']}: {r['separate_ms_per_model_step']:.1f}/"
        f"{r['fused_ms_per_model_step']:.1f}" for r in rows)
    widest = max(rows, key=lambda r: r["models"])
    record("fused", what="Fused launcher, ms per model-step",
           headline=f"{widest['arch']} x{widest['models']}: "
                    f"{widest['fused_ms_per_model_step']:.1f} ms fused",
           peer=f"separate runs {widest['separate_ms_per_model_step']:.1f} ms",
           command="python scripts/bench_fused.py " + " ".join(sys.argv[1:]),
           result=result, method=f"{args.device}, {args.threads} thread(s), {args.steps} steps")


if __name__ == "__main__":
    main()
