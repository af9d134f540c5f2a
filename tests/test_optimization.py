"""Optimizers, learning-rate schedules, gradient accumulation and early stopping: each
checked against torch's own optimizer and scheduler classes driven by a plain loop, or
against values worked out by hand."""
import copy
import json
import sys

import pytest
import torch
import torch.nn.functional as F

from domainbed import run_hparams
from domainbed.algorithms.optimization import make_optimizer
from domainbed.training.early_stopping import EarlyStopping
from oodutils.errors import UserError
from tests.hardening_util import (  # noqa: F401  (quiet_threads is a fixture)
    comparable,
    quiet_threads,
    records,
    train,
    train_argv,
    train_partially,
    training_run,
)

STEPS = 8
pytestmark = pytest.mark.usefixtures("quiet_threads")


def _argv(out, hparams, **kw):
    return train_argv(out, hparams=json.dumps({"arch": "mlp", **hparams}), **kw)


def _torch_optimizer(kind, params, lr, weight_decay):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)


def _torch_scheduler(kind, optimizer, warmup):
    """The schedule written directly with torch's classes (warm-up: 1/(w+1) ... 1)."""
    sched = torch.optim.lr_scheduler
    rest = STEPS - warmup
    main = {"constant": lambda: sched.LambdaLR(optimizer, lambda t: 1.0),
            "cosine": lambda: sched.CosineAnnealingLR(optimizer, T_max=rest),
            "linear": lambda: sched.LinearLR(optimizer, 1.0, 0.0, total_iters=rest),
            "step": lambda: sched.StepLR(optimizer, step_size=3, gamma=0.5)}[kind]()
    if not warmup:
        return main
    ramp = sched.LinearLR(optimizer, 1.0 / (warmup + 1), 1.0, total_iters=warmup)
    return sched.SequentialLR(optimizer, [ramp, main], milestones=[warmup])


@pytest.mark.parametrize("kind, schedule, warmup, clip", [
    ("adam", "constant", 0, 0.0), ("sgd", "cosine", 2, 0.0), ("adamw", "linear", 0, 0.0),
    ("sgd", "step", 0, 0.0), ("adam", "cosine", 3, 0.0), ("sgd", "constant", 0, 0.05)])
def test_optimizer_and_schedule_match_torchs_own_loop(tmp_path, kind, schedule, warmup,
                                                      clip):
    hparams = {"optimizer": kind, "lr_schedule": schedule, "warmup_steps": warmup,
               "lr_step_size": 3, "lr_gamma": 0.5, "lr": 0.05, "weight_decay": 1e-3,
               "max_grad_norm": clip}
    run = training_run(_argv(tmp_path / "run", hparams, steps=STEPS))
    network = copy.deepcopy(run.algorithm.network)
    optimizer = _torch_optimizer(kind, network.parameters(), 0.05, 1e-3)
    scheduler = _torch_scheduler(schedule, optimizer, warmup)
    for step in range(STEPS):
        batches = run.minibatches.batches(step)
        run.train_step(step)
        x = torch.cat([x for x, _ in batches])
        y = torch.cat([y for _, y in batches])
        optimizer.zero_grad()
        F.cross_entropy(network(x), y).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(network.parameters(), clip)
        optimizer.step()
        scheduler.step()
    ours = dict(run.algorithm.network.named_parameters())
    for name, param in network.named_parameters():
        torch.testing.assert_close(ours[name], param, rtol=1e-5, atol=1e-6, msg=name)
    moved = [(p - q).abs().max().item() for p, q in zip(
        network.parameters(), copy.deepcopy(training_run(
            _argv(tmp_path / "fresh", hparams)).algorithm.network).parameters())]
    assert max(moved) > 1e-3   # training happened: the comparison above is not vacuous


def test_grad_accumulation_equals_the_larger_batch(tmp_path):
    """ERM without dropout: 2 micro-batches of 8 per step give the gradient of 16. SGD
    shows the gradients themselves; Adam's first steps are lr * g / |g|, which turns the
    round-off of near-zero gradients (summed in another order) into 1e-4 differences."""
    sgd = {"lr": 0.05, "optimizer": "sgd"}
    big = training_run(_argv(tmp_path / "big", {"batch_size": 16, **sgd}, steps=5))
    accumulated = training_run(_argv(tmp_path / "acc", {"batch_size": 8, **sgd,
                                                        "grad_accum_steps": 2}, steps=5))
    for step in range(5):
        loss_big = big.train_step(step)["loss"]
        loss_acc = accumulated.train_step(step)["loss"]
        assert loss_acc == pytest.approx(loss_big, rel=1e-5)
    ours = dict(accumulated.algorithm.named_parameters())
    for name, param in big.algorithm.named_parameters():
        torch.testing.assert_close(ours[name], param, rtol=1e-5, atol=1e-6, msg=name)
    single = training_run(_argv(tmp_path / "single", {"batch_size": 8, **sgd}, steps=5))
    for step in range(5):
        single.train_step(step)
    differs = [(p - q).abs().max().item() for p, q in zip(
        single.algorithm.parameters(), big.algorithm.parameters())]
    assert max(differs) > 1e-4   # a batch of 8 alone is not the same run


