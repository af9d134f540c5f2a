"""Many BatchSamplers' minibatch indices at once, equal to what each draws alone.

A `BatchSampler` seeds its own torch generator for every (seed, env, step) and draws
`torch.randint(n, (batch,))`: about 10 microseconds of Python and generator set-up per draw,
which is most of a step for a stack of 500 linear probes. Torch's CPU generator is the
32-bit Mersenne Twister (mt19937) seeded by the standard `init_genrand`, and for a small
range its `randint` takes each 32-bit output modulo `n`; here the twister runs in numpy
for thousands of seeds at once (one vector operation per state word, over every seed), so
a block of steps of every sampler costs a few numpy passes instead of thousands of calls.

Whether torch's `randint` really is "mt19937 output modulo n" for a given `n` is checked
against torch itself the first time that `n` is used (`bulk_draw_matches_torch`); where it is
not (a range where torch draws 64 bits, another torch), or a sampler draws weighted indices
(`torch.multinomial`), each sampler draws its own, as before. Same numbers either way.
"""
import functools
from typing import Any

import numpy as np
import torch

from domainbed.hparams import seed_hash

MT_N, MT_M = 624, 397
MAX_COUNT = MT_N - MT_M   # outputs computable from the seeded state without a second twist
MAX_BULK_RANGE = 1 << 24  # ranges checked by bulk_draw_matches_torch (larger: per sampler)
_U32 = np.uint32


def mt19937_outputs(seeds: Any, count: Any) -> Any:
    """The first `count` 32-bit outputs of mt19937 seeded (init_genrand) with each of
    `seeds`: array [len(seeds), count] of uint32 (a transposed view). `count` at most 227."""
    if not 0 < count <= MAX_COUNT:
        raise ValueError(f"count must be in 1..{MAX_COUNT}, got {count}")
    word = (np.asarray(seeds, dtype=np.uint64) & 0xFFFFFFFF).astype(_U32)
    first, middle = np.empty((count + 1, len(word)), _U32), np.empty((count, len(word)), _U32)
    first[0] = word
    with np.errstate(over="ignore"):
        for j in range(1, MT_M + count):   # state[j] = 1812433253 * (s ^ (s >> 30)) + j
            word = _U32(1812433253) * (word ^ (word >> _U32(30))) + _U32(j)
            if j <= count:
                first[j] = word
            if j >= MT_M:
                middle[j - MT_M] = word
    # the first twist (output j needs state words j, j + 1, j + 397), then tempering;
    # in place, with two scratch arrays: fresh megabytes per operation would cost page faults
    y, scratch, odd = middle, first[:-1] & _U32(0x80000000), first[1:] & _U32(0x7FFFFFFF)
    scratch |= odd
    scratch >>= _U32(1)
    y ^= scratch
    np.bitwise_and(first[1:], _U32(1), out=odd)
    odd *= _U32(0x9908B0DF)
    y ^= odd
    for shift, mask in ((-11, None), (7, 0x9D2C5680), (15, 0xEFC60000), (-18, None)):
        if shift < 0:
            np.right_shift(y, _U32(-shift), out=scratch)
        else:
            np.left_shift(y, _U32(shift), out=scratch)
            scratch &= _U32(mask)  # type: ignore[arg-type]
        y ^= scratch
    return y.T


@functools.lru_cache(maxsize=None)
def bulk_draw_matches_torch(n: Any, count: Any) -> bool:
    """Whether this torch's `randint(n, (count,))` on a freshly seeded CPU generator is the
    twister's outputs modulo n (checked on a few seeds, once per (n, count))."""
    if n > MAX_BULK_RANGE or not 0 < count <= MAX_COUNT:
        return False
    seeds = [0, 1, 12345, 2 ** 31 - 1, 987654321]
    generator = torch.Generator()
    mine = mt19937_outputs(seeds, count).astype(np.int64) % n
    for seed, row in zip(seeds, mine):
        generator.manual_seed(seed)
        if not np.array_equal(torch.randint(n, (count,), generator=generator).numpy(), row):
            return False
    return True


def _bulk_ready(sampler: Any) -> Any:
    return sampler.weights is None and bulk_draw_matches_torch(sampler.n, sampler.batch_size)


def draw_indices(samplers: Any, steps: Any) -> Any:
    """Indices [len(steps), len(samplers), batch] (int64), row [t, i] equal to
    `samplers[i].indices(steps[t])`; the samplers share one batch size."""
    sizes = {s.batch_size for s in samplers}
    if len(sizes) != 1:
        raise ValueError(f"samplers of one batch size only, got {sorted(sizes)}")
    batch = sizes.pop()
    bulk = [i for i, s in enumerate(samplers) if _bulk_ready(s)]
    if len(bulk) == len(samplers):
        return torch.from_numpy(_bulk(samplers, steps, batch))
    out = np.empty((len(steps), len(samplers), batch), np.int64)
    if bulk:
        out[:, bulk] = _bulk([samplers[i] for i in bulk], steps, batch)
    for i in sorted(set(range(len(samplers))) - set(bulk)):
        for t, step in enumerate(steps):
            out[t, i] = samplers[i].indices(step).numpy()
    return torch.from_numpy(out)


def _bulk(samplers: Any, steps: Any, batch: Any) -> Any:
    seeds = [seed_hash(s.seed, s.env_i, step) for step in steps for s in samplers]
    words = mt19937_outputs(seeds, batch).reshape(len(steps), len(samplers), batch)
    ranges = np.array([s.n for s in samplers], _U32).reshape(1, -1, 1)
    return (words % ranges).astype(np.int64)   # n < 2 ** 24: the remainder in 32 bits
