"""ERM, IRM, GroupDRO, CORAL, MMD and VREx: DomainBed's golden outputs, training smoke tests,
registry and hyperparameter declarations."""
import json

import numpy as np
import pytest
import torch

from domainbed import hparams as hp
from domainbed import registry, run_hparams
from domainbed.algorithms.alignment import GAUSSIAN_GAMMAS, mean_cov_distance, mmd_gaussian
from domainbed.algorithms.irm import irm_penalty
from tests.requirements import need_data
from tests.test_algorithms_golden import GOLDEN_DIR
from tests.test_hparams import DOMAINBED_DRAWS

SIX = ["ERM", "IRM", "GroupDRO", "CORAL", "MMD", "VREx"]
GOLDEN = GOLDEN_DIR / "golden.json"
TOL = dict(rtol=1e-5, atol=1e-5)
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def golden():
    with open(need_data(GOLDEN, "DomainBed's golden outputs")) as f:
        return json.load(f)


def tensor(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


def small_hparams(**extra):
    """Hyperparameters for an MLP on 1-D inputs, enough for every algorithm here."""
    h = {"lr": 1e-2, "weight_decay": 0.0, "batch_size": 16, "nonlinear_classifier": False,
         "mlp_width": 16, "mlp_depth": 3, "mlp_dropout": 0.0,
         "irm_lambda": 1e2, "irm_penalty_anneal_iters": 2, "groupdro_eta": 1e-2,
         "mmd_gamma": 1.0, "vrex_lambda": 1e1, "vrex_penalty_anneal_iters": 2}
    h.update(extra)
    return h


# --- golden penalties -------------------------------------------------------------------

def test_irm_penalty_matches_domainbed(golden):
    case = golden["penalties"]["irm_penalty"]
    value = irm_penalty(tensor(case["logits"]), tensor(case["y"], torch.long))
    assert value.item() == pytest.approx(case["value"], rel=1e-5, abs=1e-7)


def test_mmd_gaussian_matches_domainbed(golden):
    case = golden["penalties"]["mmd_gaussian"]
    assert tuple(case["gaussian_gammas"]) == GAUSSIAN_GAMMAS
    value = mmd_gaussian(tensor(case["x"]), tensor(case["y"]))
    assert value.item() == pytest.approx(case["value"], rel=1e-5, abs=1e-6)


def test_mean_cov_matches_domainbed(golden):
    case = golden["penalties"]["mmd_mean_cov"]
    value = mean_cov_distance(tensor(case["x"]), tensor(case["y"]))
    assert value.item() == pytest.approx(case["value"], rel=1e-5, abs=1e-6)


# --- golden updates ---------------------------------------------------------------------

def build_from_golden(name, case):
    """Our algorithm with DomainBed's init_state loaded (names are DomainBed's own)."""
    x0 = case["minibatches"][0][0][0]
    num_domains = len(case["minibatches"][0])
    algorithm = registry.get_algorithm_class(name)((len(x0[0]),), 2, num_domains,
                                                   dict(case["hparams"]))
    state = {key: tensor(values).reshape(shape) for key, shape, values in case["init_state"]}
    result = algorithm.load_state_dict(state, strict=False)
    assert not result.unexpected_keys
    # the golden state lists float tensors only; our integer step counter starts at 0 anyway
    assert set(result.missing_keys) <= {"update_count"}
    return algorithm


@pytest.mark.parametrize("name", SIX)
def test_updates_match_domainbed(golden, name):
    case = golden["updates"][name]
    torch.manual_seed(0)
    algorithm = build_from_golden(name, case)
    for minibatches, expected in zip(case["minibatches"], case["update_outputs"]):
        batch = [(tensor(x), tensor(y, torch.long)) for x, y in minibatches]
        out = algorithm.update(batch)
        assert set(out) == set(expected)
        for key, value in expected.items():
            assert isinstance(out[key], float)
            assert out[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    with torch.no_grad():
        logits = algorithm.predict(tensor(case["probe_x"]))
    np.testing.assert_allclose(logits.numpy(), np.array(case["predict_after"]), **TOL)


# --- behaviour on random data -----------------------------------------------------------

def random_minibatches(num_domains=3, n=16, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(d, generator=g)
    out = []
    for e in range(num_domains):
        x = torch.randn(n, d, generator=g) + 0.3 * e
        out.append((x, (x @ w > 0).long()))
    return out


@pytest.mark.parametrize("name", SIX)
def test_trains_on_random_tensors(name):
    torch.manual_seed(0)
    algorithm = registry.get_algorithm_class(name)((4,), 2, 3, small_hparams())
    for step in range(4):
        out = algorithm.update(random_minibatches(seed=step), unlabeled=None)
        assert out and all(isinstance(v, float) and np.isfinite(v) for v in out.values())
    assert algorithm.predict(torch.randn(5, 4)).shape == (5, 2)


def test_erm_loss_decreases():
    torch.manual_seed(0)
    algorithm = registry.get_algorithm_class("ERM")((4,), 2, 3, small_hparams())
    batch = random_minibatches()
    losses = [algorithm.update(batch)["loss"] for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("name,prefix", [("IRM", "irm"), ("VREx", "vrex")])
def test_penalty_anneal_resets_optimizer(name, prefix):
    torch.manual_seed(0)
    algorithm = registry.get_algorithm_class(name)((4,), 2, 3, small_hparams())
    optimizers = []
    for _ in range(4):
        optimizers.append(algorithm.optimizer)
        algorithm.update(random_minibatches())
    optimizers.append(algorithm.optimizer)
    # anneal_iters = 2: the update with update_count == 2 (the third) builds a fresh Adam
    assert optimizers[0] is optimizers[1] is optimizers[2]
    assert optimizers[3] is not optimizers[2] and optimizers[3] is optimizers[4]
    from domainbed.algorithms.base import hparam_tensor
    from domainbed.algorithms.irm import annealed_weight
    hp = {k: hparam_tensor([small_hparams()[k]])[0] for k in algorithm.FUSED.member_hparams}
    weight = annealed_weight(prefix, hp, {"update_count": algorithm.update_count})
    assert float(weight) == pytest.approx(small_hparams()[f"{prefix}_lambda"])
    state = algorithm.state_dict()
    assert state["update_count"].tolist() == [4]
    fresh = registry.get_algorithm_class(name)((4,), 2, 3, small_hparams())
    fresh.load_state_dict(state)
    assert int(fresh.update_count.item()) == 4


def test_groupdro_weights_are_exponentiated_losses():
    torch.manual_seed(0)
    eta = 1.0
    algorithm = registry.get_algorithm_class("GroupDRO")((4,), 2, 3,
                                                         small_hparams(groupdro_eta=eta))
    batch = random_minibatches()
    with torch.no_grad():
        losses = torch.stack([torch.nn.functional.cross_entropy(algorithm.predict(x), y)
                              for x, y in batch])
    out = algorithm.update(batch)
    q = algorithm.state_dict()["q"]
    torch.testing.assert_close(q, torch.softmax(eta * losses, 0))
    assert out["loss"] == pytest.approx(torch.dot(losses, q).item(), rel=1e-5)
    assert int(q.argmax()) == int(losses.argmax())


def test_groupdro_loads_domainbed_empty_q():
    """DomainBed saves an empty q before the first update, and a length-n q after."""
    a = registry.get_algorithm_class("GroupDRO")((4,), 2, 3, small_hparams())
    state = a.state_dict()
    state["q"] = torch.tensor([])
    a.load_state_dict(state)
    assert a.update(random_minibatches())["loss"] > 0 and a.q.shape == (3,)
    b = registry.get_algorithm_class("GroupDRO")((4,), 2, 3, small_hparams())
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(b.q, a.q)


# --- registry and hyperparameters -------------------------------------------------------

def test_all_six_registered():
    names = registry.ALGORITHMS.names()
    for name in SIX:
        assert name in names
        assert registry.get_algorithm_class(name).registry_name == name


class FakeSmallDataset:
    """A stand-in for ColoredMNIST (SMALL_IMAGES) while the dataset registry fills up."""
    SMALL_IMAGES = True
    HPARAMS = {}


def small_dataset_name(monkeypatch):
    try:
        registry.get_dataset_class("ColoredMNIST")
        return "ColoredMNIST"
    except Exception:
        real = registry.get_dataset_class
        monkeypatch.setattr(registry, "get_dataset_class",
                            lambda n: FakeSmallDataset if n == "FakeSmall" else real(n))
        return "FakeSmall"


EXPECTED_DEFAULTS = {
    "IRM": {"irm_lambda": 1e2, "irm_penalty_anneal_iters": 500},
    "GroupDRO": {"groupdro_eta": 1e-2},
    "MMD": {"mmd_gamma": 1.0},
    "CORAL": {"mmd_gamma": 1.0},
    "VREx": {"vrex_lambda": 1e1, "vrex_penalty_anneal_iters": 500},
}


@pytest.mark.parametrize("name", SIX)
def test_declared_defaults_match_domainbed(name):
    space = hp.declared_space(registry.get_algorithm_class(name), FakeSmallDataset)
    defaults = {k: h.default for k, h in space.items()}
    assert defaults["lr"] == 1e-3 and defaults["batch_size"] == 64
    for key, value in EXPECTED_DEFAULTS.get(name, {}).items():
        assert defaults[key] == value


def test_irm_hparams_resolve(monkeypatch):
    dataset = small_dataset_name(monkeypatch)
    default = run_hparams.resolve("IRM", dataset, hparams_seed=0, trial_seed=0)
    assert default["irm_lambda"] == 1e2 and default["irm_penalty_anneal_iters"] == 500
    assert default["lr"] == 1e-3
    drawn = run_hparams.resolve("IRM", dataset, hparams_seed=3, trial_seed=1)
    assert 10 ** -1 <= drawn["irm_lambda"] <= 10 ** 5
    assert isinstance(drawn["irm_penalty_anneal_iters"], int)
    assert 1 <= drawn["irm_penalty_anneal_iters"] <= 10 ** 4
    # what DomainBed's own random_hparams gives IRM on a small-image dataset for (3, 1)
    expected = DOMAINBED_DRAWS[("IRM", "ColoredMNIST", 3, 1)]
    assert drawn["irm_lambda"] == pytest.approx(expected["irm_lambda"], rel=1e-12)
    assert drawn["irm_penalty_anneal_iters"] == expected["irm_penalty_anneal_iters"]
    assert drawn == run_hparams.resolve("IRM", dataset, hparams_seed=3, trial_seed=1)
    over = run_hparams.resolve("IRM", dataset, overrides={"irm_lambda": 5.0})
    assert over["irm_lambda"] == 5.0
