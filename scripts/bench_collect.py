"""Time and peak memory of collect_results on a DomainBed-format sweep of many runs:
ours cold (no records cache), ours warm (the records cache the cold run wrote), DomainBed's
collect_results on the same files, and optionally an older checkout of ours.

    python scripts/bench_collect.py --runs 100000            # builds 1.2 GB in a temp dir
    python scripts/bench_collect.py --runs 10000 --record    # writes docs/benchmarks/...
    python scripts/bench_collect.py --sweep_dir /tmp/s --keep --domainbed PATH --old PATH
    python scripts/bench_collect.py --runs 100000 --background_load 2   # a busy machine

The sweep comes from scripts/sweep_replica.py (DomainBed's test sweep replicated with
distinct datasets, algorithms, seeds and hparams; 12 checkpoints a run). Each command runs
in its own process under /usr/bin/time: wall seconds, CPU seconds (user + system) and
peak resident memory. DomainBed's code: --domainbed PATH (a checkout), else the
stored snapshot of facebookresearch/DomainBed if present. The outputs are compared byte
for byte (ours cold = ours warm = the older checkout's; DomainBed's text).
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep_replica import build_sweep  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CACHE_FILE = ".records-cache.parquet"
DOMAINBED_SNAPSHOT = "/work/.mirror/facebookresearch+DomainBed/repo"


def timed(command, cwd):
    """(stdout, wall s, cpu s, peak MB, load average before) of `command` run in `cwd`
    under /usr/bin/time (its CPU: user + system of it and the worker processes it
    waited for)."""
    load = os.getloadavg()[0]
    with tempfile.NamedTemporaryFile("r", suffix=".time") as report:
        start = time.perf_counter()
        done = subprocess.run(["/usr/bin/time", "-f", "%U %S %M", "-o", report.name,
                               *command], cwd=cwd, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": cwd})
        wall = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"error: {' '.join(command)} failed in {cwd}:\n"
                             f"{done.stderr[-2000:]}")
        user, system, peak_kb = report.read().split()[-3:]
    return done.stdout, wall, float(user) + float(system), int(peak_kb) / 1024, load


def read_through(sweep):
    """Read every file of the sweep, so that the next command finds it in the page
    cache ("cold" is without the records cache, not from the disk; this VM's memory
    monitor reclaims idle cache pages, which otherwise adds seconds of disk reads at
    random)."""
    for folder, _, files in os.walk(sweep):
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                while f.read(1 << 20):
                    pass


def compile_bytecode(checkout):
    """Compile a checkout's modules to bytecode first, as installing a package does (a
    command otherwise compiles them on every start where PYTHONDONTWRITEBYTECODE is set)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-x", r"[/\\]\.", checkout],
                   check=False, capture_output=True)


def domainbed_checkout(path, workdir):
    """A directory holding DomainBed's `domainbed` package, or None."""
    if path:
        return path
    if not os.path.isdir(DOMAINBED_SNAPSHOT):
        return None
    out = os.path.join(workdir, "DomainBed")
    os.makedirs(out)
    archive = subprocess.run(["git", "-C", DOMAINBED_SNAPSHOT, "archive", "HEAD"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", out], input=archive, check=True)
    return out


def measure(sweep, domainbed, old, repeats):
    """{name: [(output, wall, cpu, peak MB, load), ...]} of each collect_results run on
    `sweep` (ours `repeats` times cold then warm), each after the sweep is read through."""
    ours = [sys.executable, "-m", "domainbed.scripts.collect_results", "--input_dir", sweep,
            "--no_save"]
    cache = os.path.join(sweep, CACHE_FILE)
    results = {"ours cold": [], "ours warm (cache)": []}
    for _ in range(repeats):
        if os.path.exists(cache):
            os.remove(cache)
        for name in results:
            read_through(sweep)
            results[name].append(timed(ours, ROOT))
    if old:     # (cold: the older checkout's own cache is written, not read)
        if os.path.exists(cache):
            os.remove(cache)
        read_through(sweep)
        results["ours before (" + os.path.basename(os.path.normpath(old)) + ")"] = \
            [timed(ours, old)]
    if domainbed:
        read_through(sweep)
        results["DomainBed"] = [timed([sys.executable, "-m",
                                       "domainbed.scripts.collect_results", "--input_dir",
                                       sweep], domainbed)]
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--checkpoints", type=int, default=12)
    parser.add_argument("--sweep_dir", default=None,
                        help="build (or reuse, when it holds runs) the sweep here")
    parser.add_argument("--keep", action="store_true", help="keep the sweep afterwards")
    parser.add_argument("--domainbed", default=None, help="a DomainBed checkout")
    parser.add_argument("--no_domainbed", action="store_true",
                        help="leave DomainBed's collect_results out (it takes longest)")
    parser.add_argument("--old", default=None, help="an older checkout of this project")
    parser.add_argument("--repeats", type=int, default=3,
                        help="time ours cold and warm this many times (the median is "
                             "reported, with every run's wall time)")
    parser.add_argument("--background_load", type=int, default=0, metavar="N",
                        help="start N busy processes for the whole run (a shared machine)")
    parser.add_argument("--record", action="store_true",
                        help="write the figure to docs/benchmarks (benchfigures.record)")
    args = parser.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="bench-collect-")
    sweep = args.sweep_dir or os.path.join(workdir, "sweep")
    try:
        if not (os.path.isdir(sweep) and os.listdir(sweep)):
            start = time.perf_counter()
            size = build_sweep(sweep, args.runs, args.checkpoints)
            print(f"built {args.runs} runs, {size / 1e9:.2f} GB of records in "
                  f"{time.perf_counter() - start:.0f} s")
            time.sleep(2.5)   # the cache stores only files settled for 2 s
        runs = sum(1 for _ in os.scandir(sweep) if _.is_dir())
        domainbed = None if args.no_domainbed else domainbed_checkout(args.domainbed, workdir)
        for checkout in filter(None, (ROOT, domainbed, args.old)):
            compile_bytecode(checkout)
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(args.background_load)]
        try:
            results = measure(sweep, domainbed, args.old, max(args.repeats, 1))
        finally:
            for process in busy:
                process.kill()
                process.wait()
        report(results, runs, args, domainbed)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
            if args.sweep_dir is None:
                shutil.rmtree(sweep, ignore_errors=True)
    return 0


