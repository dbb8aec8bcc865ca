"""What crosses ranks in the foundation: the MPI/Horovod build and identical data reads.

Run with ``launch/mpirun.sh -n 3 python -m pytest --with-mpi tests/mpi``.
"""
import hashlib
import shutil
import tempfile
from pathlib import Path

import pytest

from hybrid.data.store import BatchStore
from hybrid.data.synthetic import synthesize


@pytest.mark.mpi(min_size=3)
def test_horovod_allreduces_over_a_worker_subcommunicator():
    """The set-up built Horovod with MPI: hvd.init(comm=...) on all ranks but the last (the 'PS')."""
    import horovod.torch as hvd
    import torch
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    is_worker = world.rank < world.size - 1
    workers = world.Split(0 if is_worker else 1, world.rank)
    if is_worker:
        hvd.init(comm=workers)
        total = hvd.allreduce(torch.tensor([float(world.rank + 1)], dtype=torch.float64), op=hvd.Sum)
        assert hvd.size() == world.size - 1
        assert total.item() == sum(range(1, world.size))
        hvd.shutdown()
    workers.Free()
    world.Barrier()


@pytest.mark.mpi(min_size=2)
def test_every_rank_reads_the_same_global_batches():
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    base = world.bcast(tempfile.mkdtemp(prefix="hybrid-store-") if world.rank == 0 else None)
    path = Path(base) / "store"
    if world.rank == 0:
        synthesize(path, like="criteo-kaggle", rows=5000, scale=0.001, seed=11)
    world.Barrier()
    store = BatchStore(path)
    digest = hashlib.sha256()
    for batch in store.batches(512, shuffle=True, seed=3):
        digest.update(batch.sparse.tobytes() + batch.dense.tobytes() + batch.labels.tobytes())
    seen = world.allgather((store.fingerprint, digest.hexdigest()))
    assert len(set(seen)) == 1
    world.Barrier()
    if world.rank == 0:
        shutil.rmtree(base)
