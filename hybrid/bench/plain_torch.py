"""``hybrid bench plain CONFIG``: the config's model and data in one plain PyTorch process, the floor of a run.

What a distributed run is measured against: the same model, the same
global batches of the same store, the same optimizers' arithmetic, in one
process without MPI, a PS, a cache or a scheduler. The embedding tables are
one tensor; each iteration gathers its rows, runs forward and backward,
steps the MLP and scatters ``-lr * gradient`` into the rows it used (SGD, as
the PS applies it). Whatever ``hybrid train`` spends beyond this per
iteration is the system's own cost (communication, scheduling, staging).

It runs on the CPU with ``--threads`` compute threads (default 1: one
worker's share), or on ``train.device=cuda``. Reported: samples/s and ms per
iteration after ``WARMUP`` iterations, the threads and the device.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

import numpy as np
import torch

from hybrid.config import EmbeddingOptimizer, load_config
from hybrid.data.store import BatchStore
from hybrid.lr_schedule import RateSchedule, set_rate
from hybrid.models import build_model, dense_optimizer
from hybrid.runtime.embedding_init import fill_initial_rows

WARMUP = 5


def run(*, config_path: str, overrides=(), iterations: int = 0, threads: int = 1, say=print) -> dict:
    """Train the config's model in this process; ``iterations`` 0 = one pass over the train split."""
    config = load_config(config_path, list(overrides))
    store = BatchStore(config.data.path, split="train", test_fraction=config.data.test_fraction)
    per_pass = store.num_batches(config.global_batch)
    total = iterations or per_pass
    if total <= WARMUP:
        raise ValueError(f"bench plain times the iterations after {WARMUP} warm-up ones; {config.data.path} holds "
                         f"{per_pass} global batches of {config.global_batch}: give more iterations or a smaller "
                         f"batch")
    torch.set_num_threads(threads)
    device = torch.device("cuda" if config.train.device == "cuda" else "cpu")
    _, _, loss, seconds = train_plain(config, store, total, device)
    timed = total - WARMUP
    result = {"config": config.name, "model": config.model.name.value, "device": str(device), "threads": threads,
              "global_batch": config.global_batch, "iterations": timed,
              "samples_per_s": round(timed * config.global_batch / seconds, 1),
              "ms_per_iteration": round(1000 * seconds / timed, 3), "train_loss": round(loss, 4)}
    say(format_line(result))
    return result


def train_plain(config, store: BatchStore, iterations: int, device: torch.device = torch.device("cpu"),
                after_step: Optional[Callable[[], None]] = None):
    """(table, model, last loss, seconds after the ``WARMUP`` iterations) of plain SGD on the global batches.

    The same model as the single-process reference (hybrid.training.reference),
    learning-rate schedule included, with the tables updated only where the
    batch touched them, as a real single-process trainer would. ``after_step``:
    called at the end of each iteration (several floors started together:
    ``hybrid.projection.calibration``).
    """
    if config.train.embedding_optimizer is not EmbeddingOptimizer.sgd:
        raise ValueError("bench plain applies SGD to the embeddings; run it with train.embedding_optimizer=sgd")
    dtype = getattr(torch, config.model.precision.value)
    offsets = torch.from_numpy(store.table_offsets.astype(np.int64)).to(device)
    n_rows = int(store.cardinalities.sum())
    # filled in place: the whole table's temporaries would take several times its size (floors side by side
    # each hold one: hybrid.projection.calibration)
    rows = np.empty((n_rows, config.model.embedding_dim), dtype=np.dtype(config.model.precision.value))
    fill_initial_rows(rows, config.seed, 0, threads=1)
    table = torch.from_numpy(rows).to(device)
    model = build_model(config.model, n_dense=store.n_dense, n_tables=store.n_tables, seed=config.seed).to(device)
    optimizer = dense_optimizer(config, model.parameters())
    rates = RateSchedule.of(config, store.num_batches(config.global_batch))
    start = time.perf_counter()
    loss = torch.zeros(())
    for step, batch in enumerate(store.batches(config.global_batch, stop_batch=iterations)):
        if step == WARMUP:
            _synchronize(device)
            start = time.perf_counter()
        set_rate(optimizer, rates.dense(step))
        rows = torch.from_numpy(batch.sparse.astype(np.int64)).to(device) + offsets
        leaf = table[rows].requires_grad_(True)
        logits = model(torch.from_numpy(batch.dense).to(device, dtype), leaf)
        labels = torch.from_numpy(batch.labels).to(device, dtype)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            table.index_add_(0, rows.reshape(-1), leaf.grad.reshape(-1, leaf.shape[-1]), alpha=-rates.embedding(step))
        if after_step is not None:
            after_step()
    _synchronize(device)
    return table.cpu().numpy(), model, loss.item(), time.perf_counter() - start


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def format_line(result: dict) -> str:
    return (f"{result['config']} plain PyTorch ({result['model']}, {result['device']}, {result['threads']} "
            f"thread(s), global batch {result['global_batch']}): {result['samples_per_s']:.0f} samples/s, "
            f"{result['ms_per_iteration']:.2f} ms per iteration over {result['iterations']} iterations")
