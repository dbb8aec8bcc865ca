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
from hybrid.scheduling.policy import Sync
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

    The run's training, each worker's forward and backward apart, with the
    roundings of docs/design.md section 14 (``q``) where the mode's
    schedule puts them, from every worker's plans: the MLP's gradient is
    ``q(q(g_0) + q(g_1) + ...)``, added in worker order, and the rows follow
    :class:`_LatestRows` (caches whose dirty rows another worker reads through
    the PS or from peers) or :class:`_HetCopies` (HET's clocks, at staleness 0). SGD embeddings only.
    """
    if config.train.embedding_optimizer is not EmbeddingOptimizer.sgd:
        raise ValueError("the wire reference trains SGD embeddings only")
    wire = Wire.of(config)
    dtype = np.dtype(config.model.precision.value)
    torch_dtype = getattr(torch, config.model.precision.value)
    dim = config.model.embedding_dim
    n_rows = int(store.cardinalities.sum())
    initial = initial_rows(config.seed, np.arange(n_rows), dim, dtype)
    het = modes.get(config.scheduler.mode).schedule.sync is Sync.het_clocks
    if het and config.scheduler.staleness:
        raise ValueError("the wire reference defines HET at scheduler.staleness=0 only (BSP)")
    rows_of = _HetCopies(initial, config.cluster.workers, wire) if het else _LatestRows(initial, wire)
    model = build_model(config.model, n_dense=store.n_dense, n_tables=store.n_tables, seed=config.seed)
    optimizer = dense_optimizer(config, model.parameters())
    parameters = list(model.parameters())
    rates = RateSchedule.of(config, store.num_batches(config.global_batch))
    batches = store.batches(config.global_batch, shuffle=config.data.shuffle, seed=config.data.shuffle_seed,
                            stop_batch=iterations)
    for step, (batch, plans) in enumerate(zip(batches, worker_plans(config, store, iterations))):
        set_rate(optimizer, rates.dense(step))
        rows_of.before(plans)
        trained, row_gradients, dense_gradients = [], [], []
        for w, work in enumerate(plans):
            leaf = torch.tensor(rows_of.trained_from(w, work), requires_grad=True)
            index = torch.from_numpy(work.index.astype(np.int64))
            embedded = leaf.index_select(0, index.view(-1)).view(*index.shape, dim)
            logits = model(torch.from_numpy(batch.dense[work.samples]).to(torch_dtype), embedded)
            labels = torch.from_numpy(batch.labels[work.samples]).to(torch_dtype)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="sum") / len(batch)
            optimizer.zero_grad()
            loss.backward()
            dense_gradients.append([torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in parameters])
            trained.append(leaf.detach().numpy())
            row_gradients.append(leaf.grad.numpy())
        for i, p in enumerate(parameters):
            p.grad = _rounded_sum([g[i] for g in dense_gradients], wire)
        optimizer.step()
        rows_of.after(plans, trained, row_gradients, rates.embedding(step))
    return rows_of.values, model


class _LatestRows:
    """Each row's latest value ``V`` and where it is: at the PS (``V`` the master) or dirty in one worker's cache.

    - rows written back or sent peer to peer leave a cache: ``V = q(V)``;
    - a worker trains a row from ``V`` when it holds it dirty, else from ``q(V)`` (a pull's);
    - a row one worker trains: ``V = F - lr g`` in its cache; written at once
      (full-set synchronization) also ``V = q(V)``, else dirty;
    - a row several train: ``V += q(-lr g_w)`` per trainer, at the PS, in worker order;
    - plan pushes: ``V = q(V)``. The final flush is exact (``V`` as it is).
    """

    def __init__(self, initial: np.ndarray, wire: Wire):
        self.values, self.wire = initial, wire
        self.dirty = np.full(len(initial), -1, dtype=np.int64)  # the worker holding a row dirty, or -1

    def before(self, plans: list) -> None:
        for work in plans:  # rows leaving a cache before the iteration trains
            for rows in (work.writeback.rows, work.p2p_out.rows):
                self._leave(rows)

    def trained_from(self, w: int, work) -> np.ndarray:
        held = self.dirty[work.rows]
        if np.any((held >= 0) & (held != w)):
            raise AssertionError(f"worker {w} trains a row another worker holds dirty")
        return np.where((held == w)[:, None], self.values[work.rows], self.wire.round(self.values[work.rows]))

    def after(self, plans: list, trained: list, gradients: list, lr: float) -> None:
        for w, (work, rows_trained, g) in enumerate(zip(plans, trained, gradients)):
            for positions, stays_dirty in ((work.local, True), (work.full_set, False)):
                rows = work.rows[positions]
                self.values[rows] = rows_trained[positions] - lr * g[positions]
                if stays_dirty:
                    self.dirty[rows] = w
                else:
                    self._leave(rows)
        for work, g in zip(plans, gradients):  # shared rows, in worker order
            self.values[work.rows[work.accumulate]] += self.wire.round(-lr * g[work.accumulate])
        for work in plans:
            self._leave(work.plan_push.rows)

    def _leave(self, rows: np.ndarray) -> None:
        """``rows`` leave a cache: what every copy holds from now on is the rounded row."""
        self.values[rows] = self.wire.round(self.values[rows])
        self.dirty[rows] = -1


class _HetCopies:
    """HET at staleness 0: the PS's master rows, and each worker's own copy of the rows it caches.

    - a row fetched (pulled, or read ahead) is ``q(M)``;
    - a worker trains from its copy; each trainer's ``q(-lr g_w)`` is added to
      the master, in worker order, and to that worker's copy (every update is
      pushed at staleness 0, so no delta waits unpushed).
    """

    def __init__(self, initial: np.ndarray, workers: int, wire: Wire):
        self.values, self.wire = initial, wire
        self.copies = np.full((workers, *initial.shape), np.nan, dtype=initial.dtype)

    def before(self, plans: list) -> None:
        for w, work in enumerate(plans):
            for rows in (work.pull.rows, work.prefetch.rows):
                self.copies[w, rows] = self.wire.round(self.values[rows])

    def trained_from(self, w: int, work) -> np.ndarray:
        rows = self.copies[w, work.rows]
        if np.isnan(rows).any():
            raise AssertionError(f"worker {w} trains a row it neither caches nor fetches")
        return rows

    def after(self, plans: list, trained: list, gradients: list, lr: float) -> None:
        for w, (work, rows_trained, g) in enumerate(zip(plans, trained, gradients)):
            if len(work.stale.push) != len(work.rows):
                raise AssertionError(f"worker {w} keeps updates unpushed: not staleness 0")
            sent = self.wire.round(-lr * g)
            self.copies[w, work.rows] = rows_trained + sent
            self.values[work.rows] += sent


def _rounded_sum(gradients: list, wire: Wire) -> torch.Tensor:
    """The MLP gradient the workers' 16-bit sum gives: ``q(q(g_0) + q(g_1) + ...)``; one worker's as it is."""
    if len(gradients) == 1:
        return gradients[0]
    parts = [wire.round(g.numpy()) for g in gradients]
    total = parts[0].copy()
    for part in parts[1:]:
        total += part
    return torch.from_numpy(wire.round_(total))
