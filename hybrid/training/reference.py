"""The single-process references: plain torch on the whole global batch, and the same with the wire's roundings.

:func:`train_reference` is what every BSP mode must reproduce exactly
(docs/design.md section 9): the same initial embeddings and MLP, the same
global batches in the same order (epoch after epoch), the mean loss over
the global batch, the configured optimizers (SGD, or row-wise Adagrad, for
embeddings: ``hybrid.embedding_optimizer``) at each iteration's rates
(``hybrid.lr_schedule``).

:func:`train_wire_reference` is what a BSP mode with a 16-bit wire
(``cluster.wire_precision``) must reproduce: the same training, with each
rounding of docs/design.md section 14 applied where the mode's schedule
puts it, which it takes from every worker's plans.
"""
from __future__ import annotations

from typing import Iterable, Optional

import numpy as np
import torch

from hybrid import modes
from hybrid.config import Config, EmbeddingOptimizer
from hybrid.data.store import BatchStore
from hybrid.embedding_optimizer import state_columns, updated
from hybrid.lr_schedule import RateSchedule, set_rate
from hybrid.models import build_model, dense_optimizer
from hybrid.runtime.embedding_init import initial_rows
from hybrid.wire_format import Wire


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


def worker_plans(config: Config, store: BatchStore, iterations: int) -> list[list]:
    """Every worker's plans of the run's first ``iterations`` global batches: ``[step][worker]``.

    Each worker's scheduler makes its own, as in a run (one scheduler per worker here).
    """
    mode = modes.get(config.scheduler.mode)
    per_worker = []
    for w in range(config.cluster.workers):
        scheduler, batches = mode.simulation(config, store, iterations, worker=w)
        per_worker.append([plan.work for plan in scheduler.plans(batches)][:iterations])
    return [list(step) for step in zip(*per_worker)]


def train_wire_reference(config: Config, store: BatchStore, iterations: int):
    """Final (embedding table, model) of a BSP mode with a 16-bit wire, after ``iterations`` global batches.

    One process keeps each row's latest value ``V`` and where it is: at
    the PS (``V`` the master) or dirty in one worker's cache. Per iteration
    (q: the wire's rounding, docs/design.md section 14):

    - rows written back or sent peer to peer leave a cache: ``V = q(V)``;
    - a worker trains a row from ``V`` when it holds it dirty, else from ``q(V)`` (a pull's);
    - the MLP's gradient is ``q(sum of q(g_w))``, added in worker order;
    - a row one worker trains: ``V = F - lr g`` in its cache; written at once
      (full-set synchronization) also ``V = q(V)``, else dirty;
    - a row several train: ``V += q(-lr g_w)`` per trainer, at the PS;
    - plan pushes: ``V = q(V)``.
    The final flush is exact (``V`` as it is). SGD embeddings only.
    """
    if config.train.embedding_optimizer is not EmbeddingOptimizer.sgd:
        raise ValueError("the wire reference trains SGD embeddings only")
    wire = Wire.of(config)
    dtype = np.dtype(config.model.precision.value)
    torch_dtype = getattr(torch, config.model.precision.value)
    dim = config.model.embedding_dim
    offsets = store.table_offsets
    n_rows = int(store.cardinalities.sum())
    values = initial_rows(config.seed, np.arange(n_rows), dim, dtype)
    dirty = np.full(n_rows, -1, dtype=np.int64)  # the worker holding a row dirty, or -1
    model = build_model(config.model, n_dense=store.n_dense, n_tables=store.n_tables, seed=config.seed)
    optimizer = dense_optimizer(config, model.parameters())
    parameters = list(model.parameters())
    rates = RateSchedule.of(config, store.num_batches(config.global_batch))
    batches = store.batches(config.global_batch, shuffle=config.data.shuffle, seed=config.data.shuffle_seed,
                            stop_batch=iterations)
    for step, (batch, plans) in enumerate(zip(batches, worker_plans(config, store, iterations))):
        lr = rates.embedding(step)
        set_rate(optimizer, rates.dense(step))
        for work in plans:  # rows leaving a cache before the iteration trains
            for rows in (work.writeback.rows, work.p2p_out.rows):
                values[rows] = wire.round(values[rows])
                dirty[rows] = -1
        row_gradients, dense_gradients = [], []
        for w, work in enumerate(plans):
            held = dirty[work.rows]
            if np.any((held >= 0) & (held != w)):
                raise AssertionError(f"step {step}: worker {w} trains a row another worker holds dirty")
            trained = np.where((held == w)[:, None], values[work.rows], wire.round(values[work.rows]))
            leaf = torch.tensor(trained, requires_grad=True)
            index = torch.from_numpy(work.index.astype(np.int64))
            embedded = leaf.index_select(0, index.view(-1)).view(*index.shape, dim)
            logits = model(torch.from_numpy(batch.dense[work.samples]).to(torch_dtype), embedded)
            labels = torch.from_numpy(batch.labels[work.samples]).to(torch_dtype)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="sum") / len(batch)
            optimizer.zero_grad()
            loss.backward()
            dense_gradients.append([torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in parameters])
            row_gradients.append((trained, leaf.grad.numpy()))
        for i, p in enumerate(parameters):
            p.grad = _rounded_sum([g[i] for g in dense_gradients], wire)
        optimizer.step()
        for w, (work, (trained, gradients)) in enumerate(zip(plans, row_gradients)):
            for positions, stays_dirty in ((work.local, True), (work.full_set, False)):
                rows = work.rows[positions]
                values[rows] = trained[positions] - lr * gradients[positions]
                if not stays_dirty:
                    values[rows] = wire.round(values[rows])
                dirty[rows] = w if stays_dirty else -1
        for work, (_, gradients) in zip(plans, row_gradients):  # shared rows, in worker order
            rows = work.rows[work.accumulate]
            values[rows] += wire.round(-lr * gradients[work.accumulate])
        for work in plans:
            values[work.plan_push.rows] = wire.round(values[work.plan_push.rows])
            dirty[work.plan_push.rows] = -1
    return values, model


def _rounded_sum(gradients: list, wire: Wire) -> torch.Tensor:
    """The MLP gradient the workers' 16-bit sum gives: ``q(q(g_0) + q(g_1) + ...)``; one worker's as it is."""
    if len(gradients) == 1:
        return gradients[0]
    parts = [wire.round(g.numpy()) for g in gradients]
    total = parts[0].copy()
    for part in parts[1:]:
        total += part
    return torch.from_numpy(wire.round_(total))
