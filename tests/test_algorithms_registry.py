"""Every registered algorithm, with no test edit when one is added: it builds on vector and
image inputs (and on the Debug28 dataset), takes finite steps, predicts logits of the right
shape, draws its hyperparameters deterministically inside their declared ranges, learns a
toy task; and randomized algorithms resume to identical records."""
import copy as copy_module
import json
import random

import numpy as np
import pytest
import torch

from domainbed import hparams as hp
from domainbed import registry, run_hparams
from domainbed.algorithms.base import TrainingContext
from domainbed.datasets.base import TensorEnvironment
from oodutils.errors import UserError
from tests.builders import read_records
from tests.hardening_util import comparable, train_argv, train_steps, training_run

# The project's own algorithms: installed plug-ins are domainbed-check-plugins' business.
NAMES = registry.ALGORITHMS.builtin_names()
LEGACY_MODULES = {"domainbed.algorithms.erm", "domainbed.algorithms.irm",
                  "domainbed.algorithms.dro", "domainbed.algorithms.alignment",
                  "domainbed.algorithms.vrex", "domainbed.algorithms.base"}
# Long schedules shortened so that a few steps reach every phase of every algorithm.
FAST = {"lr": 1e-2, "linear_lr": 1e-2, "linear_steps": 2, "rdm_lr": 1e-2, "eqrm_lr": 1e-2,
        "irm_penalty_anneal_iters": 2, "vrex_penalty_anneal_iters": 2,
        "ib_penalty_anneal_iters": 2, "rdm_penalty_anneal_iters": 2, "eqrm_burnin_iters": 2,
        "penalty_anneal_iters": 2, "iters": 2, "mlp_width": 32, "mlp_depth": 3,
        "d_steps_per_g": 2, "batch_size": 8, "erdg_lr_t": 1e-2, "erdg_lr_tprime": 1e-2,
        "erdg_lr_d": 1e-2}


class SmallImages:
    SMALL_IMAGES = True
    HPARAMS = {}


class LargeImages:
    SMALL_IMAGES = False
    HPARAMS = {}


def hparams_for(name, dataset_cls=SmallImages, **extra):
    space = run_hparams.hparam_space(registry.get_algorithm_class(name), dataset_cls)
    h = hp.draw(space, 0)
    h.update({k: v for k, v in FAST.items() if k in h})
    h.update(extra)
    return h


def make_env(n, input_shape, seed, shift=0.0):
    """A learnable environment: the label is the sign of the first input coordinate; a
    random binary attribute gives 4 groups (group = 2 * label + attribute)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, *input_shape, generator=g)
    y = (x.flatten(1)[:, 0] + shift > 0).long()
    attr = torch.randint(0, 2, (n,), generator=g)
    x.flatten(1)[:, 0] += 1.5 * (2 * y - 1).float()
    return TensorEnvironment(x, y, np.arange(n) + 1000 * seed, (2 * y + attr).numpy())


def context_for(envs, holdout, n_steps):
    return TrainingContext(train_splits=envs, holdout_splits=holdout, num_groups=4,
                           n_steps=n_steps, seed=0, device="cpu")


def build(name, input_shape, n_steps, num_domains=2, n=8, **extra):
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    envs = [make_env(n, input_shape, seed=e, shift=0.2 * e) for e in range(num_domains)]
    holdout = [make_env(n, input_shape, seed=10 + e) for e in range(num_domains)]
    cls = registry.get_algorithm_class(name)
    algorithm = cls(input_shape, 2, num_domains, hparams_for(name, **extra))
    algorithm.prepare(context_for(envs, holdout, n_steps))
    return algorithm, envs


def step(algorithm, envs, balanced=False):
    batches = [(e.x, e.y) for e in envs]
    if getattr(algorithm, "NEEDS_GROUPS", False):
        return algorithm.update(batches, None,
                                groups=[torch.as_tensor(e.groups) for e in envs])
    return algorithm.update(batches, None)


def needs_images(name):
    return getattr(registry.get_algorithm_class(name), "NEEDS_IMAGES", False)


def debug28_envs(n):
    """The first n examples of each training environment of the Debug28 dataset."""
    from domainbed.datasets.debug import Debug28
    dataset = Debug28(None, [0], {})
    return [TensorEnvironment(env.x[:n], env.y[:n], env.ids[:n], env.groups[:n])
            for env in list(dataset)[1:]]


def check_steps_and_predict(algorithm, envs, n_steps):
    for _ in range(n_steps):
        out = step(algorithm, envs)
        assert out and all(np.isfinite(float(v)) for v in out.values()), out
    algorithm.eval()
    with torch.no_grad():
        logits = algorithm.predict(envs[0].x[:5])
    algorithm.train()
    assert logits.shape == (5, 2) and torch.isfinite(logits).all()


@pytest.mark.parametrize("name", NAMES)
def test_builds_steps_and_predicts_on_vectors(name):
    if needs_images(name):
        with pytest.raises(UserError):
            build(name, (6,), n_steps=4)
        return
    algorithm, envs = build(name, (6,), n_steps=3, n=6)
    check_steps_and_predict(algorithm, envs, 3)


@pytest.mark.parametrize("name", NAMES)
def test_builds_steps_and_predicts_on_debug28(name):
    """The Debug28 dataset's images (MNIST_CNN featurizer), its groups, few examples."""
    torch.manual_seed(0)
    envs = debug28_envs(6)
    algorithm = registry.get_algorithm_class(name)((3, 28, 28), 2, 2, hparams_for(name))
    algorithm.prepare(context_for(envs, envs, n_steps=2))
    check_steps_and_predict(algorithm, envs, 2)


