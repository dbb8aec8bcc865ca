"""Checkpoint and resume inside one MPI job, with one and two PS ranks (docs/design.md section 13).

The runs through ``hybrid train`` with kill -9 and signals are in
tests/unit/training/test_resume.py; here every rank count of the suite (3-5 ranks)
and two PS ranks writing their shards in parallel.
"""
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from hybrid.config import load_config
from hybrid.data.store import BatchStore
from hybrid.runtime import checkpoint as ckpt
from hybrid.runtime.comm import split_roles
from hybrid.training.loop import HybridTrainer
from shared_store import shared_store

pytestmark = pytest.mark.family  # MPI semantics themselves: launch/test.sh runs these under MPICH too


@pytest.fixture(scope="module")
def store_path():
    with shared_store(like="criteo-kaggle", rows=6000, scale=0.001, seed=5) as path:
        yield path


def _train(config, store, resume=None):
    """Train to config.train.iterations (from ``resume`` if given).

    Returns the table (on worker 0), the MLP, the digests and the rows received P2P.
    """
    roles = split_roles(config.cluster.workers, config.cluster.ps)
    trainer = HybridTrainer(config, roles, store, resume=resume)
    log = trainer.train(config.train.iterations)
    trainer.flush()
    table = trainer.table.read_all() if roles.worker == 0 else None
    params = None if roles.is_ps else [p.detach().numpy().copy() for p in trainer.model.parameters()]
    trainer.close()
    roles.free()
    return table, params, {r["step"]: r["digest"] for r in log}, sum(r["moved"]["p2p"] for r in log)


@pytest.mark.shape
@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("n_ps,sync,wire", [(1, "ps", "fp32"), (2, "ps", "fp32"), (1, "p2p", "fp32"),
                                             (1, "ps", "bf16"), (2, "p2p", "bf16")])
def test_resuming_from_a_mid_run_checkpoint_ends_with_the_uninterrupted_model(store_path, tmp_path_factory, n_ps,
                                                                              sync, wire):
    """With a 16-bit wire too: the rows dirty at the checkpoint come back at full precision, the others as
    the rounded rows their pulls gave (docs/design.md section 14)."""
    world = MPI.COMM_WORLD
    root = Path(world.bcast(str(tmp_path_factory.mktemp("ck")) if world.rank == 0 else None))
    config = load_config(None, [f"data.path={store_path}", f"cluster.workers={world.size - n_ps}",
                                f"cluster.ps={n_ps}", "train.batch_per_worker=16", "cache.ratio=0.05",
                                "model.embedding_dim=4", "model.top_mlp=[8]", "model.precision=float64",
                                "scheduler.mode=herald", f"scheduler.sync={sync}", "train.iterations=30",
                                "train.checkpoint_every=10", "train.checkpoint_keep=3", f"train.checkpoint_dir={root}",
                                "train.deterministic=true", f"cluster.wire_precision={wire}"])
    store = BatchStore(store_path, split="train", test_fraction=config.data.test_fraction)
    table, params, digests, _ = _train(config, store)
    saved = ckpt.CheckpointDir(root).complete()
    assert [c.step for c in saved] == [29, 19, 9]
    middle = saved[1]
    assert sorted(middle.meta["files"]) == sorted(["dense.pt", "scheduler.npz"] +
                                                  [ckpt.shard_name(i) for i in range(n_ps)])
    resumed_table, resumed_params, resumed_digests, received = _train(config, store, resume=middle)
    if sync == "p2p" and config.cluster.workers > 1:  # rows dirty at the checkpoint went cache to cache after it
        assert world.allreduce(received) > 0
    if params is not None:  # workers: the same allocations and events from step 20
        assert resumed_digests == {step: digests[step] for step in range(20, 30)}
    # Bit for bit: train.deterministic fixes the order shared gradients are summed in
    if world.rank == 0:
        np.testing.assert_array_equal(resumed_table, table)
    if params is not None:
        for got, want in zip(resumed_params, params):
            np.testing.assert_array_equal(got, want)
