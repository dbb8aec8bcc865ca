"""The recommendation models: dense features and per-table embeddings -> a logit.

Every model maps ``dense`` [B, n_dense] and ``emb`` [B, n_tables, dim] (the
embedding row of each table for each sample, gathered from the worker's
cache) to one logit per sample. No layer mixes samples (no batch norm), so a
global batch split over workers computes exactly what one process would:
the BSP equivalence the project is built on (docs/design.md section 9).

Notation: ``x`` = dense features, ``e_t`` = embedding of table ``t``,
``MLP`` = Linear+ReLU layers (the last layer of a tower is linear).

- DLRM:      ``z = MLP_bot(x)``; ``logit = MLP_top([z, <z,e_1>, <e_i,e_j> for i<j])``
- Wide&Deep: ``logit = w . [x, e] + MLP([x, e])``             (``e`` = all e_t concatenated)
- DeepFM:    ``logit = w . [x, e] + FM(e_1..e_T, Wx) + MLP([x, e])``, ``FM = 1/2 sum_d((sum v)^2 - sum v^2)``
- DCN:       ``x0 = [x, e]``, ``x_{l+1} = x0 * (x_l . w_l) + b_l + x_l``; ``logit = w . [x_L, MLP(x0)]``
- NCF:       ``logit = w . [e_1 * e_2 * ... * e_T, MLP([e_1, .., e_T])]``  (NeuMF: GMF + MLP)
"""
from __future__ import annotations

import torch
from torch import nn

from hybrid.config import ModelConfig, ModelName


def mlp(widths: list[int], last_activation: bool = True) -> nn.Sequential:
    """Linear layers of the given widths (input first) with ReLU between them."""
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(nn.Linear(fan_in, fan_out))
        if last_activation or i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, n_dense: int, n_tables: int, dim: int, bottom: list[int], top: list[int]):
        super().__init__()
        self.bottom = mlp([n_dense, *bottom, dim]) if n_dense else None
        n_vectors = n_tables + (1 if n_dense else 0)
        n_pairs = n_vectors * (n_vectors - 1) // 2
        self.top = mlp([n_pairs + (dim if n_dense else 0), *top, 1], last_activation=False)
        rows, cols = torch.triu_indices(n_vectors, n_vectors, offset=1)
        self.register_buffer("pair_rows", rows, persistent=False)
        self.register_buffer("pair_cols", cols, persistent=False)

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        vectors = emb
        if self.bottom is not None:
            z = self.bottom(dense)
            vectors = torch.cat([z.unsqueeze(1), emb], dim=1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, self.pair_rows, self.pair_cols]
        features = torch.cat([z, dots], dim=1) if self.bottom is not None else dots
        return self.top(features).squeeze(1)


class WideAndDeep(nn.Module):
    def __init__(self, n_dense: int, n_tables: int, dim: int, bottom: list[int], top: list[int]):
        super().__init__()
        width = n_dense + n_tables * dim
        self.wide = nn.Linear(width, 1)
        self.deep = mlp([width, *top, 1], last_activation=False)

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        x = torch.cat([dense, emb.flatten(1)], dim=1)
        return (self.wide(x) + self.deep(x)).squeeze(1)


class DeepFM(nn.Module):
    def __init__(self, n_dense: int, n_tables: int, dim: int, bottom: list[int], top: list[int]):
        super().__init__()
        width = n_dense + n_tables * dim
        self.first_order = nn.Linear(width, 1)
        self.dense_field = nn.Linear(n_dense, dim, bias=False) if n_dense else None
        self.deep = mlp([width, *top, 1], last_activation=False)

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        x = torch.cat([dense, emb.flatten(1)], dim=1)
        fields = emb if self.dense_field is None else torch.cat([self.dense_field(dense).unsqueeze(1), emb], 1)
        fm = 0.5 * (fields.sum(1).pow(2) - fields.pow(2).sum(1)).sum(1, keepdim=True)
        return (self.first_order(x) + fm + self.deep(x)).squeeze(1)


