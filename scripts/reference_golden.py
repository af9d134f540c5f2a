"""Golden outputs of DomainBed's own algorithms, produced by running DomainBed's code.

`reference_data.py golden|zoo` calls these with DomainBed's source tree importable as
`domainbed` (a checkout at DOMAINBED_COMMIT). Nothing here imports this project: the
values must come from DomainBed alone, so that our algorithms can be tested against them.
The protocols are described in tests/data/domainbed_golden/README.md.
"""
import base64
import contextlib
import json
import platform
import random

import numpy as np
import torch

DOMAINBED_COMMIT = "b93c22a1cfc3b2428398272c1a116c8de1f4139e"
MLP_OVERRIDES = {"mlp_width": 8, "mlp_depth": 3, "mlp_dropout": 0.0,
                 "nonlinear_classifier": False}
N_UPDATES, N_ENVS, BATCH = 3, 2, 8

# ---------------------------------------------------------------- shared helpers


def state_entries(module, seen=None):
    """[name, shape, flat values] for each floating-point tensor of a state_dict, in order.

    With `seen` (a dict data_ptr -> first name), a tensor already listed is left out and
    its name is recorded as an alias instead (returned second)."""
    entries, aliases = [], {}
    for name, tensor in module.state_dict().items():
        if not tensor.dtype.is_floating_point:
            continue
        if seen is not None:
            key = tensor.data_ptr()
            if key in seen:
                aliases[name] = seen[key]
                continue
            seen[key] = name
        entries.append([name, list(tensor.shape), tensor.flatten().tolist()])
    return entries, aliases


def scalar(value):
    """A tensor or number as a Python float."""
    return float(value.detach()) if isinstance(value, torch.Tensor) else float(value)


def floats(outputs):
    """An update() result as plain floats (tensors and numbers alike)."""
    return {key: scalar(value) for key, value in outputs.items()}


def seed_all(seed):
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def default_hparams(algorithm, overrides):
    from domainbed import hparams_registry
    hparams = hparams_registry.default_hparams(algorithm, "ColoredMNIST")
    hparams.update(overrides)
    return hparams


def predict_like_domainbed(algorithm, x):
    """predict() as DomainBed's misc.accuracy calls it: eval mode, no grad, then train mode."""
    algorithm.eval()
    with torch.no_grad():
        logits = algorithm.predict(x)
    algorithm.train()
    return logits


def dumps(document):
    """DomainBed-style compact JSON: json.dumps defaults, no trailing newline."""
    return json.dumps(document)


# ---------------------------------------------------------------- golden.json (six algorithms)

GOLDEN_SIX = ["ERM", "IRM", "GroupDRO", "CORAL", "MMD", "VREx"]
GOLDEN_ANNEAL = {"IRM": {"irm_penalty_anneal_iters": 1}, "VREx": {"vrex_penalty_anneal_iters": 1}}
GOLDEN_INIT_SEED, GOLDEN_DATA_SEED = 123, 0
GOLDEN_GAMMAS = [0.001, 0.01, 0.1, 1, 10, 100, 1000]


def golden_six():
    """golden.json: one torch stream (seed 0) draws every input in order; each algorithm is
    built under torch.manual_seed(123) in a forked RNG, so the stream goes on undisturbed."""
    from domainbed import algorithms
    torch.manual_seed(GOLDEN_DATA_SEED)
    logits, labels = torch.randn(16, 2), torch.randint(0, 2, (16,))
    mmd_x, mmd_y = torch.randn(12, 5), torch.randn(10, 5) * 1.5 + 0.3
    minibatches = [[(torch.randn(BATCH, 4), torch.randint(0, 2, (BATCH,)))
                    for _ in range(N_ENVS)] for _ in range(N_UPDATES)]
    hparams = {name: default_hparams(name, {**MLP_OVERRIDES, **GOLDEN_ANNEAL.get(name, {})})
               for name in GOLDEN_SIX}
    with torch.random.fork_rng():   # building them draws weights; the input stream goes on
        mmd = algorithms.MMD((4,), 2, 2, hparams["MMD"])
        coral = algorithms.CORAL((4,), 2, 2, hparams["CORAL"])
    penalties = {
        "irm_penalty": {"logits": logits.tolist(), "y": labels.tolist(),
                        "value": scalar(algorithms.IRM._irm_penalty(logits, labels))},
        "mmd_gaussian": {"x": mmd_x.tolist(), "y": mmd_y.tolist(),
                         "value": scalar(mmd.mmd(mmd_x, mmd_y)), "gaussian_gammas": GOLDEN_GAMMAS},
        "mmd_mean_cov": {"x": mmd_x.tolist(), "y": mmd_y.tolist(),
                         "value": scalar(coral.mmd(mmd_x, mmd_y)), "gaussian_gammas": None},
    }
    updates = {}
    for name in GOLDEN_SIX:
        probe_x = torch.randn(6, 4)
        with torch.random.fork_rng():
            torch.manual_seed(GOLDEN_INIT_SEED)
            algorithm = algorithms.get_algorithm_class(name)((4,), 2, 2, hparams[name])
            init_state, _ = state_entries(algorithm)
            outputs = [floats(algorithm.update(batch)) for batch in minibatches]
            predict_after = predict_like_domainbed(algorithm, probe_x).tolist()
        updates[name] = {
            "hparams": hparams[name], "init_state": init_state,
            "minibatches": [[[x.tolist(), y.tolist()] for x, y in batch] for batch in minibatches],
            "update_outputs": outputs, "probe_x": probe_x.tolist(), "predict_after": predict_after,
        }
    return {"source": "facebookresearch/DomainBed b93c22a, domainbed/algorithms.py, run unmodified",
            "penalties": penalties, "updates": updates}


