"""Every model: per-sample outputs, gradients everywhere, seeded, both precisions."""
import pytest
import torch

from hybrid.config import ModelConfig, ModelName, Precision
from hybrid.models import build_model

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
