"""A run's own random generators: swapped in and out, so runs sharing one process draw
what each would draw alone."""
import random

import numpy as np
import torch

from domainbed.training.random_states import RandomStates


def _draw():
    return (torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random()
                                                                 for _ in range(3)])


def test_each_run_draws_what_it_draws_alone_and_the_outside_is_untouched():
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    alone = [_draw(), _draw()]
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    first = RandomStates.capture()
    torch.manual_seed(2), np.random.seed(2), random.seed(2)
    second = RandomStates.capture()
    outside = RandomStates.capture()
    interleaved = []
    for _ in range(2):
        with first.active():
            interleaved.append(_draw())
        with second.active():
            _draw()
    assert interleaved == alone
    assert RandomStates.capture() == outside
    assert first != outside