# ---------------------------------------------------------------- golden_zoo.json (all algorithms)

ZOO_INIT_SEED, ZOO_UPDATE_SEED_BASE, ZOO_DATA_SEED, ZOO_PENALTY_SEED = 0, 1000, 0, 1
ZOO_PROBE, LABEL_NOISE, BASE64_MIN_ELEMENTS = 5, 0.25, 1024
IMAGE_SHAPE = (2, 28, 28)
IMAGE_ALGORITHMS = {"ARM"}
ZOO_ANNEAL = {
    "ERMPlusPlus": {"linear_steps": 1}, "IRM": {"irm_penalty_anneal_iters": 1},
    "MLDG": {"n_meta_test": 1}, "VREx": {"vrex_penalty_anneal_iters": 1},
    "Fishr": {"penalty_anneal_iters": 1}, "TRM": {"iters": 1},
    "IB_ERM": {"ib_penalty_anneal_iters": 1},
    "IB_IRM": {"irm_penalty_anneal_iters": 1, "ib_penalty_anneal_iters": 1},
    "EQRM": {"eqrm_burnin_iters": 1}, "RDM": {"rdm_penalty_anneal_iters": 1},
}
CUDA_SHIM = ("{where}; with no GPU this raises, so torch.Tensor.cuda / nn.Module.cuda are made "
             "identity functions while {name} runs (everything stays on CPU{tail})")
FISHR_SHIM = (
    "Fishr._get_grads calls loss.backward(inputs=classifier params, create_graph=True) inside "
    "backpack(BatchGrad()). backpack>=1.4 uses full backward module hooks, which torch 2.x does "
    "not fire when backward(inputs=...) excludes the module's input, so grad_batch is never set "
    "(AttributeError); backpack 1.3.0 (DomainBed's pin) does not import under torch 2.14. The "
    "harness drops the `inputs=` argument of that one backward call (the extra featurizer .grad "
    "it creates is cleared by optimizer.zero_grad() before the real backward, so values are "
    "unchanged)")
