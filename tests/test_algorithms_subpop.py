"""What carries each subpopulation-shift method: JTT up-weights the first stage's errors,
DFR retrains only the last layer on group-balanced held-out data, LfF's biased model gets
the generalized cross-entropy, LISA mixes within label or within attribute as its
hyperparameter says, CVaRDRO's weights concentrate on the worst alpha fraction; and the
training loop's hooks (stages in records, groups required)."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from domainbed import registry
from domainbed.algorithms.mixing import LISA
from domainbed.algorithms.reweighting import cvar_weights, generalized_cross_entropy
from domainbed.algorithms.two_stage import group_balanced_subset
from domainbed.datasets.base import TensorEnvironment
from oodutils.errors import UserError
from tests.builders import read_records
from tests.hardening_util import train_argv, train_steps, training_run
from tests.test_algorithms_registry import build, context_for, hparams_for, make_env, step


def test_jtt_upweights_first_stage_errors():
    algorithm, envs = build("JTT", (6,), n_steps=4, jtt_lambda=7.0)  # switch after 2 steps
    for expected in ("stage1", "stage1"):
        step(algorithm, envs)
        assert algorithm.stage() == expected
    stage1 = {k: v.clone() for k, v in algorithm.stage1_model.state_dict().items()}
    envs[0].y[:3] = 1 - envs[0].y[:3]  # noisy labels the first model gets wrong
    x = torch.cat([e.x for e in envs])
    y = torch.cat([e.y for e in envs])
    with torch.no_grad():
        wrong = algorithm.stage1_model.predict(x).argmax(1) != y
        expected = (F.cross_entropy(algorithm.stage2_model.predict(x), y, reduction="none")
                    * torch.where(wrong, 7.0, 1.0)).mean()
    assert 0 < wrong.sum() < len(y)  # both kinds present, so the weighting matters
    weights = algorithm.error_weights(x, y)
    assert torch.equal(weights, torch.where(wrong, 7.0, 1.0))
    out = step(algorithm, envs)
    assert algorithm.stage() == "stage2"
    assert out["loss"] == pytest.approx(expected.item(), rel=1e-6)
    for k, v in algorithm.stage1_model.state_dict().items():  # the first model is frozen
        assert torch.equal(v, stage1[k]), k
    with torch.no_grad():  # predictions now come from the second model
        assert torch.equal(algorithm.predict(x), algorithm.stage2_model.predict(x))


def test_dfr_retrains_only_last_layer_on_balanced_heldout():
    algorithm, envs = build("DFR", (6,), n_steps=4, n=16)
    heldout_x, heldout_y = algorithm.heldout
    _, _, groups = group_balanced_subset(
        [make_env(16, (6,), seed=10 + e) for e in range(2)], seed=0)
    counts = torch.bincount(groups)
    assert (counts == counts[counts > 0].min()).sum() == (counts > 0).sum()  # balanced
    holdout_rows = torch.cat([make_env(16, (6,), seed=10 + e).x for e in range(2)])
    assert all((holdout_rows == row).all(1).any() for row in heldout_x)  # held-out data only
    step(algorithm, envs)
    step(algorithm, envs)
    featurizer = {k: v.clone() for k, v in algorithm.stage1_model.featurizer.state_dict().items()}
    classifier = {k: v.clone() for k, v in algorithm.stage1_model.classifier.state_dict().items()}
    x, y = algorithm.stage2_batch(int(algorithm.update_count))
    with torch.no_grad():
        clf = algorithm.stage1_model.classifier
        expected = F.cross_entropy(clf(algorithm.stage1_model.featurizer(x)), y) + \
            algorithm.hparams["dfr_reg"] * clf.weight.abs().sum()
    garbage = [(torch.randn_like(e.x) * 100, 1 - e.y) for e in envs]  # training batches unused
    out = algorithm.update(garbage)
    assert algorithm.stage() == "stage2"
    assert out["loss"] == pytest.approx(expected.item(), rel=1e-6)
    for k, v in algorithm.stage1_model.featurizer.state_dict().items():
        assert torch.equal(v, featurizer[k]), k
    assert any(not torch.equal(v, classifier[k])
               for k, v in algorithm.stage1_model.classifier.state_dict().items())


def test_lff_biased_model_gets_generalized_cross_entropy():
    torch.manual_seed(0)
    logits = torch.randn(10, 3, requires_grad=True)
    y = torch.randint(0, 3, (10,))
    q = 0.7
    generalized_cross_entropy(logits, y, q).sum().backward()
    ours = logits.grad.clone()
    logits.grad = None
    p_y = torch.softmax(logits, 1).gather(1, y.unsqueeze(1)).squeeze(1)
    ((1 - p_y ** q) / q).sum().backward()  # the GCE of Zhang & Sabuncu (2018)
    torch.testing.assert_close(ours, q * logits.grad)  # LfF's code: q times its gradient
    algorithm, envs = build("LfF", (6,), n_steps=3, LfF_q=q)
    x = torch.cat([e.x for e in envs])
    y = torch.cat([e.y for e in envs])
    with torch.no_grad():
        expected = generalized_cross_entropy(algorithm.biased_network(x), y, q).mean()
    assert step(algorithm, envs)["loss_gce"] == pytest.approx(expected.item(), rel=1e-6)


def lisa_inputs():
    """x holds (label, attribute) in its first two coordinates."""
    y = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1] * 2)
    a = torch.tensor([0, 1, 0, 1, 0, 1, 0, 1] * 2)
    x = torch.stack([y.float(), a.float(), torch.arange(16).float()], 1)
    return x, F.one_hot(y, 2).float(), a


@pytest.mark.parametrize("within_label", [True, False])
def test_lisa_mixes_within_label_or_attribute(within_label):
    algorithm = LISA((3,), 2, 1, hparams_for("LISA", LISA_mixup_method="mixup"))
    algorithm.num_attributes = 2
    np.random.seed(0)
    torch.manual_seed(0)
    x, y, a = lisa_inputs()
    mixed_x, mixed_y = algorithm.selective_mix(within_label, x, y, a)
    assert len(mixed_x) == len(x)
    kept, mixed = (0, 1) if within_label else (1, 0)
    # the shared coordinate stays pure; the other one is a convex mix of two values
    assert set(mixed_x[:, kept].tolist()) <= {0.0, 1.0}
    assert ((mixed_x[:, mixed] > 0) & (mixed_x[:, mixed] < 1)).any()
    torch.testing.assert_close(mixed_y[:, 1], mixed_x[:, 0])  # soft label = mixed label
    torch.testing.assert_close(mixed_y.sum(1), torch.ones(len(x)))


@pytest.mark.parametrize("p_sel, within_label", [(1.0, True), (0.0, False)])
def test_lisa_selection_probability(monkeypatch, p_sel, within_label):
    algorithm, envs = build("LISA", (6,), n_steps=3, LISA_p_sel=p_sel)
    seen = []
    original = algorithm.selective_mix
    monkeypatch.setattr(algorithm, "selective_mix",
                        lambda w, *args: seen.append(w) or original(w, *args))
    for _ in range(3):
        step(algorithm, envs)
    assert seen == [within_label] * 3


def test_cvar_weights_concentrate_on_worst_fraction():
    losses = torch.tensor([0.5, 3.0, 1.0, 9.0, 2.0, 0.1, 7.0, 4.0, 0.2, 6.0])
    w = cvar_weights(losses, 0.3)
    assert w.sum().item() == pytest.approx(1.0)
    assert set(torch.nonzero(w).flatten().tolist()) == {3, 6, 9}  # the three largest
    torch.testing.assert_close(w[[3, 6, 9]], torch.full((3,), 1 / 3))
    w = cvar_weights(losses, 0.25)  # 2.5 examples: two full, half of the third
    torch.testing.assert_close(w[[3, 6, 9]], torch.tensor([0.4, 0.4, 0.2]))
    assert w.sum().item() == pytest.approx(1.0)
    algorithm, envs = build("CVaRDRO", (6,), n_steps=2, joint_dro_alpha=0.25, n=8)
    x = torch.cat([e.x for e in envs])
    y = torch.cat([e.y for e in envs])
    with torch.no_grad():
        per_example = F.cross_entropy(algorithm.predict(x), y, reduction="none")
    worst = per_example.sort(descending=True)[0][:4].mean()  # 25% of 16 examples
    assert step(algorithm, envs)["loss"] == pytest.approx(worst.item(), rel=1e-5)


# --- through the training loop ----------------------------------------------------------

def subpop_run(tmp_path, algorithm, dataset_cls=None, steps=4, overrides=None):
    """A Debug28 TrainingRun (MLP) with a checkpoint at every step."""
    overrides = {"batch_size": 8, "arch": "mlp", "mlp_width": 16, **(overrides or {})}
    out = tmp_path / algorithm
    argv = train_argv(out, algorithm=algorithm, steps=steps, freq=1, hparams=json.dumps(overrides))
    return training_run(argv, dataset_cls), out


@pytest.mark.parametrize("name", ["JTT", "CRT", "DFR"])
def test_two_stage_records_say_their_stage(tmp_path, name):
    run, out = subpop_run(tmp_path, name)
    balanced = []
    real_batches = run.minibatches.batches
    run.minibatches.batches = lambda s, group_balanced=False: (
        balanced.append(group_balanced) or real_batches(s, group_balanced))
    train_steps(run)
    stages = [r["stage"] for r in read_records(out)]
    assert stages == ["stage1", "stage1", "stage2", "stage2"]
    assert balanced == [False, False] + [name == "CRT"] * 2  # CRT: balanced in stage 2


def test_group_method_fails_clearly_without_groups(tmp_path):
    from domainbed.datasets.debug import Debug28

    class NoGroups(Debug28):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.datasets = [TensorEnvironment(e.x, e.y, e.ids) for e in self.datasets]

    with pytest.raises(UserError, match="needs group .* annotations"):
        subpop_run(tmp_path, "ReWeight", dataset_cls=NoGroups)
    run, _ = subpop_run(tmp_path, "ERM", dataset_cls=NoGroups)  # others are unaffected
    assert run.algorithm is not None


def test_group_batches_reach_the_algorithm(tmp_path):
    run, _ = subpop_run(tmp_path, "ReWeight")
    seen = []
    update = run.algorithm.update
    run.algorithm.update = lambda b, u=None, groups=None: seen.append(groups) or \
        update(b, u, groups=groups)
    run.train_step(0)
    batches = run.minibatches.batches(0)
    (groups,) = seen
    for (_, y), g in zip(batches, groups):
        assert torch.equal(g // 2, y)  # group = 2 * label + attribute on Debug28
    assert registry.get_algorithm_class("ReWeight").NEEDS_GROUPS


def test_group_weights_follow_training_group_sizes():
    envs = [make_env(40, (6,), seed=e) for e in range(2)]
    algorithm = registry.get_algorithm_class("ReWeight")((6,), 2, 2, hparams_for("ReWeight"))
    algorithm.prepare(context_for(envs, envs, 4))
    sizes = torch.bincount(torch.cat([torch.as_tensor(e.groups) for e in envs]),
                           minlength=4).double()
    expected = (1 / sizes) / (1 / sizes).sum() * 4
    torch.testing.assert_close(algorithm.weights_per_group, expected.float())


# --- MMD-AAE and ERDG: what each loss term is made of ----------------------------------

def test_mmd_aae_loss_is_the_weighted_sum_of_its_terms():
    from domainbed.algorithms.alignment import mmd_gaussian
    from domainbed.algorithms.autoencoder import AAE_GAMMAS, pairwise_mmd
    weights = dict(aae_cls_weight=1.5, aae_mmd_weight=2.0, aae_recon_weight=0.3,
                   aae_adv_weight=0.2)
    algorithm, envs = build("MMD_AAE", (6,), n_steps=2, **weights)
    out = step(algorithm, envs)
    expected = sum(weights[f"aae_{k}_weight"] * out[f"{k}_loss"]
                   for k in ("cls", "mmd", "recon", "adv"))
    assert out["loss"] == pytest.approx(expected, rel=1e-5)
    a, b = torch.randn(5, 3), torch.randn(7, 3) + 2
    assert float(pairwise_mmd([a, a])) == pytest.approx(0.0, abs=1e-6)
    assert float(pairwise_mmd([a, b])) == pytest.approx(float(mmd_gaussian(a, b, AAE_GAMMAS)))
    assert AAE_GAMMAS == (0.5, 0.1, 0.05)  # RBF bandwidths sigma^2 = 1, 5, 10


def test_erdg_entropy_term_uses_other_domains_only():
    algorithm, envs = build("ERDG", (6,), n_steps=2, num_domains=3)
    with torch.no_grad():
        features = [algorithm.featurizer(e.x) for e in envs]
        expected = np.mean([F.cross_entropy(head(features[j]), envs[j].y).item()
                            for k, head in enumerate(algorithm.domain_classifiers)
                            for j in range(3) if j != k])
        got = algorithm.cross_domain_loss(features, [(e.x, e.y) for e in envs])
    assert float(got) == pytest.approx(expected, rel=1e-6)
    before = {k: v.clone() for k, v in algorithm.domain_classifiers.state_dict().items()}
    step(algorithm, envs)
    assert any(not torch.equal(v, before[k])
               for k, v in algorithm.domain_classifiers.state_dict().items())
