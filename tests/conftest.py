"""Shared fixtures (small stores written once per session) and the MPI fail-fast hook."""
import sys

import pytest

from hybrid.data.synthetic import synthesize
from hybrid.runtime import launch_facts


@pytest.fixture(scope="session")
def criteo_like(tmp_path_factory):
    """A 60k-sample Criteo-like synthetic store (in file order)."""
    path = tmp_path_factory.mktemp("stores") / "criteo-like"
    synthesize(path, like="criteo-kaggle", rows=60_000, scale=0.001, seed=7)
    return path


def _under_mpi(config) -> bool:
    return bool(config.getoption("--with-mpi", default=False) or config.getoption("--only-mpi", default=False))


def _abort_on_failure(report, config) -> None:
    """End every rank at once when this rank fails, after printing why.

    A rank whose test fails skips the collectives its test would still have
    called, and the other ranks would wait there until the job's timeout,
    printing nothing. So under ``--with-mpi`` a failure (in setup, the test
    itself, teardown or collection) is printed on this rank's stderr and
    ``MPI_Abort`` ends the job: the run fails within seconds, with the reason.
    """
    if not report.failed or not _under_mpi(config):
        return
    from mpi4py import MPI

    from hybrid.runtime.comm import abort_job

    world = MPI.COMM_WORLD
    if world.size == 1:
        return
    where = getattr(report, "when", "collect")
    sys.stderr.write(f"\n{'=' * 20} rank {world.rank} of {world.size}: FAILED {report.nodeid} ({where}) "
                     f"{'=' * 20}\n{report.longreprtext}\n{'=' * 20} aborting every rank {'=' * 20}\n")
    abort_job(1)


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report):
    _abort_on_failure(report, _CONFIG[0])


@pytest.hookimpl(trylast=True)
def pytest_collectreport(report):
    _abort_on_failure(report, _CONFIG[0])


_CONFIG = []


def pytest_configure(config):
    """Under ``--with-mpi``, decide how the ranks wait before the test modules start MPI, as ``hybrid train``
    does: under MPICH where ranks share cores they then yield (docs/cluster.md, "How ranks wait")."""
    _CONFIG[:] = [config]
    if _under_mpi(config):
        launch_facts.prepare()


_MPI_IN_PYTEST = ("imported mpi4py.MPI into the pytest process, which makes it an MPI process: every mpirun a later "
                  "test starts then exits 1 without a word. Import MPI code inside the subprocess the test starts, or "
                  "put the code MPI does not need in a module that does not import it.")


def pytest_collection_finish(session):
    """Outside ``--with-mpi``, no test module may start MPI in this process (see ``_MPI_IN_PYTEST``)."""
    if not _under_mpi(session.config) and "mpi4py.MPI" in sys.modules:
        raise pytest.UsageError(f"a test module {_MPI_IN_PYTEST}")


@pytest.fixture(autouse=True)
def _no_mpi_in_the_pytest_process(request):
    """The same for each test's own imports: the first test that brings in MPI fails, naming why."""
    before = "mpi4py.MPI" in sys.modules
    yield
    if not before and not _under_mpi(request.config) and "mpi4py.MPI" in sys.modules:
        pytest.fail(f"this test {_MPI_IN_PYTEST}")