HARNESS_SHIMS = {
    "Fishr": [FISHR_SHIM],
    "TRM": [CUDA_SHIM.format(
        where="TRM.__init__ calls .cuda() on its classifier, its per-domain classifiers and alpha",
        name="TRM", tail="")],
    "RDM": [CUDA_SHIM.format(
        where="RDM.update does `torch.zeros(len(minibatches)).cuda()`", name="RDM",
        tail="; values are what DomainBed computes with device-agnostic code")],
}
NOTES = {
    "ERMPlusPlus": ["sma_start_iter is hard-coded to 600 (not an hparam), so network_sma is a "
                    "plain copy of network after each update; predict() uses network_sma"],
    "MLDG": ["default n_meta_test=2 with 2 environments leaves the meta-train split empty: "
             "update() does nothing and returns loss 0.0"],
    "MTL": ["MTL.predict calls .normal_() on the domain embedding, so predict() itself draws "
            "from torch's global RNG (in update() and in the final predict; no reseed before it)"],
    "ARM": ["ARM.predict unpacks x.shape as (batch, c, h, w) and its ContextNet is "
            "convolutional, so it needs image input; (c, 28, 28) is the smallest shape "
            "DomainBed's Featurizer accepts for images (MNIST_CNN)"],
    "TRM": ["TRM keeps per-domain classifiers (clist) and alpha outside state_dict; their "
            "initial values are in init_extra"],
}
RNG_PROTOCOL = {
    "init_seed": ZOO_INIT_SEED, "update_seed_base": ZOO_UPDATE_SEED_BASE,
    "data_seed": ZOO_DATA_SEED,
    "construct": "torch.manual_seed(0); numpy.random.seed(0); random.seed(0) immediately before "
                 "algorithm_class(input_shape, num_classes=2, num_domains=2, hparams)",
    "update": "before update i (i = 0, 1, 2): torch.manual_seed(1000 + i); numpy.random.seed(1000 "
              "+ i); random.seed(1000 + i); then out_i = algorithm.update(minibatches_i, None)  "
              "(no algorithm needs unlabeled minibatches)",
    "predict": "after the third update, as DomainBed's misc.accuracy does: algorithm.eval(); with "
               "torch.no_grad(): predict_after = algorithm.predict(probe_x); algorithm.train(). "
               "No reseeding before predict.",
    "data": "numpy.random.RandomState(0) per input shape: w = randn(prod(shape)); for each "
            "update, for each of 2 environments: x = randn(8, *shape).astype(float32); y = "
            "int(x_flat . w > 0); each y flipped independently with probability 0.25 (rand(n) < "
            "0.25); then probe_x = randn(5, *shape).astype(float32)",
    "threads": "torch.set_num_threads(1); default dtype float32; CPU",
}
FORMAT = (
    "updates[ALGO]: hparams (default_hparams(ALGO, 'ColoredMNIST') + hparam_overrides), "
    "init_state = [name, shape, flat values] for the floating-point tensors of "
    "algorithm.state_dict() in order (right after construction), minibatches = 3 updates x [x, y] "
    "per environment, update_outputs = the dicts update() returned (values as float), probe_x, "
    "predict_after. init_extra: initial tensors the algorithm keeps outside state_dict. Entries "
    "with tensor_encoding 'base64-f32le' store every tensor with >= 1024 elements (init_state "
    "values, minibatch x, probe_x) as base64 of little-endian float32 bytes "
    "(np.frombuffer(base64.b64decode(s), '<f4').reshape(shape); x shape = [len(y)] + "
    "input_shape), list each shared tensor once and map the other state_dict names to it in "
    "init_state_aliases. rng_used: global generators whose reseeding before update() changes "
    "update_outputs or predict_after.")


def zoo_data(shape):
    """The recorded inputs for one input shape: 3 updates x 2 environments, then the probe."""
    rng = np.random.RandomState(ZOO_DATA_SEED)
    w = rng.randn(int(np.prod(shape)))
    minibatches = []
    for _ in range(N_UPDATES):
        batch = []
        for _ in range(N_ENVS):
            x = rng.randn(BATCH, *shape).astype(np.float32)
            y = (x.reshape(BATCH, -1) @ w > 0).astype(np.int64)
            flip = rng.rand(BATCH) < LABEL_NOISE
            batch.append((x, np.where(flip, 1 - y, y)))
        minibatches.append(batch)
    probe_x = rng.randn(ZOO_PROBE, *shape).astype(np.float32)
    return minibatches, probe_x


def encode(array, base64_large):
    """A tensor for the file: nested lists, or base64 little-endian float32 when large."""
    array = np.asarray(array)
    if base64_large and array.size >= BASE64_MIN_ELEMENTS:
        return base64.b64encode(array.astype("<f4").tobytes()).decode("ascii")
    return array.tolist()


@contextlib.contextmanager
def harness_shims(name):
    """The few patches some algorithms need to run on CPU under torch 2.x (see HARNESS_SHIMS)."""
    saved = torch.Tensor.cuda, torch.nn.Module.cuda, torch.Tensor.backward
    if name in ("TRM", "RDM"):
        torch.Tensor.cuda = lambda self, *args, **kwargs: self
        torch.nn.Module.cuda = lambda self, *args, **kwargs: self
    if name == "Fishr":
        backward = torch.Tensor.backward

        def backward_without_inputs(self, *args, inputs=None, create_graph=False, **kwargs):
            return backward(self, *args, create_graph=create_graph, **kwargs)
        torch.Tensor.backward = backward_without_inputs
    try:
        yield
    finally:
        torch.Tensor.cuda, torch.nn.Module.cuda, torch.Tensor.backward = saved


