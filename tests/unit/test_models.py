"""Every model: per-sample outputs, gradients everywhere, seeded, both precisions; the dense optimizers."""
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from hybrid.config import DenseOptimizer, ModelConfig, ModelName, Precision
from hybrid.models import build_model, dense_optimizer

CASES = [(name, n_dense) for name in ModelName for n_dense in (0, 13) if not (name is ModelName.ncf and n_dense)]


def _inputs(n_dense, n_tables=4, dim=8, batch=10, dtype=torch.float64):
    torch.manual_seed(1)
    return torch.randn(batch, n_dense, dtype=dtype), torch.randn(batch, n_tables, dim, dtype=dtype)


def _model(name, n_dense, precision=Precision.float64, seed=0):
    config = ModelConfig(name=name, embedding_dim=8, bottom_mlp=[16], top_mlp=[16, 8], precision=precision)
    return build_model(config, n_dense=n_dense, n_tables=4, seed=seed)


@pytest.mark.parametrize("name, n_dense", CASES)
def test_samples_are_independent_so_batches_can_be_split(name, n_dense):
    model = _model(name, n_dense)
    dense, emb = _inputs(n_dense)
    whole = model(dense, emb)
    assert whole.shape == (10,)
    halves = torch.cat([model(dense[:3], emb[:3]), model(dense[3:], emb[3:])])
    assert torch.allclose(whole, halves, rtol=0, atol=1e-12)
    perm = torch.randperm(10)
    assert torch.allclose(model(dense[perm], emb[perm]), whole[perm], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name, n_dense", CASES)
def test_gradients_reach_embeddings_and_every_parameter(name, n_dense):
    model = _model(name, n_dense)
    dense, emb = _inputs(n_dense)
    emb.requires_grad_(True)
    model(dense, emb).sum().backward()
    assert emb.grad is not None and emb.grad.abs().sum() > 0
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname


@pytest.mark.parametrize("name", list(ModelName))
def test_construction_is_seeded_and_precision_applies(name):
    n_dense = 0 if name is ModelName.ncf else 13
    before = torch.random.get_rng_state()
    pa, pb, pc = (torch.cat([p.flatten() for p in _model(name, n_dense, seed=s).parameters()]) for s in (3, 3, 4))
    assert torch.equal(torch.random.get_rng_state(), before)  # the caller's RNG is left alone
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)
    assert pa.dtype == torch.float64
    assert _model(name, 0, Precision.float32).forward(*_inputs(0, dtype=torch.float32)).dtype == torch.float32


def test_ncf_needs_two_tables():
    config = ModelConfig(name=ModelName.ncf, embedding_dim=8, top_mlp=[8])
    with pytest.raises(ValueError, match="user and an item"):
        build_model(config, n_dense=0, n_tables=1, seed=0)


def _trained_with(make_optimizer):
    """A DLRM's parameters after 4 steps, a state_dict round trip (as a resume does) and 3 more."""
    model = _model(ModelName.dlrm, 13)
    optimizer = make_optimizer(model.parameters())
    dense, emb = _inputs(13)
    for step in range(7):
        if step == 4:
            state = optimizer.state_dict()
            optimizer = make_optimizer(model.parameters())
            optimizer.load_state_dict(state)
        optimizer.zero_grad()
        torch.sigmoid(model(dense, emb)).square().mean().backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("name", [o.value for o in DenseOptimizer])
def test_the_dense_optimizers_are_torchs_bit_for_bit(name):
    config = SimpleNamespace(train=SimpleNamespace(dense_optimizer=DenseOptimizer(name), dense_lr=0.05))
    torch_class = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam}[name]
    ours = _trained_with(lambda params: dense_optimizer(config, params))
    torchs = _trained_with(lambda params: torch_class(params, lr=0.05))
    assert all(torch.equal(a, b) for a, b in zip(ours, torchs))
    untrained = [p.detach() for p in _model(ModelName.dlrm, 13).parameters()]
    assert not all(torch.equal(a, b) for a, b in zip(ours, untrained)), "the steps must change the model"


def test_a_worker_never_imports_torch_dynamo():
    """What torch.optim's guards import on first use costs every worker 2.8 s of CPU at start-up."""
    script = """
import sys, torch
from types import SimpleNamespace
from hybrid.config import DenseOptimizer
from hybrid.models import dense_optimizer
for name in DenseOptimizer:
    model = torch.nn.Linear(3, 1)
    config = SimpleNamespace(train=SimpleNamespace(dense_optimizer=name, dense_lr=0.1))
    optimizer = dense_optimizer(config, model.parameters())
    model(torch.ones(2, 3)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    optimizer.load_state_dict(optimizer.state_dict())
print(sorted(m for m in sys.modules if m.startswith("torch._dynamo")))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
