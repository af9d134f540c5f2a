"""Linear probes trained as one stack: K heads on one frozen backbone's cached features.

On cached features (domainbed.networks.feature_cache) a linear probe is one matrix and one
bias, so the K probes of a group are a (K, classes, features) tensor and a (K, classes)
one. Each step every head reads its own minibatch rows (the indices its single run draws:
its seed, its batch size, its environments' samplers) and takes its own Adam step with its
own learning rate and weight decay, a chunk of heads at a time (heads of one batch size).
At a checkpoint one pass over each evaluated split gives every head's logits, and each
member, an ordinary `TrainingRun`, writes its own record and predictions.

A single linear-probe run on cached features trains as a stack of one (`TrainingRun`
does, where `why_not` accepts it), so a stacked head's record equals the run alone by
construction, provided a head's arithmetic never depends on the other heads: on CPU the
compiled kernel (domainbed.training.probe_kernel) computes each head's logits,
cross-entropy gradient and Adam step in a fixed order of its own; where it is not built
(no C compiler, DOMAINBED_PROBE_KERNEL=torch) or on a GPU, torch's operations do
(`baddbmm`/`bmm` slices, autograd's backward kernels, torch.optim.Adam's single-tensor
arithmetic per head), the same choice for a run alone and in a stack. What differs
between a stacked member and the run alone: `step_time` (each head's share of the
stack's step), `mem_gb` on a GPU, and no resume state in a stack (a killed stack's
members restart from step 0: a probe costs seconds, a resume state would hold the whole
frozen backbone).

Supported: ERM (a probe's plain objective) with a linear head, no dropout, float32, no
unlabeled data, a constant learning rate, no gradient clipping, accumulation or early
stopping, one process. ``why_not(run)`` names what keeps a run out: such a run trains
through its algorithm's update, and the fused launcher runs it as an ordinary job.
"""
import functools
import math
import threading
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn as nn

from domainbed.training import probe_kernel
from domainbed.training.bulk_sampling import draw_indices
from domainbed.training.evaluation import iterate_split

STACKABLE_ALGORITHMS = ("ERM",)
CHUNK_BYTES = 4 << 20  # gathered float32 rows per chunk of heads: about an L2/L3 share
KERNEL_CHUNK_HEADS = 32  # heads per call of the compiled kernel (the threads share the calls)
INDEX_STEPS = 32       # steps of minibatch indices drawn at once
_THREAD_BUFFERS = threading.local()


def why_not(run):
    """Why this TrainingRun cannot train in a probe stack, or None when it can."""
    if run.config.algorithm not in STACKABLE_ALGORITHMS:
        return (f"{run.config.algorithm} does not stack as a linear probe (stacked: "
                f"{', '.join(STACKABLE_ALGORITHMS)})")
    if not getattr(run, "uses_feature_cache", False):
        return "it does not train on cached features"
    algorithm = run.algorithm
    if not isinstance(getattr(algorithm, "classifier", None), nn.Linear):
        return "its head is not linear (nonlinear_classifier)"
    if getattr(algorithm.featurizer, "dropout", nn.Dropout(0.0)).p != 0:
        return "its features go through dropout (resnet_dropout)"
    if run.uda_source is not None:
        return "it adapts to unlabeled data"
    if run.config.precision not in ("fp32", None):
        return f"precision {run.config.precision} (stacked probes train in float32)"
    if not getattr(run, "stacks_as_probe", False):
        return "it trains in several processes (data parallel)"
    if run.schedule.active:
        return "its learning rate follows a schedule, or its gradients are clipped"
    if run.accum_steps != 1:
        return "it accumulates gradients over micro-batches"
    if run.early_stopping is not None:
        return "it stops early"
    optimizer = algorithm.optimizer
    group = optimizer.param_groups[0]
    if type(optimizer) is not torch.optim.Adam or len(optimizer.param_groups) != 1 or \
            group["amsgrad"] or group["maximize"] or group.get("decoupled_weight_decay"):
        return "its optimizer is not one plain Adam"
    return None


@functools.lru_cache(maxsize=None)
def _minus_mean(rows):
    """-1 / rows in float32 (what the mean's backward divides), as a Python float."""
    return (torch.tensor(-1.0) / rows).item()


def _per_head(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype).view(-1, 1, 1)


