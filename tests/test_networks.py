"""Networks: ResNet batch-norm handling (frozen with pretrained weights, as DomainBed;
trained from scratch) and loading ImageNet weights from a local file."""
import torch
import torchvision

from domainbed.networks import ResNet


def _hparams(**kw):
    return {"resnet18": True, "resnet_dropout": 0.0, "pretrained": False,
            "pretrained_path": "", **kw}


def _bn_layers(net):
    return [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)]


def test_resnet_from_scratch_trains_its_batch_norm():
    torch.manual_seed(0)
    net = ResNet((3, 32, 32), _hparams()).train()
    assert all(bn.training for bn in _bn_layers(net))
    before = _bn_layers(net)[0].running_mean.clone()
    net(torch.randn(4, 3, 32, 32) + 3.0)
    assert not torch.equal(before, _bn_layers(net)[0].running_mean)
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 512)


def test_resnet_with_local_pretrained_weights_loads_them_and_freezes_batch_norm(tmp_path):
    torch.manual_seed(1)
    reference = torchvision.models.resnet18(weights=None)
    for bn in _bn_layers(reference):
        bn.running_mean.uniform_(-1, 1)
    path = tmp_path / "my_resnet18.pth"
    torch.save(reference.state_dict(), path)
    net = ResNet((3, 32, 32), _hparams(pretrained=True, pretrained_path=str(path))).train()
    assert not any(bn.training for bn in _bn_layers(net))
    torch.testing.assert_close(net.network.conv1.weight, reference.conv1.weight)
    stats = _bn_layers(net)[0].running_mean.clone()
    net(torch.randn(4, 3, 32, 32) + 3.0)
    torch.testing.assert_close(_bn_layers(net)[0].running_mean, stats)
