"""Roles and the start-up agreement check, across ranks."""
import pytest
from mpi4py import MPI

from hybrid.runtime.comm import AgreementError, RoleError, check_agreement, split_roles

pytestmark = pytest.mark.family  # MPI semantics themselves: launch/test.sh runs these under MPICH too


@pytest.mark.shape
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


@pytest.mark.shape
@pytest.mark.mpi(min_size=3)
def test_stop_requests_from_ps_ranks_reach_worker_0_and_the_workers_agree_on_the_largest():
    """Two PS ranks forward their requests; worker 0 adds them to the barrier every worker enters."""
    world = MPI.COMM_WORLD
    roles = split_roles(world.size - 2, 2)
    codes = {roles.ps_ranks[0]: 7, roles.ps_ranks[1]: 9}
    if roles.is_ps:
        request, _ = roles.tell_worker_0(codes[world.rank])
        request.Wait()
    world.Barrier()  # both messages are on their way
    if not roles.is_ps:
        mine = 0
        if roles.worker == 0:
            deadline = MPI.Wtime() + 10
            while mine != 9 and MPI.Wtime() < deadline:  # delivery is asynchronous
                mine = max(mine, roles.stop_requests())
            assert roles.stop_requests() == 0  # each message is taken once
        assert roles.worker_barrier_max(mine) == 9
    world.Barrier()
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


@pytest.mark.shape
@pytest.mark.mpi(min_size=2)
def test_every_rank_agrees_how_the_workers_wait_in_their_collectives():
    """A blocking and a non-blocking call of one collective never match: whether workers sleep between tests
    of a non-blocking one must be one answer for all of them (any worker's host short of cores)."""
    world = MPI.COMM_WORLD
    roles = split_roles(world.size - 1, 1)
    answers = world.allgather(roles.patient_workers)
    assert len(set(answers)) == 1
    assert answers[0] == any(world.allgather(roles.oversubscribed)[:world.size - 1])
    if not roles.is_ps:
        assert roles.worker_barrier_max(roles.worker) == world.size - 2
    roles.free()
    world.Barrier()
