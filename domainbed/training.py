"""One training run: data splits, the step loop, evaluation, records, checkpoints, resume.

A run directory is the only output (see docs/CONTRACTS.md). Everything is written
atomically, and a run killed at any moment resumes from its last checkpoint and ends
with the same records as an uninterrupted run: batch indices are a pure function of
(seed, environment, step), and model, optimizer and RNG states are checkpointed.
"""
import copy
import hashlib
import inspect
import json
import math
import os
import sys
import time

import numpy as np
import torch

from domainbed import fileio
from domainbed.datasets.base import split_dataset
from domainbed.errors import UserError
from domainbed.hparams import seed_hash

RESUME_FILE = "resume_state.pt"
# Arguments that may differ between an interrupted run and its resumption.
NON_IDENTITY_ARGS = ("output_dir", "progress", "eval_batch_size", "num_threads")
# Lets bf16 run where the CPU only emulates it: slow, but its numerics can be studied.
ALLOW_EMULATED_BF16 = "DOMAINBED_ALLOW_EMULATED_BF16"


class TrainingDiverged(UserError):
    """A loss became NaN or infinite: the run stops without writing a garbage record."""


def cpu_supports_bf16():
    checks = [getattr(torch.cpu, "_is_avx512_bf16_supported", None),
              getattr(torch.cpu, "_is_amx_tile_supported", None)]
    if any(check is not None and check() for check in checks):
        return True
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def autocast_context(device, precision):
    if precision == "fp32":
        return torch.autocast(device_type=device.type, enabled=False)
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def check_precision(device, precision):
    if precision == "fp32":
        return
    if precision != "bf16":
        raise UserError(f"unknown precision {precision!r}; valid: fp32, bf16")
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UserError("--precision bf16 needs a GPU with bfloat16 support")
    if device.type == "cpu" and not cpu_supports_bf16():
        if os.environ.get(ALLOW_EMULATED_BF16) == "1":
            print(f"notice: {ALLOW_EMULATED_BF16}=1: bfloat16 is emulated on this CPU (same "
                  "rounding, many times slower); use it to study bf16 numerics, not speed",
                  file=sys.stderr)
            return
        raise UserError("--precision bf16 needs a CPU with AVX-512 BF16 or AMX; this CPU has "
                        "neither, so bfloat16 would be emulated and slower: use fp32 (or set "
                        f"{ALLOW_EMULATED_BF16}=1 to study bf16 numerics anyway)")


def build_dataset(dataset_cls, data_dir, test_envs, hparams, data_seed):
    """DomainBed datasets take (root, test_envs, hparams); ours also take data_seed."""
    params = inspect.signature(dataset_cls.__init__).parameters
    if "data_seed" in params:
        return dataset_cls(data_dir, test_envs, hparams, data_seed=data_seed)
    return dataset_cls(data_dir, test_envs, hparams)


def make_splits(dataset, args, hparams):
    """DomainBed's in/out (and uda) splits, seeded by the trial seed."""
    in_splits, out_splits, uda_splits = [], [], []
    for env_i, env in enumerate(dataset):
        out, in_ = split_dataset(env, int(len(env) * args.holdout_fraction),
                                 seed_hash(args.trial_seed, env_i))
        uda = None
        if env_i in args.test_envs and args.task == "domain_adaptation":
            uda, in_ = split_dataset(in_, int(len(in_) * args.uda_holdout_fraction),
                                     seed_hash(args.trial_seed, env_i))
        in_splits.append(in_)
        out_splits.append(out)
        if uda is not None:
            uda_splits.append((env_i, uda))
    return in_splits, out_splits, uda_splits


def training_view(split):
    """The split as the training loop sees it: augmented where the dataset augments.
    Evaluation keeps the split's deterministic transform (DomainBed also evaluates training
    environments' out-splits through augmentation; we do not)."""
    if not hasattr(split, "set_transform"):
        return split
    view = copy.copy(split)
    view.set_transform(True)
    split.set_transform(False)
    return view


def class_balanced_weights(split):
    counts = torch.bincount(split.y)
    return (1.0 / counts.float())[split.y]


def sampling_weights(split, hparams):
    """Per-example draw weights: group- or class-balanced, or None for uniform."""
    if hparams.get("group_balanced") and split.groups is not None:
        groups = torch.as_tensor(split.groups)
        return (1.0 / torch.bincount(groups).float())[groups]
    if hparams.get("class_balanced") or hparams.get("group_balanced"):
        return class_balanced_weights(split)
    return None