def run_zoo_case(name, hparams, shape, minibatches, probe_x, update_seeds, capture=None):
    """Build, update three times and predict under the RNG protocol; `capture(algorithm)` sees
    the algorithm straight after construction. Returns (update outputs, predict_after)."""
    from domainbed import algorithms
    batches = [[(torch.from_numpy(x), torch.from_numpy(y)) for x, y in batch]
               for batch in minibatches]
    with harness_shims(name):
        seed_all(ZOO_INIT_SEED)
        algorithm = algorithms.get_algorithm_class(name)(shape, 2, 2, hparams)
        if capture is not None:
            capture(algorithm)
        outputs = []
        for batch, seeds in zip(batches, update_seeds):
            torch.manual_seed(seeds["torch"])
            np.random.seed(seeds["numpy"])
            random.seed(seeds["random"])
            outputs.append(floats(algorithm.update(batch, None)))
        predict_after = predict_like_domainbed(algorithm, torch.from_numpy(probe_x)).tolist()
    return outputs, predict_after


def initial_tensors(algorithm, large):
    """init_state (and aliases, and TRM's tensors outside state_dict) straight after building."""
    entries, aliases = state_entries(algorithm, seen={} if large else None)
    found = {"init_state": [[n, s, encode(v, large)] for n, s, v in entries]}
    if large:
        found["init_state_aliases"] = aliases
    if hasattr(algorithm, "clist"):
        extra = [[f"clist.{i}.{key}", list(t.shape), t.flatten().tolist()]
                 for i, head in enumerate(algorithm.clist) for key, t in head.state_dict().items()]
        extra.append(["alpha", list(algorithm.alpha.shape), algorithm.alpha.flatten().tolist()])
        found["init_extra"] = extra
    return found


def protocol_seeds(shift=None):
    """Update seeds 1000 + i for every generator; `shift` moves one generator's seeds away."""
    return [{gen: ZOO_UPDATE_SEED_BASE + i + (7919 if gen == shift else 0)
             for gen in ("torch", "numpy", "random")} for i in range(N_UPDATES)]


def zoo_case(name, data):
    shape = IMAGE_SHAPE if name in IMAGE_ALGORITHMS else (4,)
    minibatches, probe_x = data[shape]
    overrides = {**MLP_OVERRIDES, **ZOO_ANNEAL.get(name, {})}
    hparams = default_hparams(name, overrides)
    large = name in IMAGE_ALGORITHMS
    found = {}
    result = run_zoo_case(name, hparams, shape, minibatches, probe_x, protocol_seeds(),
                          capture=lambda algorithm: found.update(initial_tensors(algorithm, large)))
    again = run_zoo_case(name, hparams, shape, minibatches, probe_x, protocol_seeds())
    rng_used = [gen for gen in ("torch", "numpy", "random")
                if run_zoo_case(name, hparams, shape, minibatches, probe_x,
                                protocol_seeds(shift=gen)) != result]
    case = {"status": "image-input" if large else "ok", "input_shape": list(shape),
            "num_classes": 2, "num_domains": 2, "unlabeled": None, "hparam_overrides": overrides,
            "nondeterministic": again != result, "rng_used": rng_used,
            "harness_shims": HARNESS_SHIMS.get(name, []), "notes": NOTES.get(name, []),
            "hparams": hparams}
    if large:
        case["tensor_encoding"] = "base64-f32le"
    case["init_state"] = found["init_state"]
    if large:
        case["init_state_aliases"] = found["init_state_aliases"]
    case["minibatches"] = [[[encode(x, large), y.tolist()] for x, y in batch]
                           for batch in minibatches]
    case["probe_x"] = encode(probe_x, large)
    if "init_extra" in found:
        case["init_extra"] = found["init_extra"]
    case["update_outputs"], case["predict_after"] = result
    return case


