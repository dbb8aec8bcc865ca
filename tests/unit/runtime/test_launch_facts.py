"""How a rank waits: decided from what shares its host, before MPI starts (hybrid/runtime/launch_facts.py)."""
import subprocess
import sys

import pytest
from hypothesis import given, strategies as st

from hybrid.runtime.launch_facts import (POLL_VARIABLE, YIELD_VARIABLE, HostShare, decide, host_shares,
                                        idle_poll_seconds, launcher, prepare, ranks_on_host, workers_share_cores)

NO_FILES = ()  # no MCA parameter files: only the environment speaks for the user


def test_more_ranks_and_threads_than_cores_make_mpi_yield():
    # horovodrun's and Slurm's way of starting 4 ranks on a 2-core machine
    facts = decide({"OMPI_COMM_WORLD_LOCAL_SIZE": "4", "HYBRID_LAUNCHER": "horovodrun"}, cores=2, files=NO_FILES)
    assert facts.yields and facts.ranks_on_host == 4 and facts.launcher == "horovodrun"
    assert facts.compute_threads == 1 and facts.decided_by == "hybrid: 4 ranks x 2 threads > 2 cores"


def test_ranks_with_a_core_for_every_thread_spin():
    # the 16-core accelerator machine: 2 workers + 1 PS, each with 4 compute threads and its waiting thread
    facts = decide({"OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, cores=16, files=NO_FILES)
    assert not facts.yields and facts.compute_threads == 4 and facts.threads_per_rank == 5
    assert facts.decided_by == "hybrid: 3 ranks x 5 threads <= 16 cores"


def test_train_threads_count_against_the_cores_too():
    facts = decide({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, cores=16, user_threads=8, files=NO_FILES)
    assert facts.yields and facts.compute_threads == 8


def test_the_users_own_setting_wins_either_way(tmp_path):
    crowded = {"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    facts = decide({**crowded, YIELD_VARIABLE: "0"}, cores=2, files=NO_FILES)
    assert not facts.yields and facts.decided_by == f"user: {YIELD_VARIABLE}=0"
    roomy = {"OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    assert decide({**roomy, YIELD_VARIABLE: "true"}, cores=64, files=NO_FILES).yields
    params = tmp_path / "mca-params.conf"
    params.write_text("# site settings\nbtl_tcp_if_include = eth0\nmpi_yield_when_idle = 0  # spin\n")
    facts = decide(crowded, cores=2, files=(tmp_path / "missing.conf", params))
    assert not facts.yields and facts.decided_by == f"user: mpi_yield_when_idle=0 in {params}"


def test_prepare_sets_what_mpi_and_openmp_read_and_never_overrides_the_user():
    environ = {"OMPI_COMM_WORLD_LOCAL_SIZE": "4096"}  # more ranks than any test machine has cores
    facts = prepare(environ=environ)
    assert facts.yields and environ[YIELD_VARIABLE] == "1" and environ["OMP_NUM_THREADS"] == "1"
    assert environ["OMP_WAIT_POLICY"] == "PASSIVE"  # idle OpenMP threads sleep instead of taking others' cores
    environ = {"OMPI_COMM_WORLD_LOCAL_SIZE": "4096", YIELD_VARIABLE: "0", "OMP_NUM_THREADS": "3",
               "OMP_WAIT_POLICY": "ACTIVE"}
    prepare(environ=environ)
    assert environ[YIELD_VARIABLE] == "0" and environ["OMP_NUM_THREADS"] == "3"
    assert environ["OMP_WAIT_POLICY"] == "ACTIVE"
    environ = {"OMPI_COMM_WORLD_LOCAL_SIZE": "4096", YIELD_VARIABLE: "0"}  # MPI spins as asked; OpenMP still sleeps
    assert not prepare(environ=environ).yields and environ["OMP_WAIT_POLICY"] == "PASSIVE"
    environ = {}  # one rank: it fits wherever there are two cores, and OpenMP then waits as it likes
    facts = prepare(environ=environ)
    assert ("OMP_WAIT_POLICY" in environ) == (not facts.fits) == (facts.threads_per_rank > facts.cores)


def test_every_launcher_says_how_many_ranks_share_the_host():
    assert ranks_on_host({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}) == (4, "OMPI_COMM_WORLD_LOCAL_SIZE")
    assert ranks_on_host({"MPI_LOCALNRANKS": "3"}) == (3, "MPI_LOCALNRANKS")  # MPICH's hydra
    # srun: Slurm's compressed per-node list, this task's node picked by SLURM_NODEID
    slurm = {"SLURM_STEP_TASKS_PER_NODE": "5(x2),4", "SLURM_NODEID": "2"}
    assert ranks_on_host(slurm) == (4, "SLURM_STEP_TASKS_PER_NODE")
    assert ranks_on_host({**slurm, "SLURM_NODEID": "1"})[0] == 5
    # a launcher that knows better than MPI (emulated hosts: namespaces of one machine)
    assert ranks_on_host({"HYBRID_RANKS_PER_HOST": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"})[0] == 4
    assert ranks_on_host({}) == (1, "none")
    assert ranks_on_host({"SLURM_STEP_TASKS_PER_NODE": "garbage"}) == (1, "none")


def test_the_launcher_is_named_by_the_projects_scripts_or_recognized():
    assert launcher({"HYBRID_LAUNCHER": "horovodrun", "OMPI_COMM_WORLD_SIZE": "4"}) == "horovodrun"
    assert launcher({"OMPI_COMM_WORLD_SIZE": "4"}) == "mpirun"
    assert launcher({"SLURM_STEP_ID": "0", "PMIX_RANK": "1"}) == "srun"
    assert launcher({"PMI_RANK": "1"}) == "mpiexec (MPICH)"
    assert launcher({}) == "none"


@given(ranks=st.integers(1, 256), cores=st.integers(1, 512), user_threads=st.integers(0, 64))
def test_a_rank_never_spins_where_its_threads_do_not_fit(ranks, cores, user_threads):
    share = HostShare(ranks, cores, user_threads)
    assert share.compute_threads >= 1
    assert share.fits == (ranks * share.threads_per_rank <= cores)
    if not user_threads:  # the default leaves each rank a core for its waiting thread when there are two per rank
        assert share.fits == (cores >= 2 * ranks)
    facts = decide({"OMPI_COMM_WORLD_LOCAL_SIZE": str(ranks)}, cores, user_threads, files=NO_FILES)
    assert facts.yields == (not share.fits)


def test_deciding_does_not_start_mpi():
    code = ("import sys; from hybrid.runtime import launch_facts; import hybrid.cli; launch_facts.prepare(environ={}); "
            "assert 'mpi4py.MPI' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_waiting_ps_rank_polls_often_only_where_its_mpi_needs_it_and_the_users_setting_wins():
    """MPICH completes a one-sided operation when the PS calls into MPI; Open MPI at the origin."""
    assert idle_poll_seconds("MPICH Version:\t4.0.2\nMPICH Release date: ...", environ={}) == 1e-4
    assert idle_poll_seconds("Open MPI v4.1.4, package: Debian OpenMPI", environ={}) == 1e-3
    # MPICH's PS never sleeps where each rank has a core; Open MPI's need not poll at all
    assert idle_poll_seconds("MPICH Version: 4.0.2", environ={}, core_each=True) == 0
    assert idle_poll_seconds("Open MPI v4.1.4", environ={}, core_each=True) == 1e-3
    assert idle_poll_seconds("MPICH Version: 4.0.2", environ={POLL_VARIABLE: "20"}) == pytest.approx(2e-5)
    assert idle_poll_seconds("Open MPI v4.1.4", environ={POLL_VARIABLE: ""}) == 1e-3  # empty: not set
    assert idle_poll_seconds("Open MPI v4.1.4", environ={POLL_VARIABLE: "0"}) == 0  # the user's word: never sleep
    for bad in ("-5", "fast", "2e6"):
        with pytest.raises(ValueError, match=f"{POLL_VARIABLE}='{bad}': give microseconds between 0 and 1e6"):
            idle_poll_seconds("Open MPI v4.1.4", environ={POLL_VARIABLE: bad})


def test_every_worker_waits_patiently_when_any_workers_host_is_short_of_cores():
    """Two hosts: a 16-core one with workers 0-1, a 2-core one with worker 2 and the PS. Each rank's own host
    differs, but the answer must be one for all (a blocking and a non-blocking call of one collective never
    match); a host short of cores that holds only PS ranks does not make the workers wait patiently."""
    big, small = ("host-a", range(16)), ("host-b", range(2))
    hosts = [big, big, small, small]
    assert host_shares(hosts) == [(2, 16), (2, 16), (2, 2), (2, 2)]
    assert workers_share_cores(hosts, n_workers=3)
    assert not workers_share_cores(hosts, n_workers=2)  # workers 0-1 on the big host; the small one is PS only
    assert not workers_share_cores([big, big, big], n_workers=2)
    assert workers_share_cores([big] * 4, n_workers=3, user_threads=8)  # 4 ranks x 9 threads > 16 cores
