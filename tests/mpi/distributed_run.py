"""One training run across ranks, and its comparison with the single-process reference."""
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


def assert_equals_reference(run: Run, config, store, iterations: int, tolerance: float = 1e-9) -> None:
    """Worker 0: the run's embeddings and MLP equal plain single-process SGD on the whole global batch."""
    expected_table, expected_model = train_reference(config, store, iterations)
    assert np.abs(run.table - expected_table).max() < tolerance
    for got, want in zip(run.params, expected_model.parameters()):
        assert np.abs(got - want.detach().numpy()).max() < tolerance