def test_grad_accumulation_refused_where_update_steps_its_own_optimizers(tmp_path):
    with pytest.raises(UserError, match="DANN does not support grad_accum_steps > 1"):
        training_run(_argv(tmp_path / "run", {"grad_accum_steps": 2}, algorithm="DANN"))


def test_every_optimizer_of_an_algorithm_gets_the_choice():
    hparams = run_hparams.resolve("DANN", "Debug28", overrides={"optimizer": "sgd",
                                                                 "momentum": 0.5},
                                  notify=lambda m: None)
    from domainbed.registry import get_algorithm_class
    dann = get_algorithm_class("DANN")((3, 28, 28), 2, 2, hparams)
    for optimizer in (dann.disc_opt, dann.gen_opt):
        assert type(optimizer) is torch.optim.SGD
        assert optimizer.param_groups[0]["momentum"] == 0.5
        assert "betas" not in optimizer.param_groups[0]   # Adam's betas are not SGD's


def test_make_optimizer_defaults_to_domainbeds_adam():
    param = [torch.nn.Parameter(torch.zeros(2))]
    optimizer = make_optimizer(param, {"lr": 0.1, "weight_decay": 0.0})
    assert type(optimizer) is torch.optim.Adam and optimizer.defaults["lr"] == 0.1


# SubpopBench's values, read in YyzHarry/SubpopBench subpopbench/hparams_registry.py
# (lr 1e-3 images / 1e-5 text, weight_decay 1e-4, optimizer sgd / adamw) and
# learning/optimizers.py (SGD momentum 0.9), learning/algorithms.py (text: linear
# schedule without warm-up, gradient norm clipped to 1.0).
@pytest.mark.parametrize("dataset, expected", [
    ("Waterbirds", {"optimizer": "sgd", "momentum": 0.9, "lr": 1e-3, "weight_decay": 1e-4,
                    "lr_schedule": "constant"}),
    ("CelebA", {"optimizer": "sgd", "momentum": 0.9, "lr": 1e-3, "weight_decay": 1e-4}),
    ("MultiNLI", {"optimizer": "adamw", "lr": 1e-5, "weight_decay": 1e-4,
                  "lr_schedule": "linear", "warmup_steps": 0, "max_grad_norm": 1.0}),
    ("CivilComments", {"optimizer": "adamw", "lr": 1e-5, "lr_schedule": "linear"}),
    ("PACS", {"optimizer": "adam", "lr": 5e-5, "weight_decay": 0.0,
              "lr_schedule": "constant", "grad_accum_steps": 1}),
    ("ColoredMNIST", {"optimizer": "adam", "lr": 1e-3, "lr_schedule": "constant"}),
    # DomainBed-trained framings of the same images keep DomainBed's Adam
    ("WILDSWaterbirds", {"optimizer": "adam", "lr": 5e-5, "weight_decay": 0.0}),
    ("NICO_Mixed", {"optimizer": "adam", "lr": 5e-5, "weight_decay": 0.0}),
])
def test_benchmark_protocol_defaults(dataset, expected):
    got = run_hparams.default_hparams("ERM", dataset)
    assert {k: got[k] for k in expected} == expected


def test_bad_choices_are_one_clear_error():
    with pytest.raises(UserError, match="'optimizer' must be one of 'adam', 'sgd', 'adamw'"):
        run_hparams.resolve("ERM", "Debug28", overrides={"optimizer": "rmsprop"})
    with pytest.raises(UserError, match="'grad_accum_steps' must be in"):
        run_hparams.resolve("ERM", "Debug28", overrides={"grad_accum_steps": 0})


def _records(values, key="val"):
    return [{"step": 10 * i, key: v} for i, v in enumerate(values)]


@pytest.mark.parametrize("spec, values, patience, stop_index, best_step", [
    ("val", [0.5, 0.6, 0.6, 0.55, 0.7], 2, 3, 10),      # no strict gain at 0.6 twice
    ("val", [0.5, 0.6, 0.6, 0.7, 0.65, 0.66], 2, 5, 30),
    ("val", [0.1, 0.2, 0.3], 1, None, 20),              # always improving: never stops
    ("min:val", [0.5, 0.4, 0.45, 0.3], 1, 2, 10),
    ("env0_nll", [0.5, 0.4, 0.45, 0.3], 2, None, 30),   # nll: minimized by its name
])
def test_early_stopping_counts_checkpoints_without_improvement(spec, values, patience,
                                                               stop_index, best_step):
    key = spec.rpartition(":")[2]
    stopper = EarlyStopping(spec, patience, train_envs=[1])
    first_stop = None
    for index, record in enumerate(_records(values, key)):
        if stopper.observe(record):   # the run ends here
            first_stop = index
            break
    assert first_stop == stop_index
    assert stopper.best_step == best_step