def report(results, runs, args, domainbed):
    cold = results["ours cold"][0][0]
    lines = []
    medians = {name: statistics.median(wall for _, wall, *_ in timings)
               for name, timings in results.items()}
    for name, timings in results.items():
        same = all(output == cold for output, *_ in timings)
        compared = "" if name == "ours cold" and same else \
            f", output {'identical' if same else 'DIFFERENT'}"
        walls = [wall for _, wall, *_ in timings]
        spread = "" if len(walls) == 1 else \
            f" (median of {len(walls)}: {', '.join(f'{w:.1f}' for w in walls)})"
        cpu = statistics.median(cpu for _, _, cpu, _, _ in timings)
        peak = max(peak for *_, peak, _ in timings)
        load = timings[0][4]
        lines.append(f"{name}: {statistics.median(walls):.1f} s wall{spread}, {cpu:.1f} s "
                     f"CPU, {peak:.0f} MB peak (load {load:.1f}){compared}")
    if "DomainBed" in medians:
        lines.append(f"DomainBed / ours: cold {medians['DomainBed'] / medians['ours cold']:.1f}x,"
                     f" warm {medians['DomainBed'] / medians['ours warm (cache)']:.1f}x")
    if args.background_load:
        lines.append(f"with {args.background_load} busy background processes throughout")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    print(f"{runs} runs, {cores} cores; wall and CPU seconds (user + system, worker "
          f"processes included), peak resident memory, the 1-minute load average before "
          f"each command (above the core count the figures are upper bounds); goals at "
          f"100,000 runs: cold <= 10 s wall and <= 1.5 GB, warm <= 2 s:")
    print("\n".join("  " + line for line in lines))
    if domainbed is None and not args.no_domainbed:
        print("  DomainBed: no checkout (--domainbed PATH)")
    if args.record:
        from benchfigures import record
        peer = (f"DomainBed {medians['DomainBed']:.1f} s" if "DomainBed" in medians
                else "DomainBed not run")
        record(f"collect-{runs // 1000}k" + (f"-load{args.background_load}"
                                             if args.background_load else ""),
               what=f"collect_results, {runs:,} runs",
               headline=f"cold {medians['ours cold']:.1f} s, warm "
                        f"{medians['ours warm (cache)']:.1f} s",
               peer=peer,
               command=f"python scripts/bench_collect.py --runs {args.runs} --repeats "
                       f"{args.repeats} --background_load {args.background_load} --record"
                       + (" --no_domainbed" if args.no_domainbed else "")
                       + (" --old CHECKOUT" if args.old else ""),
               result="; ".join(lines),
               method=f"a DomainBed-format sweep ({args.checkpoints} checkpoints a run, "
                      "built from DomainBed's test sweep); "
                      "each command in its own process under /usr/bin/time (user + system "
                      "CPU, peak resident memory), bytecode compiled beforehand as an "
                      "installed package has it, the sweep's files read through before "
                      "each command (in the page cache: this VM's memory monitor pages out "
                      "idle cache); cold: no records cache; warm: the Parquet records cache "
                      "written by the cold run before it; ours cold and warm run --repeats "
                      "times, "
                      "the median reported; outputs compared byte for byte with ours "
                      "cold")


if __name__ == "__main__":
    sys.exit(main())
