"""Linear probes trained as one stack: K heads on one frozen backbone's cached features.

On cached features (domainbed.training.feature_cache) a linear probe is one matrix and one
bias, so the K probes of a group are one (K, classes, features + 1) tensor: each head's
weight, and its bias as the weight of a feature that is always 1 (a column of ones beside
the cached features). Each step every head reads its own minibatch rows (the indices its
single run draws: its seed, its batch size, its environments' samplers) and takes its own
Adam step with its own learning rate and weight decay. At a checkpoint one pass over each
evaluated split gives every head's logits, and each member, an ordinary `TrainingRun`,
writes its own record and predictions.

Torch's operations alone, no Python loop over heads: per chunk of heads of one batch size
(their gathered rows a cache's worth), one gather of the rows by index into a kept
buffer, one batched product for the logits, the cross-entropy's log-softmax and its
backward, one batched product for the gradient; then one Adam step of every head.

A single linear-probe run on cached features trains as a stack of one (`TrainingRun`
does, where `why_not` accepts it), so a stacked head's record equals the run alone by
construction, because a head's numbers never depend on the other heads: a batched
product is one matrix product per head (the same call alone or among many), the
log-softmax and the sums over a head's rows run row by row, the Adam step is elementwise
and avoids the operations whose vectorised and scalar forms round differently (lerp, a
sum with a factor), and a checkpoint's logits come from blocks of EVAL_ROWS rows
whatever `--eval_batch_size` says. What differs between a stacked member and the run
alone: `step_time` (each head's share of the stack's step), `mem_gb` on a GPU, and no
resume state in a stack (a killed stack's members restart from step 0: a probe costs
seconds, a resume state would hold the whole frozen backbone). Against a probe that
computes its features every step (`--feature_cache_dir none`: autograd and
torch.optim.Adam, the `single` arithmetic) the records agree within float32 rounding
(docs/guide/backbones.md states the tolerance).

Supported: ERM (a probe's plain objective) with a linear head, no dropout, float32, no
unlabeled data, a constant learning rate, no gradient clipping, accumulation or early
stopping, one process. ``why_not(run)`` names what keeps a run out: such a run trains
through its algorithm's update, and the fused launcher runs it as an ordinary job.
"""
import functools
from typing import Any

import torch
import torch.nn as nn

from domainbed.training.bulk_sampling import draw_indices
from domainbed.training.evaluation import iterate_split

STACKABLE_ALGORITHMS = ("ERM",)
CHUNK_BYTES = 2 << 20  # gathered float32 rows per chunk of heads: in cache for both products
INDEX_STEPS = 32       # steps of minibatch indices drawn at once
EVAL_ROWS = 1024       # rows per product at a checkpoint (fixed: see the module docstring)
ADAM_HEADS = 64        # heads per block of the Adam step
ROW_ALIGN = 16         # a row of features, its 1 and zeros: a multiple of 16 float32 (64 bytes)


def why_not(run: Any) -> str | None:
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
def _minus_mean(rows: Any) -> Any:
    """-1 / rows in float32 (what the mean's backward divides), as a Python float."""
    return (torch.tensor(-1.0) / rows).item()


def _with_ones(x: torch.Tensor, width: Any) -> Any:
    """Rows [n, F] as [n, width], in x's dtype: the F features, a 1 (the bias's feature),
    then zeros (rows a multiple of ROW_ALIGN values long: aligned for the products)."""
    out = torch.zeros(len(x), width, dtype=x.dtype, device=x.device)
    out[:, :x.shape[1]] = x
    out[:, x.shape[1]] = 1
    return out


