"""SubpopBench's attribute-unknown setting: selection by label-only scores of the val
environment, and VanillaCRT (classifier retraining without group labels)."""
import pytest
import torch
import torch.nn.functional as F

from domainbed.results import model_selection as ms
from domainbed.results.report import build_report
from tests.builders import record as make_record
from tests.builders import run_args
from tests.test_algorithms_registry import build, step


def record(hparams_seed, step_, val_wca, val_wga, test_wga, test_acc):
    """A SubpopBench-framed run (environments train, val, test; val and test held out)."""
    args = run_args(test_envs=[1, 2], hparams_seed=hparams_seed,
                    env_names=["train", "val", "test"])
    return make_record(step_, args, {"lr": hparams_seed}, {0: (0.9, 0.9)},
                       run_dir=f"r{hparams_seed}", env1_in_acc=0.8,
                       env1_in_worst_class_acc=val_wca, env1_in_wga=val_wga,
                       env2_in_wga=test_wga, env2_in_acc=test_acc, env1_in_acc_g0=0.5,
                       env1_in_balanced_acc=val_wca + 0.1, env1_in_macro_f1=val_wca)


RECORDS = [record(1, 10, val_wca=0.70, val_wga=0.40, test_wga=0.30, test_acc=0.91),
           record(1, 20, val_wca=0.60, val_wga=0.45, test_wga=0.35, test_acc=0.92),
           record(2, 10, val_wca=0.65, val_wga=0.60, test_wga=0.55, test_acc=0.85)]


def test_worst_class_selection_needs_no_group_labels():
    chosen = ms.select(RECORDS, ms.ValWorstClassSelectionMethod).iloc[0]
    # best val worst-class accuracy: hparams 1 at step 10, whatever the groups say
    assert (chosen.hparams_seed, chosen.step) == (1, 10)
    assert (chosen.test_acc, chosen.test_avg_acc) == (0.30, 0.91)
    # with group labels (SubpopBench's default) the choice differs
    grouped = ms.select(RECORDS, ms.ValWorstGroupSelectionMethod).iloc[0]
    assert (grouped.hparams_seed, grouped.test_acc) == (2, 0.55)
    average = ms.select(RECORDS, ms.ValAverageSelectionMethod)
    assert len(average) == 1 and average.iloc[0].val_acc == 0.8


@pytest.mark.parametrize("key", ["val_avg", "val_worst_class", "val_balanced",
                                 "val_macro_f1"])
def test_each_label_only_method_is_a_collect_results_section(key):
    method = ms.get_selection_method(key)
    report = build_report(RECORDS, [method])
    (section,) = report.sections
    assert section.key == key
    assert [t.heading for t in section.tables] == ["Test worst-group accuracy",
                                                   "Test average accuracy"]


def test_vanilla_crt_retrains_only_the_classifier_with_plain_batches():
    algorithm, envs = build("VanillaCRT", (6,), n_steps=4, n=16)
    assert not getattr(algorithm, "NEEDS_GROUPS", False)
    assert not any(algorithm.group_balanced_batches(s) for s in range(4))
    step(algorithm, envs)
    step(algorithm, envs)
    featurizer = {k: v.clone() for k, v in algorithm.stage1_model.featurizer.state_dict().items()}
    classifier = {k: v.clone() for k, v in algorithm.stage1_model.classifier.state_dict().items()}
    x = torch.cat([e.x for e in envs])
    y = torch.cat([e.y for e in envs])
    with torch.no_grad():
        expected = F.cross_entropy(
            algorithm.stage1_model.classifier(algorithm.stage1_model.featurizer(x)), y)
    out = algorithm.update([(e.x, e.y) for e in envs], None)
    assert algorithm.stage() == "stage2"
    assert out["loss"] == pytest.approx(expected.item(), rel=1e-6)
    for k, v in algorithm.stage1_model.featurizer.state_dict().items():
        assert torch.equal(v, featurizer[k]), k
    assert any(not torch.equal(v, classifier[k])
               for k, v in algorithm.stage1_model.classifier.state_dict().items())
    assert isinstance(algorithm.optimizer_stage2, torch.optim.SGD)