class DCN(nn.Module):
    def __init__(self, n_dense: int, n_tables: int, dim: int, bottom: list[int], top: list[int],
                 cross_layers: int = 3):
        super().__init__()
        width = n_dense + n_tables * dim
        self.cross_w = nn.ParameterList([nn.Parameter(torch.randn(width) / width ** 0.5)
                                         for _ in range(cross_layers)])
        self.cross_b = nn.ParameterList([nn.Parameter(torch.zeros(width)) for _ in range(cross_layers)])
        self.deep = mlp([width, *top])
        self.out = nn.Linear(width + top[-1] if top else 2 * width, 1)

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        x0 = torch.cat([dense, emb.flatten(1)], dim=1)
        x = x0
        for w, b in zip(self.cross_w, self.cross_b):
            x = x0 * (x @ w).unsqueeze(1) + b + x
        return self.out(torch.cat([x, self.deep(x0)], dim=1)).squeeze(1)


class NCF(nn.Module):
    def __init__(self, n_dense: int, n_tables: int, dim: int, bottom: list[int], top: list[int]):
        super().__init__()
        if n_tables < 2:
            raise ValueError(f"NCF needs at least a user and an item table, got {n_tables} table(s)")
        self.mlp = mlp([n_tables * dim, *top])
        self.out = nn.Linear(dim + (top[-1] if top else n_tables * dim), 1)

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        gmf = emb.prod(dim=1)
        return self.out(torch.cat([gmf, self.mlp(emb.flatten(1))], dim=1)).squeeze(1)


MODELS = {ModelName.dlrm: DLRM, ModelName.wide_deep: WideAndDeep, ModelName.deepfm: DeepFM,
          ModelName.dcn: DCN, ModelName.ncf: NCF}


def dense_optimizer(config, parameters) -> torch.optim.Optimizer:
    """The configured optimizer of the MLP parameters (embeddings: ``hybrid.embedding_optimizer``)."""
    return _EAGER[config.train.dense_optimizer.value](parameters, lr=config.train.dense_lr)


def _eager(cls: type[torch.optim.Optimizer]) -> type[torch.optim.Optimizer]:
    """``cls`` without the guards torch puts around its optimizers for ``torch.compile``.

    The first call of a guarded method (the constructor's ``add_param_group``,
    ``step``) imports ``torch._dynamo``: 2.8 s of CPU on every worker of every
    job here, before its first iteration, and nothing here is compiled. These are
    torch's own methods (the functions the guards wrap), the step run with
    gradients off as the guard runs it, so the results are torch's bit for bit
    (tests/unit/test_models.py). A torch whose methods are not wrapped that way
    keeps its classes.
    """
    guarded = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")
    if not all(hasattr(getattr(torch.optim.Optimizer, name), "__wrapped__") for name in guarded) \
            or not hasattr(cls.step, "__wrapped__"):
        return cls
    raw_step = cls.step.__wrapped__

    def step(self, closure=None):
        enabled = torch.is_grad_enabled()
        torch.set_grad_enabled(self.defaults["differentiable"])
        try:
            return raw_step(self, closure)
        finally:
            torch.set_grad_enabled(enabled)

    methods = {name: getattr(torch.optim.Optimizer, name).__wrapped__ for name in guarded}
    return type(cls.__name__, (cls,), {**methods, "step": step, "__doc__": cls.__doc__})


_EAGER = {"sgd": _eager(torch.optim.SGD), "adagrad": _eager(torch.optim.Adagrad), "adam": _eager(torch.optim.Adam)}


def build_model(config: ModelConfig, *, n_dense: int, n_tables: int, seed: int) -> nn.Module:
    """The configured model, initialized from ``seed`` (identical on every worker) in its precision."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = MODELS[config.name](n_dense, n_tables, config.embedding_dim, list(config.bottom_mlp),
                                    list(config.top_mlp))
    finally:
        torch.random.set_rng_state(generator_state)
    return model.to(getattr(torch, config.precision.value))