def zoo_penalties():
    """DomainBed's standalone penalty helpers on one numpy stream (seed 1), drawn in order."""
    from domainbed.lib import misc

    from domainbed import algorithms
    rng = np.random.RandomState(ZOO_PENALTY_SEED)

    def randn(*shape):
        return rng.randn(*shape).astype(np.float32)
    logits, labels = randn(16, 2), rng.randint(0, 2, 16)
    x, y = randn(12, 3), randn(10, 3)
    rdm_x, rdm_y = randn(8, 1) ** 2, randn(16, 1) ** 2
    d1 = {"a": randn(2, 3), "b": randn(4)}
    d2 = {"a": randn(2, 3), "b": randn(4)}
    risks = randn(5) ** 2 + np.float32(0.5)
    features, feature_labels = randn(10, 4), rng.randint(0, 2, 10)
    domains = np.array([0] * 5 + [1] * 5)
    z = randn(10, 8)
    t = torch.from_numpy

    def build(name):
        hparams = default_hparams(name, {**MLP_OVERRIDES, **ZOO_ANNEAL.get(name, {})})
        with harness_shims(name):
            return algorithms.get_algorithm_class(name)((4,), 2, 2, hparams)
    icdf = misc.Nonparametric()
    icdf.estimate_parameters(t(risks))
    q = 0.75
    tensor_dict = {key: t(v) for key, v in d1.items()}, {key: t(v) for key, v in d2.items()}
    return {
        "irm_penalty": {"call": "IRM._irm_penalty(logits, y)", "logits": logits.tolist(),
                        "y": labels.tolist(),
                        "value": scalar(algorithms.IRM._irm_penalty(t(logits), t(labels)))},
        "mmd_gaussian": {"call": "MMD(...).mmd(x, y)  (AbstractMMD, gaussian kernel)",
                         "x": x.tolist(), "y": y.tolist(), "gaussian_gammas": GOLDEN_GAMMAS,
                         "value": scalar(build("MMD").mmd(t(x), t(y)))},
        "mmd_mean_cov": {"call": "CORAL(...).mmd(x, y)  (mean + covariance difference)",
                         "x": x.tolist(), "y": y.tolist(),
                         "value": scalar(build("CORAL").mmd(t(x), t(y)))},
        "rdm_mmd": {"call": "RDM(...).mmd(x, y)  (gaussian kernel, gammas below)",
                    "x": rdm_x.tolist(), "y": rdm_y.tolist(),
                    "gaussian_gammas": [0.0001] + GOLDEN_GAMMAS,
                    "value": scalar(build("RDM").mmd(t(rdm_x), t(rdm_y)))},
        "l2_between_dicts": {"call": "misc.l2_between_dicts(d1, d2)  (Fishr's distance)",
                             "d1": {k: v.tolist() for k, v in d1.items()},
                             "d2": {k: v.tolist() for k, v in d2.items()},
                             "value": scalar(misc.l2_between_dicts(*tensor_dict))},
        "eqrm_nonparametric_icdf": {
            "call": "d = misc.Nonparametric(); d.estimate_parameters(risks); "
                    "d.icdf(torch.tensor(q, float64))",
            "risks": risks.tolist(), "q": q,
            "value": scalar(icdf.icdf(torch.tensor(q, dtype=torch.float64)))},
        "supcon_lambda": {
            "call": "misc.SupConLossLambda(lamda=0.5, temperature=0.07)(features, labels, domains)",
            "features": features.tolist(), "labels": feature_labels.tolist(),
            "domains": domains.tolist(),
            "value": scalar(misc.SupConLossLambda(0.5, 0.07)(t(features), t(feature_labels),
                                                             t(domains)))},
        "cad_bn_loss": {"call": "CAD(...).bn_loss(z, y, d)  (temperature 0.1, is_flipped, not "
                                "normalized)", "z": z.tolist(), "y": feature_labels.tolist(),
                        "d": domains.tolist(),
                        "value": scalar(build("CAD").bn_loss(t(z), t(feature_labels), t(domains)))},
        "condcad_bn_loss": {"call": "CondCAD(...).bn_loss(z, y, d)", "z": z.tolist(),
                            "y": feature_labels.tolist(), "d": domains.tolist(),
                            "value": scalar(build("CondCAD").bn_loss(t(z), t(feature_labels),
                                                                    t(domains)))},
    }


def golden_zoo(names=None):
    """golden_zoo.json: every name in DomainBed's ALGORITHMS (or `names`), one process, 1 thread."""
    from domainbed import algorithms
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    names = list(names or algorithms.ALGORITHMS)
    shapes = {IMAGE_SHAPE if name in IMAGE_ALGORITHMS else (4,) for name in names}
    data = {shape: zoo_data(shape) for shape in shapes}
    updates = {name: zoo_case(name, data) for name in names}
    try:
        from importlib.metadata import version
        backpack = version("backpack-for-pytorch")
    except Exception:   # Fishr then fails to build; recorded in the source line
        backpack = "absent"
    source = (f"facebookresearch/DomainBed commit {DOMAINBED_COMMIT} (domainbed/algorithms.py, "
              "networks.py, hparams_registry.py run unmodified from `git archive HEAD`), python "
              f"{platform.python_version()}, torch {torch.__version__} (CPU, float32, "
              f"torch.set_num_threads(1)), numpy {np.__version__}, backpack-for-pytorch "
              f"{backpack}; generated by scripts/reference_data.py zoo")
    return {"source": source, "rng_protocol": RNG_PROTOCOL, "format": FORMAT, "updates": updates,
            "skipped": {}, "penalties": zoo_penalties()}