def _width(n_features: Any) -> Any:
    return -(-(n_features + 1) // ROW_ALIGN) * ROW_ALIGN


class ProbeStack:
    """Members (TrainingRuns of linear probes on one dataset's cached features, all at the
    same next step, sorted by batch size) trained as one stack of heads."""

    def __init__(self, members: Any) -> None:
        self.members = list(members)
        self.splits = self.members[0].minibatches.splits
        for m in self.members:
            if [s.x.data_ptr() for s in m.minibatches.splits] != \
                    [s.x.data_ptr() for s in self.splits]:
                raise ValueError("stacked probes must share their cached features")
        # every training row once, with a column of ones; float16 cached features stay
        # float16 (half the bytes gathered; widening to float32 is exact)
        table = torch.cat([s.x for s in self.splits])
        if table.dtype not in (torch.float16, torch.float32):
            table = table.float()
        self.n_features = table.shape[1]
        self.table = _with_ones(table, _width(self.n_features))
        self.labels = torch.cat([s.y for s in self.splits])
        sizes = [len(s.x) for s in self.splits]
        self.offsets = [sum(sizes[:e]) for e in range(len(sizes))]
        heads = [m.algorithm.classifier for m in self.members]
        weight = torch.stack([h.weight.detach() for h in heads]).float()
        self.params = torch.zeros(*weight.shape[:2], self.table.shape[1], device=weight.device)
        self.params[:, :, :self.n_features] = weight
        self.params[:, :, self.n_features] = torch.stack([h.bias.detach() for h in heads])
        self._load_adam()
        self._layout()

    def _load_adam(self) -> None:
        """Adam's moments and step counts from each member's optimizer (fresh or resumed)."""
        group = self.members[0].algorithm.optimizer.param_groups[0]
        self.betas, self.eps = group["betas"], group["eps"]
        self.lr = [m.algorithm.optimizer.param_groups[0]["lr"] for m in self.members]
        self.decay = [m.algorithm.optimizer.param_groups[0]["weight_decay"]
                      for m in self.members]
        self.exp_avg, self.exp_avg_sq = (torch.zeros_like(self.params) for _ in range(2))
        self.adam_steps = [0] * len(self.members)
        for i, member in enumerate(self.members):
            head, optimizer = member.algorithm.classifier, member.algorithm.optimizer
            for column, name in self._columns():
                state = optimizer.state.get(getattr(head, name))
                if state:
                    self.exp_avg[i, :, column] = state["exp_avg"]
                    self.exp_avg_sq[i, :, column] = state["exp_avg_sq"]
                    self.adam_steps[i] = int(float(state["step"]))

    def _columns(self) -> tuple[Any, ...]:
        """Where a head's weight and bias are in `params` (the rest: zeros)."""
        return (slice(0, self.n_features), "weight"), (self.n_features, "bias")

    def _layout(self) -> None:
        """Chunks of heads, work buffers, and no drawn indices yet (after a drop too)."""
        device = self.params.device
        self.rows_per_head = [m.hparams["batch_size"] * len(self.splits) for m in self.members]
        chunks = self.chunks(self.rows_per_head)
        self.groups = self.chunks(self.rows_per_head, limit=float("inf"))  # one a batch size
        self.layout = {g: [c for c in chunks if g[0] <= c[0] < g[1]] for g in self.groups}
        classes = self.params.shape[1]
        # per batch size: logits, log-probabilities and their upstream gradient [k, C, R]
        self._per_group = {(start, end): [torch.empty(end - start, classes,
                                                      self.rows_per_head[start], device=device)
                                          for _ in range(3)] for start, end in self.groups}
        self.decay_factors = torch.tensor(self.decay, dtype=torch.float32,
                                          device=device).view(-1, 1, 1)
        self.grad = torch.empty_like(self.params)
        self._scratch = (torch.empty_like(self.params), torch.empty_like(self.params))
        self.losses = torch.empty(len(self.members), device=device)
        rows = max(((end - start) * self.rows_per_head[start] for start, end in chunks),
                   default=0)
        self._rows = {dtype: torch.empty(rows, self.table.shape[1], dtype=dtype, device=device)
                      for dtype in {self.table.dtype, torch.float32}}
        # (start, end) -> (first step, rows [steps, heads, rows], labels)
        self._drawn: dict[Any, Any] = {}
        # per chunk of a group: its rows' place in the group, its parameters and gradient,
        # its logits, log-probabilities and upstream gradient (views made once)
        self._views: dict[Any, list[Any]]
        self._views = {g: [(slice(s - g[0], e - g[0]), self.params[s:e], self.grad[s:e],
                            *(t[s - g[0]:e - g[0]] for t in self._per_group[g]))
                           for s, e in self.layout[g]] for g in self.groups}

    def chunks(self, rows: Any, limit: Any = None) -> Any:
        """(start, end) ranges of heads: each within one batch size (members come sorted
        by it), with at most `limit` (default CHUNK_BYTES) bytes of gathered float32 rows
        (`rows[head]` each), at least one head."""
        out, start = [], 0
        width, limit = self.table.shape[1] * 4, limit or CHUNK_BYTES
        for k in range(1, len(self.members) + 1):
            full = (k + 1 - start) * rows[start] * width > limit
            if k == len(self.members) or full or rows[k] != rows[start]:
                out.append((start, k))
                start = k
        return out

    # ------------------------------------------------------------ one step
    def _draw(self, step: int, start: Any, end: Any) -> tuple[Any, ...]:
        """The table rows and labels [steps, heads, rows] of heads start..end (one batch
        size) for INDEX_STEPS steps from `step`: per head its environments' minibatch
        indices, each drawn as its own sampler draws them (bulk_sampling), plus each split's
        offset in the table."""
        steps = list(range(step, min(step + INDEX_STEPS, self.members[0].n_steps)))
        rows = torch.cat([
            draw_indices([m.minibatches.samplers[e] for m in self.members[start:end]], steps)
            + offset for e, offset in enumerate(self.offsets)], dim=2)
        rows = rows.to(self.table.device)
        return step, rows, self.labels.to(self.table.device)[rows]

    def _step_rows(self, step: int, group: Any) -> tuple[Any, ...]:
        """Rows and labels [heads, rows] of the heads of `group` (one batch size) at `step`
        (drawn INDEX_STEPS steps at a time)."""
        drawn = self._drawn.get(group)
        if drawn is None or not 0 <= step - drawn[0] < len(drawn[1]):
            drawn = self._drawn[group] = self._draw(step, *group)
        return drawn[1][step - drawn[0]], drawn[2][step - drawn[0]]

    @torch.no_grad()
    def train_step(self, step: int) -> Any:
        """One Adam step of every head; returns each head's loss (float)."""
        factors = self._adam_factors()
        for group in self.groups:
            self._gradients(step, group)
        self._adam(*factors)
        return self.losses.tolist()

    def _gradients(self, step: int, group: Any) -> None:
        """The heads of `group` (one batch size): their mean cross-entropy into `losses`
        and its gradient into `grad` (the weight's and, in the last column, the bias's),
        classes before rows ([k, C, R]): no transposed copies."""
        rows, y = self._step_rows(step, group)
        _, log_probs, upstream = self._per_group[group]
        y = y.unsqueeze(1)
        # -1/R at each label (the mean's and the gather's backward)
        upstream.zero_().scatter_(1, y, _minus_mean(rows.shape[1]))
        for at, params, grad, logits_k, log_probs_k, upstream_k in self._views[group]:
            x = self._gather(rows[at])                                  # [k, R, F + 1]
            torch.bmm(params, x.transpose(1, 2), out=logits_k)
            torch.log_softmax(logits_k, 1, out=log_probs_k)
            torch.ops.aten._log_softmax_backward_data.out(       # the logits' gradient
                upstream_k, log_probs_k, 1, torch.float32, out=logits_k)
            torch.bmm(logits_k, x, out=grad)
        torch.neg(log_probs.gather(1, y).squeeze(1).mean(1), out=self.losses[group[0]:group[1]])

    def _gather(self, rows: Any) -> Any:
        """The table's rows [heads, rows] as float32 [heads, rows, F + 1], in the kept
        buffer (float16 gathered as such, then widened in place)."""
        n = rows.numel()
        out = self._rows[torch.float32][:n]
        if self.table.dtype == torch.float32:
            torch.index_select(self.table, 0, rows.reshape(-1), out=out)
        else:
            out.copy_(torch.index_select(self.table, 0, rows.reshape(-1),
                                         out=self._rows[self.table.dtype][:n]))
        return out.view(*rows.shape, -1)

    def _adam_factors(self) -> Any:
        """Each head's step size (-lr / (1 - beta1^t)) and sqrt(1 - beta2^t) of this step
        (Python floats, as torch.optim.Adam computes them), as float32 [heads, 1, 1]."""
        beta1, beta2 = self.betas
        self.adam_steps = [s + 1 for s in self.adam_steps]
        step_size = [-(lr / (1 - beta1 ** s)) for lr, s in zip(self.lr, self.adam_steps)]
        bias2_sqrt = [(1 - beta2 ** s) ** 0.5 for s in self.adam_steps]
        return (torch.tensor(v, dtype=torch.float32, device=self.params.device).view(-1, 1, 1)
                for v in (step_size, bias2_sqrt))

    def _adam(self, step_size: Any, bias2_sqrt: Any) -> None:
        """Adam (torch.optim.Adam's update, weight decay added to the gradient) of every
        head, each operation rounding once per element (no lerp, no sum with a factor)."""
        beta1, beta2 = self.betas
        grad, param, exp_avg, exp_avg_sq = self.grad, self.params, self.exp_avg, self.exp_avg_sq
        for start in range(0, len(param), ADAM_HEADS):   # a block's tensors stay in cache
            at = slice(start, start + ADAM_HEADS)
            g, p, m, v = grad[at], param[at], exp_avg[at], exp_avg_sq[at]
            scratch, update = (t[at] for t in self._scratch)
            g.add_(torch.mul(p, self.decay_factors[at], out=scratch))
            m.mul_(beta1).add_(torch.mul(g, 1 - beta1, out=scratch))
            v.mul_(beta2).add_(torch.mul(g, g, out=scratch).mul_(1 - beta2))
            denom = torch.sqrt(v, out=scratch).div_(bias2_sqrt[at]).add_(self.eps)
            p.add_(torch.mul(m, step_size[at], out=update).div_(denom))

    # ------------------------------------------------------------ evaluation, write-back
    @torch.no_grad()
    def predict(self) -> dict[str, torch.Tensor]:
        """{split name: logits [heads, n, classes]} of every evaluated split, EVAL_ROWS
        rows per product."""
        first, heads = self.members[0], len(self.members)
        out = {}
        for name, _, _, split in first.named_splits:
            blocks = list(iterate_split(split, first.ctx.eval_batch_size, first.ctx.n_workers))
            x = torch.cat(blocks) if blocks else torch.empty(0, self.n_features)
            parts = []
            for start in range(0, len(x), EVAL_ROWS):
                block = _with_ones(x[start:start + EVAL_ROWS].to(self.params.device).float(),
                                   self.table.shape[1])
                logits = torch.bmm(self.params, block.t().expand(heads, *block.t().shape))
                parts.append(logits.transpose(1, 2))
            out[name] = torch.cat(parts, dim=1).cpu() if parts else torch.empty(
                heads, 0, self.params.shape[1])
        return out

    @torch.no_grad()
    def write_back(self) -> None:
        """Each head's parameters and Adam state into its member's own objects, exactly
        as the single run would hold them (for model.pkl)."""
        for i, member in enumerate(self.members):
            head, optimizer = member.algorithm.classifier, member.algorithm.optimizer
            for column, name in self._columns():
                target = getattr(head, name)
                target.copy_(self.params[i, :, column])
                optimizer.state[target] = {
                    "step": torch.tensor(float(self.adam_steps[i])),
                    "exp_avg": self.exp_avg[i, :, column].clone(),
                    "exp_avg_sq": self.exp_avg_sq[i, :, column].clone()}

    def drop(self, positions: Any) -> None:
        """Remove heads (one that diverged, one whose disk is full); the others go on."""
        keep = [i for i in range(len(self.members)) if i not in set(positions)]
        index = torch.tensor(keep, dtype=torch.long, device=self.params.device)
        self.members = [self.members[i] for i in keep]
        self.lr = [self.lr[i] for i in keep]
        self.decay = [self.decay[i] for i in keep]
        self.adam_steps = [self.adam_steps[i] for i in keep]
        self.params, self.exp_avg, self.exp_avg_sq = (
            t[index] for t in (self.params, self.exp_avg, self.exp_avg_sq))
        self._layout()
