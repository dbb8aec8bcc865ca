"""A test that fails on one rank only, before a collective the others enter.

Not collected by default (the name does not start with ``test_``);
``tests/unit/training/test_mpi_failfast.py`` runs it under mpirun to check that such
a failure ends the whole run at once with the failure printed, instead of
leaving the other ranks waiting in the barrier.
"""
import pytest
from mpi4py import MPI


@pytest.mark.mpi(min_size=2)
def test_rank_1_fails_before_a_barrier():
    world = MPI.COMM_WORLD
    assert world.rank != 1, "deliberate failure on rank 1"
    world.Barrier()  # every other rank waits here for rank 1
