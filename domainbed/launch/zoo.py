"""Drawing a diverse model zoo of small-image runs (accuracy-on-the-line studies): each
run's train arguments are a pure function of (dataset, run index, seed), so a bigger zoo
extends a smaller one. A linear-probe zoo (`draw_probe_zoo`) instead trains ERM heads on
one pretrained backbone's cached features (extracted once for the whole zoo)."""
import json
from typing import Any

import numpy as np

from domainbed.hparams import seed_hash
from domainbed.registry import get_algorithm_class, get_dataset_class
from domainbed.run_hparams import hparam_space

# The zoo's architecture mix: (arch, share, hparam overrides). The MLP dominates because
# its step costs a small fraction of an MNIST_CNN step on a CPU (scripts/bench_zoo.py
# measures both), so a zoo of mostly MLPs trains many more models in the same time. A few
# CNNs and small ResNets keep the architecture axis of the zoo.
ZOO_ARCHS: tuple[tuple[str, float, dict[str, Any]], ...] = (
    ("mlp", 0.96, {"mlp_width": (64, 128, 256), "mlp_depth": (3,)}),
    ("mnist_cnn", 0.02, {}),
    ("resnet_small", 0.02, {}),
)
ZOO_ALGORITHMS = ("ERM", "ERM", "IRM", "VREx", "GroupDRO", "CORAL")


def draw_zoo(dataset: Any, n_runs: Any, data_dir: str, steps: Any, checkpoint_freq: int,
             eval_splits: Any, seed: int = 0, test_envs: Any = None, archs: Any = ZOO_ARCHS) -> Any:
    """The train arguments of `n_runs` runs: leave-one-environment-out test envs in turn,
    an algorithm, an architecture and its size, a batch size, a random hyperparameter
    seed (learning rate, weight decay, dropout, penalty weights) and a training seed,
    each a pure function of (dataset, run index, seed), so a bigger zoo extends a smaller
    one. Run i's arguments never depend on n_runs."""

    n_envs = len(get_dataset_class(dataset).ENVIRONMENTS)
    test_envs = list(range(n_envs)) if test_envs is None else list(test_envs)
    shares = np.array([a[1] for a in archs], dtype=float)
    runs = []
    for i in range(n_runs):
        rng = np.random.RandomState(seed_hash("zoo", dataset, seed, i))
        arch, _, sizes = archs[rng.choice(len(archs), p=shares / shares.sum())]
        # learning rates that train within a few hundred steps (DomainBed's small-image
        # range reaches 3e-5, which leaves a short run near chance on its training envs)
        fixed = {"arch": arch, "batch_size": int(rng.choice([32, 64, 128])),
                 "lr": float(10 ** rng.uniform(-3.3, -2.5))}
        for name, values in sizes.items():
            fixed[name] = int(rng.choice(values))
        algorithm = str(ZOO_ALGORITHMS[rng.randint(len(ZOO_ALGORITHMS))])
        # penalties switch on within the run, not after DomainBed's 500-step warm-up
        fixed["irm_penalty_anneal_iters"] = fixed["vrex_penalty_anneal_iters"] = \
            int(rng.randint(0, max(1, steps // 2)))
        runs.append({
            "dataset": dataset, "algorithm": algorithm,
            "test_envs": [test_envs[i % len(test_envs)]], "holdout_fraction": 0.2,
            "hparams_seed": i + 1, "trial_seed": 0, "data_dir": data_dir,
            "task": "domain_generalization",
            "seed": seed_hash("zoo-seed", dataset, seed, i),
            "steps": steps, "checkpoint_freq": checkpoint_freq,
            "hparams": _hparams_json(dataset, algorithm, fixed), "eval_splits": list(eval_splits),
            "num_threads": 1, "skip_model_save": True,
        })
    return runs


def _hparams_json(dataset: Any, algorithm: Any, fixed: Any) -> Any:
    """Only the names the algorithm declares (others would be refused)."""

    space = hparam_space(get_algorithm_class(algorithm), get_dataset_class(dataset))
    return json.dumps({k: v for k, v in sorted(fixed.items()) if k in space}, sort_keys=True)


# A probe zoo's diversity: learning rate, weight decay, batch size and seed of each head
# (its features are fixed), and every checkpoint of each run.
PROBE_BATCH_SIZES = (32, 64, 128)


def draw_probe_zoo(dataset: Any, n_runs: Any, data_dir: str, steps: Any, checkpoint_freq: int,
                   eval_splits: Any, backbone: Any, seed: int = 0, test_envs: Any = None) -> Any:
    """The train arguments of `n_runs` ERM linear probes on `backbone`'s pretrained
    features: leave-one-environment-out test envs in turn, a learning rate (log-uniform
    1e-4..3e-2), a weight decay (0, or log-uniform 1e-6..1e-2), a batch size and a
    training seed, each a pure function of (dataset, backbone, run index, seed)."""

    n_envs = len(get_dataset_class(dataset).ENVIRONMENTS)
    test_envs = list(range(n_envs)) if test_envs is None else list(test_envs)
    runs = []
    for i in range(n_runs):
        rng = np.random.RandomState(seed_hash("probe-zoo", dataset, backbone, seed, i))
        decay = float(10 ** rng.uniform(-6, -2)) if rng.rand() < 0.5 else 0.0
        fixed = {"arch": "resnet", "backbone": backbone, "pretrained": True,
                 "transfer": "linear_probe", "data_augmentation": False,
                 "resnet_dropout": 0.0, "nonlinear_classifier": False,   # a linear head
                 "batch_size": int(rng.choice(PROBE_BATCH_SIZES)),
                 "lr": float(10 ** rng.uniform(-4, -1.5)), "weight_decay": decay}
        runs.append({   # hparams_seed 0: every other hyperparameter at its default
            "dataset": dataset, "algorithm": "ERM",
            "test_envs": [test_envs[i % len(test_envs)]], "holdout_fraction": 0.2,
            "hparams_seed": 0, "trial_seed": 0, "data_dir": data_dir,
            "task": "domain_generalization",
            "seed": seed_hash("probe-zoo-seed", dataset, backbone, seed, i),
            "steps": steps, "checkpoint_freq": checkpoint_freq,
            "hparams": _hparams_json(dataset, "ERM", fixed), "eval_splits": list(eval_splits),
            "num_threads": 1, "skip_model_save": True,
        })
    return runs
