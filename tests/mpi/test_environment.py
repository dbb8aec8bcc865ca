"""What crosses ranks in the foundation: the MPI/Horovod build and identical data reads.

Run with ``launch/mpirun.sh -n 3 python -m pytest --with-mpi tests/mpi``.
"""
import hashlib

import pytest

from hybrid.data.store import BatchStore
from shared_store import shared_store

pytestmark = pytest.mark.family  # MPI semantics themselves: launch/test.sh runs these under MPICH too


@pytest.mark.shape
@pytest.mark.mpi(min_size=3)
def test_horovod_allreduces_over_the_workers_only():
    """The set-up built Horovod with MPI; PS ranks stay out of the workers' allreduce."""
    import torch
    from mpi4py import MPI

    from hybrid.runtime.comm import init_horovod, split_roles

    world = MPI.COMM_WORLD
    roles = split_roles(world.size - 1, 1)
    hvd = init_horovod(roles)
    if roles.is_ps:
        assert hvd is None
    else:
        total = hvd.allreduce(torch.tensor([float(world.rank + 1)], dtype=torch.float64), op=hvd.Sum)
        assert hvd.size() == world.size - 1 and hvd.rank() == roles.worker
        assert total.item() == sum(range(1, world.size))
        hvd.shutdown()
    roles.free()
    world.Barrier()


@pytest.mark.mpi(min_size=3)
def test_without_horovod_the_workers_sum_and_broadcast_with_mpi(monkeypatch):
    """train.allreduce=mpi never loads Horovod; where one worker cannot import it, auto gives every worker
    MPI's collectives and train.allreduce=horovod is refused on every worker, naming the one."""
    import importlib.util

    import torch
    from mpi4py import MPI

    from hybrid.runtime.comm import MpiCollectives, RoleError, split_roles, worker_collectives

    world = MPI.COMM_WORLD
    roles = split_roles(world.size - 1, 1)
    if roles.is_ps:
        assert worker_collectives(roles, "mpi") is None
    else:
        mpi = worker_collectives(roles, "mpi")
        assert isinstance(mpi, MpiCollectives) and mpi.size() == world.size - 1
        total = mpi.allreduce(torch.tensor([float(world.rank + 1)], dtype=torch.float64), op=mpi.Sum)
        assert total.item() == sum(range(1, world.size))
        state = {"weight": torch.full((3,), float(roles.worker + 1))}
        mpi.broadcast_parameters(state, root_rank=0)
        assert state["weight"].tolist() == [1.0, 1.0, 1.0]
        assert mpi.local_rank() == roles.worker  # every rank of this test shares one machine
        found = importlib.util.find_spec
        if roles.worker == 1:
            monkeypatch.setattr(importlib.util, "find_spec",
                                lambda name, *args: None if name == "horovod" else found(name, *args))
        chosen = worker_collectives(roles, "auto")
        assert isinstance(chosen, MpiCollectives) and chosen.reason == "Horovod is not installed (worker(s) 1)"
        with pytest.raises(RoleError, match=r"train.allreduce=horovod needs Horovod, which worker\(s\) 1 cannot"):
            worker_collectives(roles, "horovod")
        monkeypatch.setattr(importlib.util, "find_spec", found)
        if all(roles.workers.allgather(roles.oversubscribed)):  # CPU workers sharing cores never load Horovod
            chosen = worker_collectives(roles, "auto")
            assert isinstance(chosen, MpiCollectives) and chosen.patient
            assert chosen.reason.startswith("CPU workers whose ranks share cores")
    roles.free()
    world.Barrier()


@pytest.mark.shape
@pytest.mark.mpi(min_size=2)
def test_every_rank_reads_the_same_global_batches():
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    with shared_store(like="criteo-kaggle", rows=5000, scale=0.001, seed=11) as path:
        store = BatchStore(path)
        digest = hashlib.sha256()
        for batch in store.batches(512, shuffle=True, seed=3):
            digest.update(batch.sparse.tobytes() + batch.dense.tobytes() + batch.labels.tobytes())
        seen = world.allgather((store.fingerprint, digest.hexdigest()))
    assert len(set(seen)) == 1
