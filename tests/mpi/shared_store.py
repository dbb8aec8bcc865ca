"""A synthetic store shared by the ranks of an MPI test."""
import contextlib
import shutil
import tempfile
from pathlib import Path

from hybrid.data.synthetic import synthesize


@contextlib.contextmanager
def shared_store(**synthetic):
    """A synthetic store that rank 0 writes and every rank reads, removed afterwards (collective)."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    base = world.bcast(tempfile.mkdtemp(prefix="hybrid-mpi-") if world.rank == 0 else None)
    path = Path(base) / "store"
    if world.rank == 0:
        synthesize(path, **synthetic)
    world.Barrier()
    try:
        yield path
    finally:
        world.Barrier()
        if world.rank == 0:
            shutil.rmtree(base)