def own_names(cls, dataset_cls):
    """Hyperparameters that an algorithm module outside the legacy ones declares."""
    names = set()
    for klass in cls.__mro__:
        if klass.__module__ not in LEGACY_MODULES and klass.__dict__.get("HPARAMS"):
            names.update(klass.__dict__["HPARAMS"])
    return names


def within(decl, value):
    if decl.choices is not None:
        return value in decl.choices
    ok = True
    if decl.low is not None:
        ok &= value >= decl.low
    if decl.high is not None:
        ok &= value <= decl.high
    return ok


@pytest.mark.parametrize("name", NAMES)
def test_hparam_draws_deterministic_and_in_range(name):
    cls = registry.get_algorithm_class(name)
    for dataset_cls in (SmallImages, LargeImages):
        space = run_hparams.hparam_space(cls, dataset_cls)
        for name_ in own_names(cls, dataset_cls):
            decl = space[name_]
            assert decl.choices is not None or decl.low is not None or \
                decl.high is not None, f"{name}: {name_} declares no valid range"
        for seed in range(4):
            drawn = hp.draw(space, seed)
            assert drawn == hp.draw(space, seed)
            json.dumps(drawn)  # plain Python values
            for key, value in drawn.items():
                assert within(space[key], value), (name, key, value, seed)


# Penalty weights at the low end of their search ranges: at DomainBed's defaults (e.g.
# IGA's 1000, IB_IRM's 100) 30 steps are too few to learn anything on any data.
LEARNABLE = {"irm_lambda": 1.0, "ib_lambda": 1.0, "penalty": 10.0, "tau": 0.6,
             "vrex_lambda": 1.0, "n_meta_test": 1}


@pytest.mark.parametrize("name", NAMES)
def test_learns_a_toy_task(name):
    shape = (3, 8, 8) if needs_images(name) else (6,)
    extra = {"arch": "mlp"} if needs_images(name) else {}
    space = run_hparams.hparam_space(registry.get_algorithm_class(name), SmallImages)
    extra.update({k: v for k, v in LEARNABLE.items() if k in space})
    n_steps = 30
    algorithm, envs = build(name, shape, n_steps=n_steps, num_domains=3, n=16, **extra)
    for _ in range(n_steps):
        step(algorithm, envs)
    algorithm.eval()
    with torch.no_grad():
        accuracy = np.mean([(algorithm.predict(e.x).argmax(1) == e.y).float().mean().item()
                            for e in envs])
    assert accuracy > 0.7, accuracy


@pytest.mark.parametrize("name", [n for n in NAMES
                                  if getattr(registry.get_algorithm_class(n),
                                             "NEEDS_GROUPS", False)])
def test_group_methods_refuse_data_without_groups(name):
    env = make_env(8, (6,), 0)
    bare = TensorEnvironment(env.x, env.y, env.ids)
    algorithm = registry.get_algorithm_class(name)((6,), 2, 1, hparams_for(name))
    with pytest.raises(UserError, match="group"):
        algorithm.prepare(context_for([bare], [bare], 4))


# --- resume: an interrupted run continues to the same records ---------------------------

RESUME_HPARAMS = {"batch_size": 8, "arch": "mlp", "mlp_width": 32}


def train_in_process(out, algorithm, steps, stop_after=None):
    """Train with the CLI's arguments; with stop_after, drop the run right after that step
    (a checkpoint) plus one more (lost) step, as a kill would."""
    run = training_run(train_argv(out, algorithm=algorithm, steps=steps,
                                  hparams=json.dumps(RESUME_HPARAMS)))
    train_steps(run, stop_after, lose_next_step=True)


# RSC and SagNet draw from torch's generator in update(), Mixup from numpy's (numpy.random.beta)
@pytest.mark.parametrize("name", ["RSC", "SagNet", "Mixup"])
def test_resume_gives_identical_records(tmp_path, name):
    check_resume(tmp_path, name)


def check_resume(tmp_path, name):
    steps = 5
    train_in_process(tmp_path / "reference", name, steps)
    out = tmp_path / "interrupted"
    train_in_process(out, name, steps, stop_after=2)
    torch.manual_seed(1234)  # a new process would start from other generator states
    np.random.seed(1234)
    random.seed(1234)
    train_in_process(out, name, steps)
    assert (out / "done").exists()
    assert comparable(read_records(out)) == comparable(read_records(tmp_path / "reference"))


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_round_trip_continues_identically(name):
    """Two more steps after loading a copy's state_dict (plus its optimizers' states, as the
    resume file holds them) equal two more steps of the original."""
    from domainbed.training.resume import optimizer_attributes
    shape, extra = ((3, 8, 8), {"arch": "mlp"}) if needs_images(name) else ((6,), {})
    algorithm, envs = build(name, shape, n_steps=4, n=6, **extra)
    step(algorithm, envs)
    state = copy_module.deepcopy(algorithm.state_dict())
    optimizers = {k: copy_module.deepcopy(o.state_dict())
                  for k, o in optimizer_attributes(algorithm).items()}
    copy, _ = build(name, shape, n_steps=4, n=6, **extra)
    copy.load_state_dict(state)
    for k, o in optimizer_attributes(copy).items():
        o.load_state_dict(optimizers[k])
    rng = torch.get_rng_state(), np.random.get_state(), random.getstate()
    expected = [step(algorithm, envs) for _ in range(2)]
    torch.set_rng_state(rng[0])
    np.random.set_state(rng[1])
    random.setstate(rng[2])
    got = [step(copy, envs) for _ in range(2)]
    assert got == expected
