"""``hybrid.runtime.mpi_family``: the MPI a venv was set up with, as ``launch/setup.sh`` records it."""
import pytest

from hybrid.runtime.mpi_family import MpiFamily, of_venv


def test_a_venv_says_its_family_and_launcher_and_an_unmarked_one_is_open_mpis(tmp_path):
    assert of_venv(tmp_path) == MpiFamily("openmpi", "mpirun")
    (tmp_path / ".hybrid-mpi").write_text("mpich /usr/bin/mpiexec.mpich\n")
    family = of_venv(tmp_path)
    assert family == MpiFamily("mpich", "/usr/bin/mpiexec.mpich")
    assert family.launcher(4) == ["/usr/bin/mpiexec.mpich", "-n", "4"] and family.rank_variable == "PMI_RANK"
    open_mpi = MpiFamily("openmpi", "/usr/bin/mpirun.openmpi")
    assert open_mpi.launcher(2) == ["/usr/bin/mpirun.openmpi", "--allow-run-as-root", "--oversubscribe",
                                    "--bind-to", "none", "--mca", "odls_base_sigkill_timeout", "0", "-n", "2"]
    assert open_mpi.rank_variable == "OMPI_COMM_WORLD_RANK"


@pytest.mark.parametrize("text", ["", "lam /usr/bin/mpirun", "mpich"])
def test_a_damaged_record_is_refused_saying_to_set_up_again(tmp_path, text):
    (tmp_path / ".hybrid-mpi").write_text(text)
    with pytest.raises(ValueError, match="run launch/setup.sh again"):
        of_venv(tmp_path)