class ProbeStack:
    """Members (TrainingRuns of linear probes on one dataset's cached features, all at the
    same next step, sorted by batch size) trained as one stack of heads."""

    def __init__(self, members, threads=1):
        self.members = list(members)
        self.splits = self.members[0].minibatches.splits
        for m in self.members:
            if [s.x.data_ptr() for s in m.minibatches.splits] != \
                    [s.x.data_ptr() for s in self.splits]:
                raise ValueError("stacked probes must share their cached features")
        # every training row once (float16 cached features stay float16, see _gather),
        # with each split's offset: one gather per chunk of heads, not one per environment
        self.table = torch.cat([s.x for s in self.splits])
        if self.table.dtype not in (torch.float16, torch.float32):
            self.table = self.table.float()
        self.labels = torch.cat([s.y for s in self.splits])
        sizes = [len(s.x) for s in self.splits]
        self.offsets = [sum(sizes[:e]) for e in range(len(sizes))]
        self.threads = max(1, threads)
        self.kernel = probe_kernel.load() if self.table.device.type == "cpu" else None
        self._pool = None
        heads = [m.algorithm.classifier for m in self.members]
        self.weight = torch.stack([h.weight.detach() for h in heads]).clone()
        self.bias = torch.stack([h.bias.detach() for h in heads]).clone().unsqueeze(1)
        self._load_adam()
        self._layout()

    def _load_adam(self):
        """Adam's moments and step counts from each member's optimizer (fresh or resumed)."""
        group = self.members[0].algorithm.optimizer.param_groups[0]
        self.betas, self.eps = group["betas"], group["eps"]
        self.lr = [m.algorithm.optimizer.param_groups[0]["lr"] for m in self.members]
        self.decay = [m.algorithm.optimizer.param_groups[0]["weight_decay"]
                      for m in self.members]
        self.moments = {"weight": [torch.zeros_like(self.weight), torch.zeros_like(self.weight)],
                        "bias": [torch.zeros_like(self.bias), torch.zeros_like(self.bias)]}
        self.adam_steps = [0] * len(self.members)
        for i, member in enumerate(self.members):
            head, optimizer = member.algorithm.classifier, member.algorithm.optimizer
            for name in ("weight", "bias"):
                state = optimizer.state.get(getattr(head, name))
                if state:
                    exp_avg, exp_avg_sq = self.moments[name]
                    exp_avg[i] = state["exp_avg"].view_as(exp_avg[i])
                    exp_avg_sq[i] = state["exp_avg_sq"].view_as(exp_avg_sq[i])
                    self.adam_steps[i] = int(float(state["step"]))

    def _layout(self):
        """Chunks of heads (see `chunks`), and no drawn indices yet (after a drop too)."""
        batch = [m.hparams["batch_size"] for m in self.members]
        self.rows_per_head = [b * len(self.splits) for b in batch]
        self.layout = self.chunks(self.rows_per_head, heads=KERNEL_CHUNK_HEADS
                                  if self.kernel is not None else None)
        self.decay_factors = torch.tensor(self.decay, dtype=torch.float32)
        self.groups = self.chunks(self.rows_per_head, limit=math.inf)   # one per batch size
        self.decaying = {(start, end): [i for i in range(start, end) if self.decay[i] != 0]
                         for start, end in self.layout}
        self._drawn = {}   # (start, end) -> (first step, rows [steps, heads, rows], labels)

    # ------------------------------------------------------------ one step
    def chunks(self, rows, limit=None, heads=None):
        """(start, end) ranges of heads: each within one batch size (members come sorted
        by it), with at most `heads` heads, or else at most `limit` (default CHUNK_BYTES)
        bytes of gathered float32 rows (`rows[head]` each)."""
        out, start = [], 0
        width, limit = self.weight.shape[2] * 4, limit or CHUNK_BYTES
        for k in range(1, len(self.members) + 1):
            full = k - start >= heads if heads else (k - start) * rows[start] * width >= limit
            if k == len(self.members) or full or rows[k] != rows[start]:
                out.append((start, k))
                start = k
        return out

    def _draw(self, step, start, end):
        """The table rows and labels [steps, heads, rows] of heads start..end (one batch
        size) for INDEX_STEPS steps from `step`: per head its environments' minibatch
        indices, each drawn as its own sampler draws them (bulk_sampling), plus each split's
        offset in the table."""
        steps = list(range(step, min(step + INDEX_STEPS, self.members[0].n_steps)))
        rows = torch.cat([
            draw_indices([m.minibatches.samplers[e] for m in self.members[start:end]], steps)
            + offset for e, offset in enumerate(self.offsets)], dim=2)
        return step, rows, self.labels[rows]

    def _step_rows(self, step, start, end):
        """Rows and labels [heads, rows] of heads start..end at `step` (drawn for every
        head of their batch size at once, INDEX_STEPS steps at a time)."""
        group = next(g for g in self.groups if g[0] <= start < g[1])
        drawn = self._drawn.get(group)
        if drawn is None or not 0 <= step - drawn[0] < len(drawn[1]):
            drawn = self._drawn[group] = self._draw(step, *group)
        first = step - drawn[0]
        return (drawn[1][first, start - group[0]:end - group[0]],
                drawn[2][first, start - group[0]:end - group[0]])

    def train_step(self, step):
        """One Adam step of every head; returns each head's loss (float). With `threads`
        above 1, chunks of heads train in that many threads, each running torch's
        operations single-threaded (no chunk shares a head with another)."""
        losses = torch.empty(len(self.members))
        factors = self._adam_factors()
        for start, end in self.groups:   # drawn here, before the threads read them
            self._step_rows(step, start, end)
        jobs = [(step, start, end, losses, factors) for start, end in self.layout]
        if self.threads == 1:
            for job in jobs:
                self._train_chunk(*job)
            return losses.tolist()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads)
        ops_threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            list(self._pool.map(lambda job: self._train_chunk(*job), jobs))
        finally:
            torch.set_num_threads(ops_threads)
        return losses.tolist()

    def _train_chunk(self, step, start, end, losses, factors):
        """Loss, gradients and Adam step of heads start..end."""
        rows, y = self._step_rows(step, start, end)
        weight, bias = self.weight[start:end], self.bias[start:end]
        if self.kernel is not None:   # gradient and Adam step of each head in turn
            moments = {k: [t[start:end] for t in v] for k, v in self.moments.items()}
            step_size, bias2_sqrt = (f.view(-1)[start:end] for f in factors)
            losses[start:end] = probe_kernel.train(
                self.kernel, self.table, rows, y, (weight, bias), moments,
                (self.decay_factors[start:end], step_size, bias2_sqrt), self.betas, self.eps)
            return
        grad_w, grad_b = self._torch_gradients(rows, y, weight, bias, losses[start:end])
        self._adam(start, end, {"weight": grad_w, "bias": grad_b}, factors)

    def _torch_gradients(self, rows, y, weight, bias, losses):
        """The weight and bias gradients (and each head's loss into `losses`) by torch's
        operations, where the kernel is not built: batched products and autograd's own
        backward kernels, without the engine."""
        x = self._gather(rows)
        logits = torch.baddbmm(bias, x, weight.transpose(1, 2))
        log_probs = logits.log_softmax(2)
        torch.neg(log_probs.gather(2, y.unsqueeze(2)).squeeze(2).mean(1), out=losses)
        # -1/rows at each label (mean, then gather's backward), then log_softmax's backward
        upstream = torch.zeros_like(log_probs).scatter_(2, y.unsqueeze(2), _minus_mean(y.shape[1]))
        grad_logits = torch.ops.aten._log_softmax_backward_data(
            upstream, log_probs, 2, torch.float32)
        # the weight gradient as one bmm of (classes x rows) by (rows x features)
        return torch.bmm(grad_logits.transpose(1, 2), x), grad_logits.sum(1, keepdim=True)

    def _gather(self, rows):
        """The table's rows [heads, rows], as float32, into this thread's buffers kept
        between chunks (fresh megabytes each time would cost page faults). A float16 table
        (cached features) is gathered as such and widened in the buffer (exact): half the
        bytes read, and a table half the size in the shared cache."""
        local, n = _THREAD_BUFFERS.__dict__, rows.numel()
        shape = (n, self.table.shape[1])
        for dtype in {self.table.dtype, torch.float32}:
            buffer = local.get(dtype)
            if buffer is None or buffer.shape[0] < n or buffer.shape[1] != shape[1]:
                local[dtype] = torch.empty(shape, dtype=dtype)
        out = local[torch.float32][:n]
        if self.table.dtype == torch.float32:
            torch.index_select(self.table, 0, rows.view(-1), out=out)
        else:
            out.copy_(torch.index_select(self.table, 0, rows.view(-1),
                                         out=local[self.table.dtype][:n]))
        return out.view(*rows.shape, -1)

    def _adam_factors(self):
        """Each head's step size and bias correction of this step (Python floats, as
        torch.optim.Adam computes them), as float32 [heads, 1, 1]."""
        beta1, beta2 = self.betas
        self.adam_steps = [s + 1 for s in self.adam_steps]
        step_size = _per_head([-(lr / (1 - beta1 ** s))
                               for lr, s in zip(self.lr, self.adam_steps)])
        bias2_sqrt = _per_head([(1 - beta2 ** s) ** 0.5 for s in self.adam_steps])
        return step_size, bias2_sqrt

    @torch.no_grad()
    def _adam(self, start, end, grads, factors):
        """torch.optim.Adam's single-tensor step of heads start..end (module docstring)."""
        beta1, beta2 = self.betas
        step_size, bias2_sqrt = (f[start:end] for f in factors)
        for name, param in (("weight", self.weight[start:end]), ("bias", self.bias[start:end])):
            grad = grads[name]
            for i in self.decaying[(start, end)]:   # grad.add(param, alpha=wd): torch's kernel
                grad[i - start].add_(param[i - start], alpha=self.decay[i])
            exp_avg, exp_avg_sq = (t[start:end] for t in self.moments[name])
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (exp_avg_sq.sqrt() / bias2_sqrt).add_(self.eps)
            param.add_(torch.mul(step_size, exp_avg).div_(denom))

    # ------------------------------------------------------------ evaluation, write-back
    @torch.no_grad()
    def predict(self):
        """{split name: logits [heads, n, classes]} of every evaluated split."""
        if self.kernel is not None:
            return self._kernel_predict()
        first = self.members[0]
        out = {}
        for name, _, _, split in first.named_splits:
            parts = []
            for x in iterate_split(split, first.ctx.eval_batch_size, first.ctx.n_workers):
                x = x.float()
                part = torch.empty(len(self.members), len(x), self.weight.shape[1])
                for start, end in self.chunks([len(x)] * len(self.members)):
                    torch.baddbmm(self.bias[start:end], x.expand(end - start, *x.shape),
                                  self.weight[start:end].transpose(1, 2), out=part[start:end])
                parts.append(part)
            out[name] = torch.cat(parts, dim=1) if parts else torch.empty(
                len(self.members), 0, self.weight.shape[1])
        return out

    def _kernel_predict(self):
        """predict() by the kernel (each head's logits as its training step computes
        them), the heads in `threads` parts."""
        first, heads = self.members[0], len(self.members)
        bounds = [heads * t // self.threads for t in range(self.threads + 1)]
        parts = list(zip(bounds, bounds[1:]))
        out = {}
        with ThreadPoolExecutor(self.threads) as pool:
            for name, _, _, split in first.named_splits:
                x = split.x if split.x is not None else torch.cat(list(
                    iterate_split(split, first.ctx.eval_batch_size, first.ctx.n_workers)))
                out[name] = torch.cat(list(pool.map(
                    functools.partial(self._kernel_logits, x), parts)))
        return out

    def _kernel_logits(self, x, heads):
        start, end = heads
        return probe_kernel.logits(self.kernel, x, self.weight[start:end], self.bias[start:end])

    @torch.no_grad()
    def write_back(self):
        """Each head's parameters and Adam state into its member's own objects, exactly
        as the single run would hold them (for model.pkl)."""
        for i, member in enumerate(self.members):
            head, optimizer = member.algorithm.classifier, member.algorithm.optimizer
            for name, param in (("weight", self.weight), ("bias", self.bias)):
                target = getattr(head, name)
                target.copy_(param[i].view_as(target))
                exp_avg, exp_avg_sq = self.moments[name]
                optimizer.state[target] = {
                    "step": torch.tensor(float(self.adam_steps[i])),
                    "exp_avg": exp_avg[i].view_as(target).clone(),
                    "exp_avg_sq": exp_avg_sq[i].view_as(target).clone()}

    def close(self):
        """Stop the training threads (a stack trains on after a drop, not after this)."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def drop(self, positions):
        """Remove heads (one that diverged, one whose disk is full); the others go on."""
        keep = [i for i in range(len(self.members)) if i not in set(positions)]
        index = torch.tensor(keep, dtype=torch.long)
        self.members = [self.members[i] for i in keep]
        self.lr = [self.lr[i] for i in keep]
        self.decay = [self.decay[i] for i in keep]
        self.adam_steps = [self.adam_steps[i] for i in keep]
        self.weight, self.bias = self.weight[index], self.bias[index]
        self.moments = {k: [t[index] for t in v] for k, v in self.moments.items()}
        self._layout()