def test_early_stopping_val_metric_averages_training_envs():
    stopper = EarlyStopping("val_acc", 1, train_envs=[0, 2])
    record = {"step": 0, "env0_out_acc": 0.5, "env1_out_acc": 0.0, "env2_out_acc": 0.75}
    assert stopper.value(record) == 0.625
    with pytest.raises(UserError, match="no numeric key 'val_nll'.*env0_out_acc"):
        EarlyStopping("val_nll", 1, [0]).value(record)


def test_early_stopping_run_stops_records_and_resumes_stopped(tmp_path, capsys):
    """min:step never improves after step 0: with checkpoints every 2 steps and patience 2
    the run stops at step 4, whatever the training does."""
    out = tmp_path / "run"
    argv = _argv(out, {}, steps=20, freq=2) + ["--early_stopping", "min:step",
                                                 "--patience", "2"]
    reference = tmp_path / "reference"
    assert train(_argv(reference, {}, steps=20, freq=2) +
                 ["--early_stopping", "min:step", "--patience", "2"], capsys)[0] == 0
    recs = records(reference)
    assert [r["step"] for r in recs] == [0, 2, 4] and (reference / "done").exists()
    assert recs[-1]["early_stopping_step"] == 4
    assert recs[-1]["early_stopping_best_step"] == 0
    assert all("early_stopping_step" not in r for r in recs[:-1])
    train_partially(argv, stop_after=5)    # killed after the stopping checkpoint
    assert not (out / "done").exists()
    assert train(argv, capsys)[0] == 0
    assert comparable(records(out)) == comparable(recs) and (out / "done").exists()


def test_resume_mid_schedule_gives_the_uninterrupted_records(tmp_path, capsys):
    hparams = {"optimizer": "sgd", "lr_schedule": "cosine", "warmup_steps": 3, "lr": 0.003}
    reference, out = tmp_path / "reference", tmp_path / "resumed"
    assert train(_argv(reference, hparams, steps=12, freq=3), capsys)[0] == 0
    train_partially(_argv(out, hparams, steps=12, freq=3), stop_after=7)  # "killed" at 7
    assert [r["step"] for r in records(out)] == [0, 3, 6]
    assert train(_argv(out, hparams, steps=12, freq=3), capsys)[0] == 0
    assert comparable(records(out)) == comparable(records(reference))
    constant = tmp_path / "constant"
    assert train(_argv(constant, {**hparams, "lr_schedule": "constant", "warmup_steps": 0},
                       steps=12, freq=3), capsys)[0] == 0
    for late in (-2, -1):   # the schedule shows in the records a resume must reproduce
        assert records(constant)[late]["loss"] != \
            pytest.approx(records(reference)[late]["loss"], rel=1e-3)


@pytest.mark.parametrize("argv, message", [
    (["--patience", "3"], "--patience needs --early_stopping METRIC"),
    (["--early_stopping", "val_acc", "--patience", "0"], "--patience must be at least 1"),
    (["--early_stopping", "up:val_acc"], "expected a record key such as val_acc"),
])
def test_early_stopping_options_are_checked(tmp_path, capsys, argv, message):
    code, err = train(_argv(tmp_path / "run", {}) + argv, capsys)
    assert code != 0 and message in err


@pytest.mark.parametrize("hparams, extra, reason", [
    ({"optimizer": "sgd"}, [], "optimizer='sgd'"),
    ({"lr_schedule": "cosine"}, [], "lr_schedule='cosine'"),
    ({"grad_accum_steps": 2}, [], "grad_accum_steps=2"),
    ({}, ["--early_stopping", "val_acc"], "stops early"),
])
def test_fused_launcher_leaves_such_jobs_to_the_local_launcher(tmp_path, hparams, extra,
                                                               reason):
    from domainbed.launch import fused
    from domainbed.launch.jobs import Command
    argv = _argv(tmp_path / "run", hparams) + extra
    job, why = fused.parse_job(Command(
        [sys.executable, "-m", "domainbed.scripts.train", *argv], str(tmp_path / "run")))
    assert job is None and reason in why
    job, why = fused.parse_job(Command(
        [sys.executable, "-m", "domainbed.scripts.train", *_argv(tmp_path / "run", {})],
        str(tmp_path / "run")))
    assert job is not None and why is None


def test_sweep_passes_early_stopping_to_every_job(tmp_path, capsys):
    from domainbed.scripts import sweep
    common = ["--datasets", "Debug28", "--algorithms", "ERM", "--data_dir", str(tmp_path),
              "--output_dir", str(tmp_path / "sweep"), "--command_launcher", "dummy",
              "--n_trials", "1", "--n_hparams", "1", "--single_test_envs",
              "--skip_confirmation"]
    assert sweep.main(["launch", *common, "--early_stopping", "val_acc",
                       "--patience", "3"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines()
             if "Dummy launcher: " in line]
    assert len(lines) == 3
    assert all("--early_stopping val_acc" in line and "--patience 3" in line
               for line in lines)
    with pytest.raises(UserError, match="--patience needs --early_stopping"):
        sweep.main(["launch", *common, "--patience", "3"])