class BatchSampler:
    """Minibatch indices as a pure function of (seed, env, step): resumable for free.
    Sampling is with replacement, as DomainBed's InfiniteDataLoader."""

    def __init__(self, split, batch_size, seed, env_i, weights=None):
        self.n, self.batch_size, self.weights = len(split), batch_size, weights
        self.seed, self.env_i = seed, env_i
        self.generator = torch.Generator()

    def indices(self, step):
        self.generator.manual_seed(seed_hash(self.seed, self.env_i, step))
        if self.weights is not None:
            return torch.multinomial(self.weights, self.batch_size, replacement=True,
                                     generator=self.generator)
        return torch.randint(self.n, (self.batch_size,), generator=self.generator)


class MinibatchSource:
    """Training minibatches from in-memory tensors (fast path) or a loader pool."""

    def __init__(self, splits, env_indices, hparams, seed, device, memory_format, n_workers):
        self.splits, self.device, self.memory_format = splits, device, memory_format
        self.samplers = [
            BatchSampler(split, hparams["batch_size"], seed, env_i,
                         sampling_weights(split, hparams))
            for split, env_i in zip(splits, env_indices)]
        self.pool = None
        if any(split.x is None for split in splits) and n_workers > 0:
            from concurrent.futures import ThreadPoolExecutor
            self.pool = ThreadPoolExecutor(max_workers=n_workers)

    def _load(self, split, idx):
        if split.x is not None:
            return split.x[idx], split.y[idx]
        items = list(self.pool.map(split.__getitem__, idx.tolist())) if self.pool else \
            [split[i] for i in idx.tolist()]
        return torch.stack([x for x, _ in items]), torch.as_tensor([y for _, y in items])

    def batches(self, step):
        out = []
        for split, sampler in zip(self.splits, self.samplers):
            x, y = self._load(split, sampler.indices(step))
            x = x.to(self.device, non_blocking=True)
            if x.dim() == 4:
                x = x.contiguous(memory_format=self.memory_format)
            out.append((x, y.to(self.device, non_blocking=True)))
        return out


def iterate_split(split, batch_size, n_workers):
    if split.x is not None:
        for start in range(0, len(split), batch_size):
            yield split.x[start:start + batch_size]
        return
    loader = torch.utils.data.DataLoader(
        split, batch_size=batch_size, shuffle=False, num_workers=n_workers)
    for x, _ in loader:
        yield x


@torch.inference_mode()
def predict_split(algorithm, split, device, precision, memory_format, batch_size, n_workers):
    """Logits of every example of a split, in order."""
    chunks = []
    for x in iterate_split(split, batch_size, n_workers):
        x = x.to(device, non_blocking=True)
        if x.dim() == 4:
            x = x.contiguous(memory_format=memory_format)
        with autocast_context(device, precision):
            chunks.append(algorithm.predict(x).float().cpu())
    return torch.cat(chunks) if chunks else torch.empty(0)


def predicted_class(logits):
    if logits.dim() == 1 or logits.size(1) == 1:  # DomainBed's binary single-logit case
        return (logits.view(-1) > 0).long()
    return logits.argmax(1)


def split_metrics(name, correct, groups, n_groups):
    """Accuracy, and per-group and worst-group accuracy where groups exist."""
    metrics = {f"{name}_acc": float(correct.mean()) if len(correct) else 0.0}
    if groups is not None and n_groups:
        group_accs = []
        for g in range(n_groups):
            mask = groups == g
            if mask.any():
                acc = float(correct[mask].mean())
                metrics[f"{name}_acc_g{g}"] = acc
                group_accs.append(acc)
        if group_accs:
            metrics[f"{name}_wga"] = min(group_accs)
    return metrics


def evaluate(algorithm, named_splits, ctx, n_groups, save_logits):
    """Metrics of every split and the per-example prediction table of this checkpoint."""
    metrics, columns = {}, {k: [] for k in ("id", "env", "split", "label", "pred", "correct",
                                            "group", "logits")}
    split_codes = {"in": 0, "out": 1, "uda": 2}
    algorithm.eval()
    for name, env_i, kind, split in named_splits:
        logits = predict_split(algorithm, split, ctx.device, ctx.precision, ctx.memory_format,
                               ctx.eval_batch_size, ctx.n_workers)
        pred = predicted_class(logits).numpy()
        label = split.y.numpy()
        correct = (pred == label).astype(np.uint8)
        metrics.update(split_metrics(name, correct, split.groups, n_groups))
        n = len(label)
        columns["id"].append(split.ids)
        columns["env"].append(np.full(n, env_i, np.int16))
        columns["split"].append(np.full(n, split_codes[kind], np.int8))
        columns["label"].append(label.astype(np.int64))
        columns["pred"].append(pred.astype(np.int64))
        columns["correct"].append(correct)
        columns["group"].append(split.groups if split.groups is not None
                                else np.full(n, -1, np.int64))
        columns["logits"].append(logits.to(torch.float16).numpy())
    algorithm.train()
    table = {k: np.concatenate(v) for k, v in columns.items() if k != "logits"}
    if save_logits:
        table["logits"] = np.concatenate(columns["logits"])
    return metrics, table


