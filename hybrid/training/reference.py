"""The single-process reference: plain torch on the whole global batch.

This is what every BSP mode must reproduce exactly (docs/design.md section 9):
the same initial embeddings and MLP, the same global batches in the same
order (epoch after epoch), the mean loss over the global batch, the
configured optimizers (SGD, or row-wise Adagrad, for embeddings:
``hybrid.embedding_optimizer``) at each iteration's rates (``hybrid.lr_schedule``).
"""
from __future__ import annotations

from typing import Iterable, Optional

import numpy as np
import torch

from hybrid.config import Config, EmbeddingOptimizer
from hybrid.data.store import BatchStore
from hybrid.embedding_optimizer import state_columns, updated
from hybrid.lr_schedule import RateSchedule, set_rate
from hybrid.models import build_model, dense_optimizer
from hybrid.runtime.embedding_init import initial_rows


def train_reference(config: Config, store: BatchStore, iterations: int, batches: Optional[Iterable] = None):
    """Final (embedding table [rows, row_width], model) after ``iterations`` global batches.

    The table holds what a PS stores: each row's embedding, then its
    optimizer state (row-wise Adagrad's accumulator). ``batches``: the global
    batches in the order a mode trained them (FAE's strips); by default the store's.
    """
    dtype = getattr(torch, config.model.precision.value)
    offsets = store.table_offsets
    n_rows = int(store.cardinalities.sum())
    table = torch.tensor(initial_rows(config.seed, np.arange(n_rows), config.model.embedding_dim,
                                      np.dtype(config.model.precision.value)))
    state = np.zeros(n_rows, dtype=np.dtype(config.model.precision.value))  # row-wise Adagrad's accumulators
    model = build_model(config.model, n_dense=store.n_dense, n_tables=store.n_tables, seed=config.seed)
    optimizer = dense_optimizer(config, model.parameters())
    rates = RateSchedule.of(config, store.num_batches(config.global_batch))
    if batches is None:
        batches = store.batches(config.global_batch, shuffle=config.data.shuffle, seed=config.data.shuffle_seed,
                                stop_batch=iterations)
    for step, batch in zip(range(iterations), batches):
        set_rate(optimizer, rates.dense(step))
        rows = torch.from_numpy(batch.sparse.astype(np.int64) + offsets)
        table.requires_grad_(True)
        logits = model(torch.from_numpy(batch.dense).to(dtype), table[rows])
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.from_numpy(batch.labels).to(dtype))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            if config.train.embedding_optimizer is EmbeddingOptimizer.sgd:
                table = table - rates.embedding(step) * table.grad
            else:
                table, state = _rowwise_step(table, state, torch.unique(rows).numpy(), config, rates.embedding(step))
    if state_columns(config):
        return np.concatenate([table.detach().numpy(), state[:, None]], axis=1), model
    return table.detach().numpy(), model


def _rowwise_step(table: torch.Tensor, state: np.ndarray, touched: np.ndarray, config: Config, lr: float):
    """The batch's rows updated from their summed gradients by the workers' own function; the rest unchanged."""
    values = table.detach().numpy().copy()
    stored = np.concatenate([values[touched], state[touched, None]], axis=1)
    new = updated(stored, table.grad.numpy()[touched], config, lr)
    values[touched], state[touched] = new[:, :-1], new[:, -1]
    return torch.from_numpy(values), state
