"""Minibatch indices of many samplers drawn at once (domainbed.training.bulk_sampling) are
the indices each BatchSampler draws alone with its own torch generator; the twister in
numpy is numpy's own MT19937."""
import numpy as np
import pytest
import torch

from domainbed.training import bulk_sampling
from domainbed.training.batches import BatchSampler


def _alone(samplers, steps):
    return torch.stack([torch.stack([s.indices(step) for s in samplers]) for step in steps])


def test_the_twister_is_numpys_mt19937():
    seeds = [0, 1, 5489, 123456789, 2 ** 31 - 1, 2 ** 32 - 1]
    ours = bulk_sampling.mt19937_outputs(seeds, bulk_sampling.MAX_COUNT)
    for seed, row in zip(seeds, ours):
        reference = np.random.MT19937()
        reference._legacy_seeding(seed)   # init_genrand, as std::mt19937(seed)
        np.testing.assert_array_equal(row, reference.random_raw(bulk_sampling.MAX_COUNT))
    with pytest.raises(ValueError, match="count"):
        bulk_sampling.mt19937_outputs(seeds, bulk_sampling.MAX_COUNT + 1)


@pytest.mark.parametrize("batch", [1, 7, 32, 128])
def test_bulk_draws_equal_each_samplers_own(batch):
    samplers = [BatchSampler(torch.zeros(n), batch, seed, env)
                for n, seed, env in [(1333, 0, 1), (1334, 7, 2), (2, 123, 0), (50000, 9, 1)]]
    steps = [0, 1, 2, 999, 5000]
    drawn = bulk_sampling.draw_indices(samplers, steps)
    assert drawn.dtype == torch.int64
    assert torch.equal(drawn, _alone(samplers, steps))


def test_weighted_and_large_ranges_draw_alone_with_the_same_result():
    split = torch.zeros(100)
    weighted = BatchSampler(split, 8, 3, 1, weights=torch.rand(100))
    huge = BatchSampler(torch.zeros(0), 8, 4, 1)
    huge.n = 2 ** 31 - 1                       # a range torch draws with 64 bits
    assert not bulk_sampling.bulk_draw_matches_torch(huge.n, 8)
    samplers = [BatchSampler(split, 8, 1, 0), weighted, huge, BatchSampler(split, 8, 2, 0)]
    assert torch.equal(bulk_sampling.draw_indices(samplers, [3, 4]), _alone(samplers, [3, 4]))


def test_samplers_of_different_batch_sizes_are_refused():
    samplers = [BatchSampler(torch.zeros(10), 4, 0, 0), BatchSampler(torch.zeros(10), 8, 0, 0)]
    with pytest.raises(ValueError, match="one batch size"):
        bulk_sampling.draw_indices(samplers, [0])