def args_identity(args_dict):
    kept = {k: v for k, v in args_dict.items() if k not in NON_IDENTITY_ARGS}
    return hashlib.md5(json.dumps(kept, sort_keys=True).encode()).hexdigest()


def optimizer_attributes(algorithm):
    return {name: value for name, value in vars(algorithm).items()
            if isinstance(value, torch.optim.Optimizer)}


def save_resume_state(path, algorithm, step, n_records, accumulators, identity):
    fileio.atomic_torch_save(path, {
        "next_step": step, "n_records": n_records, "identity": identity,
        "algorithm": algorithm.state_dict(),
        "optimizers": {k: o.state_dict() for k, o in optimizer_attributes(algorithm).items()},
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "accumulators": accumulators,
    })


def load_resume_state(path, algorithm, identity):
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state["identity"] != identity:
        raise UserError(f"{os.path.dirname(path)} holds an unfinished run with other "
                        f"arguments; use another --output_dir or delete it")
    algorithm.load_state_dict(state["algorithm"])
    for name, optimizer in optimizer_attributes(algorithm).items():
        if name in state["optimizers"]:
            optimizer.load_state_dict(state["optimizers"][name])
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    return state


def read_kept_records(path, n_records):
    """The first n_records lines of results.jsonl (later ones are redone on resume)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    return lines[:n_records]


def save_model(path, args_dict, dataset, algorithm, hparams, num_domains):
    fileio.atomic_torch_save(path, {
        "args": args_dict, "model_input_shape": dataset.input_shape,
        "model_num_classes": dataset.num_classes, "model_num_domains": num_domains,
        "model_hparams": hparams, "model_dict": algorithm.state_dict()})


def write_error(output_dir, message):
    fileio.atomic_write_text(os.path.join(output_dir, "err.txt"), message.rstrip() + "\n")


class RunContext:
    def __init__(self, device, precision, memory_format, eval_batch_size, n_workers):
        self.device, self.precision, self.memory_format = device, precision, memory_format
        self.eval_batch_size, self.n_workers = eval_batch_size, n_workers


def pick_memory_format(choice, device, precision):
    """auto: channels-last on CPU (oneDNN's preferred layout: a default ColoredMNIST run
    measured 824 s vs 933 s contiguous on 2 cores) and with bf16; contiguous otherwise."""
    if choice == "auto":
        choice = ("channels_last" if precision == "bf16" or torch.device(device).type == "cpu"
                  else "contiguous")
    return torch.channels_last if choice == "channels_last" else torch.contiguous_format


def run(args, hparams, algorithm_cls, dataset_cls, log=print):
    """Train one run into args.output_dir (resuming if it holds an unfinished one)."""
    out = args.output_dir
    os.makedirs(out, exist_ok=True)
    if os.path.exists(os.path.join(out, "done")):
        log(f"notice: {out} already holds a finished run; nothing to do")
        return
    if os.path.exists(os.path.join(out, "err.txt")):
        os.unlink(os.path.join(out, "err.txt"))

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check_precision(device, args.precision)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)

    dataset = build_dataset(dataset_cls, args.data_dir, args.test_envs, hparams, args.data_seed)
    n_envs = len(dataset)
    in_splits, out_splits, uda_splits = make_splits(dataset, args, hparams)
    train_envs = [i for i in range(n_envs) if i not in args.test_envs]
    n_workers = min(getattr(dataset, "N_WORKERS", 0), os.cpu_count() or 1)
    memory_format = pick_memory_format(args.memory_format, device, args.precision)
    ctx = RunContext(device, args.precision, memory_format, args.eval_batch_size, n_workers)

    group_names = getattr(dataset, "group_names", None)
    args_dict = dict(vars(args))
    args_dict.update(dataset.identity() if hasattr(dataset, "identity") else {})
    args_dict.update({"env_names": list(getattr(dataset_cls, "ENVIRONMENTS", []) or []),
                      "group_names": group_names, "num_classes": dataset.num_classes})
    identity = args_identity(args_dict)

    algorithm = algorithm_cls(dataset.input_shape, dataset.num_classes,
                              n_envs - len(args.test_envs), hparams).to(device)
    if len(dataset.input_shape) == 3:
        algorithm = algorithm.to(memory_format=memory_format)
    minibatches = MinibatchSource([training_view(in_splits[i]) for i in train_envs],
                                  train_envs, hparams, args.seed, device, memory_format,
                                  n_workers)
    uda_source = MinibatchSource([s for _, s in uda_splits], [i for i, _ in uda_splits],
                                 hparams, args.seed + 1, device, memory_format,
                                 n_workers) if uda_splits else None

    named_splits = [(f"env{i}_in", i, "in", s) for i, s in enumerate(in_splits)]
    named_splits += [(f"env{i}_out", i, "out", s) for i, s in enumerate(out_splits)]
    named_splits += [(f"env{i}_uda", i, "uda", s) for i, s in uda_splits]
    for _, _, _, split in named_splits:
        if hasattr(split, "set_transform"):
            split.set_transform(False)
    if any(s.paths is not None for _, _, _, s in named_splits) and \
            not os.path.exists(os.path.join(out, "examples.csv")):
        write_example_paths(os.path.join(out, "examples.csv"), dataset)

    n_steps = args.steps or dataset_cls.N_STEPS
    checkpoint_freq = args.checkpoint_freq or dataset_cls.CHECKPOINT_FREQ
    steps_per_epoch = min(len(s) / hparams["batch_size"] for s in in_splits)
    results_path = os.path.join(out, "results.jsonl")
    resume_path = os.path.join(out, RESUME_FILE)
    start_step, records, accumulators = 0, [], {}
    if os.path.exists(resume_path):
        state = load_resume_state(resume_path, algorithm, identity)
        start_step, accumulators = state["next_step"], state["accumulators"]
        records = read_kept_records(results_path, state["n_records"])
        log(f"notice: resuming {out} at step {start_step}")
    elif os.path.exists(results_path):
        os.unlink(results_path)  # records from a run that never reached a checkpoint state

    from tqdm import tqdm
    progress = tqdm(total=n_steps, initial=start_step, disable=not sys.stderr.isatty(),
                    desc=f"{args.algorithm}/{args.dataset}", dynamic_ncols=True)
    last_results_keys = None
    for step in range(start_step, n_steps):
        step_start = time.time()
        batches = minibatches.batches(step)
        uda = None
        if uda_source is not None:
            uda = [x for x, _ in uda_source.batches(step)]
        with autocast_context(device, args.precision):
            step_vals = algorithm.update(batches, uda)
        for key, value in step_vals.items():
            value = float(value)
            if not math.isfinite(value):
                raise TrainingDiverged(f"{key} became {value} at step {step} "
                                       f"({args.algorithm} on {args.dataset}); run stopped")
            accumulators.setdefault(key, []).append(value)
        accumulators.setdefault("step_time", []).append(time.time() - step_start)
        progress.update(1)

        if step % checkpoint_freq == 0 or step == n_steps - 1:
            results = {"step": step, "epoch": step / steps_per_epoch}
            for key, values in accumulators.items():
                results[key] = float(np.mean(values))
            metrics, table = evaluate(algorithm, named_splits, ctx,
                                      len(group_names or []), args.save_logits)
            results.update(metrics)
            results["mem_gb"] = (torch.cuda.max_memory_allocated() / 1024 ** 3
                                 if device.type == "cuda" else 0.0)
            results["hparams"] = hparams
            results["args"] = args_dict
            fileio.atomic_savez(os.path.join(out, "predictions", f"step_{step:07d}.npz"),
                                **table)
            records.append(json.dumps(results, sort_keys=True))
            fileio.atomic_write_text(results_path, "\n".join(records) + "\n")
            accumulators = {}
            if args.save_model_every_checkpoint:
                save_model(os.path.join(out, f"model_step{step}.pkl"), args_dict, dataset,
                           algorithm, hparams, len(train_envs))
            save_resume_state(resume_path, algorithm, step + 1, len(records), accumulators,
                              identity)
            last_results_keys = results
            progress.set_postfix({k: f"{v:.3f}" for k, v in metrics.items()
                                  if k.endswith("_acc") and not k.endswith("in_acc")})
    progress.close()
    if not args.skip_model_save:
        save_model(os.path.join(out, "model.pkl"), args_dict, dataset, algorithm, hparams,
                   len(train_envs))
    fileio.atomic_write_text(os.path.join(out, "done"), "done\n")
    if os.path.exists(resume_path):
        os.unlink(resume_path)
    return last_results_keys


def write_example_paths(path, dataset):
    lines = ["id,env,path"]
    for env_i, env in enumerate(dataset):
        for example_id, file_path in zip(env.ids, env.paths or []):
            lines.append(f"{int(example_id)},{env_i},{json.dumps(str(file_path))}")
    fileio.atomic_write_text(path, "\n".join(lines) + "\n")
