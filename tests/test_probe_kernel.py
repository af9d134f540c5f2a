"""The compiled kernel of linear heads on cached features (domainbed.training.probe_kernel):
its losses, gradients, Adam steps and logits against float64 autograd and torch.optim.Adam,
a head's bits independent of the other heads of a call, and torch's operations where no
kernel can be built."""
import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from domainbed.training import probe_kernel
from tests.requirements import need_probe_kernel


@pytest.fixture
def lib():
    return need_probe_kernel()


def _heads(K, C, n_features, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (0.1 * torch.randn(K, C, n_features, generator=g),
            0.1 * torch.randn(K, 1, C, generator=g))


def _batch(K, R, N, C, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(N, (K, R), generator=g), torch.randint(C, (K, R), generator=g)


def _reference(table, rows, labels, weight, bias):
    """float64 autograd: each head's mean cross-entropy and its gradients."""
    w, b = weight.double().requires_grad_(), bias.double().requires_grad_()
    logits = torch.baddbmm(b, table.double()[rows], w.transpose(1, 2))
    loss = torch.stack([F.cross_entropy(logits[k], labels[k]) for k in range(len(w))])
    loss.sum().backward()
    return loss.detach(), w.grad, b.grad


@pytest.mark.parametrize("C, n_features, dtype", [(2, 1280, torch.float16), (7, 37, torch.float32),
                                                  (1, 20, torch.float16),
                                                  (3, 16, torch.float32)])
def test_losses_and_gradients_are_the_mean_cross_entropys(lib, C, n_features, dtype):
    table = torch.randn(50, n_features, generator=torch.Generator().manual_seed(2)).to(dtype)
    rows, labels = _batch(5, 13, 50, C)
    weight, bias = _heads(5, C, n_features)
    loss, grad_w, grad_b = probe_kernel.gradients(lib, table, rows, labels, weight, bias)
    ref_loss, ref_w, ref_b = _reference(table, rows, labels, weight, bias)
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad_w.double(), ref_w, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(grad_b.double(), ref_b, rtol=1e-4, atol=1e-6)
    logits = probe_kernel.logits(lib, table, weight, bias)
    expected = torch.baddbmm(bias.double(), table.double().expand(5, -1, -1),
                             weight.double().transpose(1, 2))
    torch.testing.assert_close(logits.double(), expected, rtol=1e-5, atol=1e-5)


def test_a_label_out_of_range_is_refused(lib):
    table = torch.randn(4, 8)
    weight, bias = _heads(1, 2, 8)
    with pytest.raises(ValueError, match="class range"):
        probe_kernel.gradients(lib, table, torch.zeros(1, 2, dtype=torch.long),
                               torch.tensor([[0, 2]]), weight, bias)


def _adam_factors(lrs, decays, t, betas=(0.9, 0.999)):
    step = torch.tensor([-(lr / (1 - betas[0] ** t)) for lr in lrs])
    bias2 = torch.tensor([(1 - betas[1] ** t) ** 0.5 for _ in lrs])
    return torch.tensor(decays, dtype=torch.float32), step, bias2


def test_adam_steps_follow_torch_optim_adam(lib):
    """Three steps of two heads (one with weight decay) against torch.optim.Adam on the
    float64 autograd loss: the same trajectory within float32 rounding."""
    table = torch.randn(40, 24, generator=torch.Generator().manual_seed(3))
    weight, bias = _heads(2, 3, 24)
    lrs, decays = [1e-2, 3e-3], [0.0, 1e-2]
    params = (weight.clone(), bias.clone())
    moments = {"weight": [torch.zeros_like(weight), torch.zeros_like(weight)],
               "bias": [torch.zeros_like(bias), torch.zeros_like(bias)]}
    ref = [(weight[k].double().clone().requires_grad_(), bias[k].double().clone()
            .requires_grad_()) for k in range(2)]
    optimizers = [torch.optim.Adam(ref[k], lr=lrs[k], weight_decay=decays[k]) for k in range(2)]
    for t in range(1, 4):
        rows, labels = _batch(2, 9, 40, 3, seed=t)
        loss = probe_kernel.train(lib, table, rows, labels, params, moments,
                                  _adam_factors(lrs, decays, t), (0.9, 0.999), 1e-8)
        for k, (w, b) in enumerate(ref):
            optimizers[k].zero_grad()
            ref_loss = F.cross_entropy(table.double()[rows[k]] @ w.T + b[0], labels[k])
            ref_loss.backward()
            optimizers[k].step()
            assert float(loss[k]) == pytest.approx(ref_loss.item(), rel=1e-5)
    for k, (w, b) in enumerate(ref):
        torch.testing.assert_close(params[0][k].double(), w.detach(), rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(params[1][k].double(), b.detach(), rtol=1e-4, atol=1e-6)


def test_a_heads_bits_do_not_depend_on_the_other_heads(lib):
    """One head trained alone, third of five and 322nd of 500 (the others random): the
    same loss, parameters and moments, bit for bit."""
    table = torch.randn(60, 40, generator=torch.Generator().manual_seed(4)).half()
    mine_w, mine_b = _heads(1, 3, 40, seed=10)
    mine_rows, mine_labels = _batch(1, 11, 60, 3, seed=11)

    def train(K, position):
        weight, bias = _heads(K, 3, 40, seed=K)
        rows, labels = _batch(K, 11, 60, 3, seed=K + 1)
        weight[position], bias[position] = mine_w[0], mine_b[0]
        rows[position], labels[position] = mine_rows[0], mine_labels[0]
        moments = {"weight": [torch.zeros_like(weight), torch.zeros_like(weight)],
                   "bias": [torch.zeros_like(bias), torch.zeros_like(bias)]}
        losses = []
        for t in (1, 2):
            lrs = [1e-2 if k == position else 3e-3 * (k + 1) for k in range(K)]
            factors = _adam_factors(lrs, [1e-3 if k == position else 0.0 for k in range(K)], t)
            losses.append(probe_kernel.train(lib, table, rows, labels, (weight, bias),
                                             moments, factors, (0.9, 0.999), 1e-8)[position])
        return [weight[position], bias[position], *(m[position] for v in moments.values()
                                                    for m in v), torch.stack(losses)]

    alone = train(1, 0)
    for K, position in ((5, 2), (500, 321)):
        for got, expected in zip(train(K, position), alone, strict=True):
            assert torch.equal(got, expected)


def test_without_a_compiler_or_on_request_torch_operations_train(monkeypatch, capsys,
                                                                 tmp_path):
    probe_kernel.load.cache_clear()
    try:
        monkeypatch.setenv("DOMAINBED_PROBE_KERNEL", "torch")
        assert probe_kernel.load() is None
        probe_kernel.load.cache_clear()
        monkeypatch.delenv("DOMAINBED_PROBE_KERNEL")
        monkeypatch.setenv("CC", "no-such-compiler-here")
        assert probe_kernel.load() is None
        probe_kernel.load.cache_clear()
        monkeypatch.setenv("CC", "false")   # a compiler that fails
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
        assert probe_kernel.load() is None
        assert "warning: the probe kernel was not built" in capsys.readouterr().err
    finally:
        probe_kernel.load.cache_clear()


def test_a_library_others_can_write_is_never_loaded(tmp_path, monkeypatch):
    """A cache folder or a cached library writable by another user is not trusted: the
    kernel is built afresh (a private temporary folder, or over the planted file)."""
    need_probe_kernel()
    compiler = shutil.which("cc")
    kernels = tmp_path / "oodbed" / "kernels"
    kernels.mkdir(parents=True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    built = probe_kernel._compile(compiler, probe_kernel.BASE_FLAGS)
    assert os.path.dirname(built) == str(kernels)
    planted = b"not a library"
    Path(built).write_bytes(planted)
    os.chmod(built, 0o666)           # another user could have written it
    again = probe_kernel._compile(compiler, probe_kernel.BASE_FLAGS)
    assert again == built and Path(again).read_bytes() != planted
    assert oct(os.stat(again).st_mode & 0o777) == oct(0o700)
    os.chmod(kernels, 0o777)         # a folder anyone can write
    elsewhere = probe_kernel._compile(compiler, probe_kernel.BASE_FLAGS)
    assert os.path.dirname(elsewhere) != str(kernels)
    assert probe_kernel._private(elsewhere)
