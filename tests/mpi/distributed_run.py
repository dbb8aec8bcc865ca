"""One training run across ranks, and its comparison with the single-process reference."""
import json
from dataclasses import dataclass
from typing import Optional

import numpy as np
from mpi4py import MPI

from hybrid.runtime.comm import split_roles
from hybrid.training.loop import HybridTrainer
from hybrid.training.reference import train_reference


@dataclass
class Run:
    log: list  # this rank's per-iteration records ([] on PS ranks)
    table: Optional[np.ndarray]  # every embedding row after the final flush (worker 0 only)
    params: Optional[list]  # MLP weights (workers only)
    capacity: Optional[int]  # cache slots per worker (workers only)
    rows_moved: int  # rows all workers moved through the store
    plan_fingerprint: str = ""  # the shard plan the store used
    allreduce: Optional[str] = None  # how the workers summed MLP gradients, as the summary says (workers only)


def train(config, store, iterations: int) -> Run:
    """Train ``iterations`` global batches on every rank, flush, read the table on worker 0 (collective)."""
    roles = split_roles(config.cluster.workers, config.cluster.ps)
    trainer = HybridTrainer(config, roles, store)
    log = trainer.train(iterations)
    trainer.flush()
    table = trainer.table.read_all() if roles.worker == 0 else None
    params = None if roles.is_ps else [p.detach().cpu().numpy().copy() for p in trainer.model.parameters()]
    capacity = None if roles.is_ps else trainer.scheduler.state.capacity
    plan_fingerprint = trainer.table.plan.fingerprint
    allreduce = None if roles.is_ps else trainer.allreduce.describe()
    trainer.close()
    roles.free()
    moved = MPI.COMM_WORLD.allreduce(sum(r["moved"][k] for r in log for k in ("pull", "put", "accumulate", "p2p")))
    return Run(log, table, params, capacity, moved, plan_fingerprint, allreduce)


_REFERENCES: dict = {}


def reference(config, store, iterations: int):
    """``train_reference`` of the run, computed once per process for the runs it cannot tell apart.

    The reference reads the data, model, training and seed sections and the
    global batch; never the mode, the cache or the cluster beyond the global
    batch (docs/design.md section 9: every BSP mode must reproduce the same
    one). The parametrized exactness tests vary exactly those, so 50 runs of
    one test share 10 references and 28 of another share 2 (each reference
    took up to 0.3 s of worker 0 while every other rank waited).
    """
    settings = {key: value for key, value in config.to_dict().items() if key not in ("scheduler", "cache", "cluster")}
    key = json.dumps([settings, config.global_batch, str(store.path), store.split, store.start, store.stop, iterations],
                     sort_keys=True)
    if key not in _REFERENCES:
        _REFERENCES[key] = train_reference(config, store, iterations)
    return _REFERENCES[key]


def assert_equals_reference(run: Run, config, store, iterations: int, tolerance: float = 1e-9,
                            expected: Optional[tuple] = None) -> None:
    """Worker 0: the run's embeddings and MLP equal plain single-process SGD on the whole global batch
    (or ``expected``: another reference's (table, model))."""
    expected_table, expected_model = expected or reference(config, store, iterations)
    assert np.abs(run.table - expected_table).max() < tolerance
    for got, want in zip(run.params, expected_model.parameters()):
        assert np.abs(got - want.detach().numpy()).max() < tolerance
