"""Roles and the start-up agreement check, across ranks."""
import pytest
from mpi4py import MPI

from hybrid.runtime.comm import AgreementError, RoleError, check_agreement, split_roles


@pytest.mark.mpi(min_size=2)
def test_roles_put_the_ps_ranks_last():
    world = MPI.COMM_WORLD
    roles = split_roles(world.size - 1, 1)
    assert roles.ps_ranks == [world.size - 1]
    assert roles.is_ps == (world.rank == world.size - 1)
    if not roles.is_ps:
        assert roles.workers.size == world.size - 1 and roles.worker == roles.workers.rank
    assert world.allreduce(int(roles.is_ps)) == 1
    # one machine: every rank counts all ranks and the cores they may use, as one host
    assert roles.node_ranks == world.size
    assert roles.oversubscribed == (world.size > roles.node_cores)
    roles.free()


@pytest.mark.mpi(min_size=2)
def test_a_wrong_rank_count_is_explained_without_a_collective():
    with pytest.raises(RoleError, match=r"cluster.workers=8 \+ cluster.ps=1 = 9 ranks, but \d+ were started"):
        split_roles(8, 1)


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60)
def test_a_mismatch_stops_every_rank_with_one_message():
    world = MPI.COMM_WORLD
    check_agreement(world, config="abc", data="f00")  # agreement passes silently
    digest = "abc" if world.rank else "xyz"
    with pytest.raises(AgreementError) as info:
        check_agreement(world, config=digest, data="f00")
    message = str(info.value)
    assert "ranks disagree on config" in message and "ranks [0]: xyz" in message
    assert len(set(world.allgather(message))) == 1  # the same message everywhere, nobody hangs
