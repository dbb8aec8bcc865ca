"""The MPI family a venv was set up with, and how to launch ranks under it (docs/cluster.md, "MPI families").

``launch/setup.sh`` builds mpi4py and Horovod against one MPI per venv and
writes it into ``<venv>/.hybrid-mpi`` as ``FAMILY MPIEXEC``;
``launch/mpi_family.sh`` reads the same file for the shell launchers. The
two families' launchers take different options: Open MPI's ``mpirun`` needs
to be told to run as root, to oversubscribe and not to bind; MPICH's Hydra
``mpiexec`` (Intel MPI and MVAPICH are of its family) does all that as it is.
Their ranks also learn their rank from different variables, and Hydra starts
them under a proxy process instead of as its own children.

Nothing here imports MPI: a process that did could not launch another job.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

MARKER = ".hybrid-mpi"
FAMILIES = ("openmpi", "mpich")


@dataclass(frozen=True)
class MpiFamily:
    name: str  # "openmpi" or "mpich"
    mpiexec: str  # the launcher of the MPI mpi4py and Horovod were built against

    @property
    def rank_variable(self) -> str:
        """The environment variable that gives a rank its world rank."""
        return "OMPI_COMM_WORLD_RANK" if self.name == "openmpi" else "PMI_RANK"

    @property
    def version_markers(self) -> tuple[str, ...]:
        """What this family's launcher prints for ``--version`` (one of them)."""
        return ("Open MPI", "OpenRTE") if self.name == "openmpi" else ("HYDRA",)

    def launcher(self, ranks: int) -> list[str]:
        """The command that starts ``ranks`` ranks on this host, as root, on any number of cores, unbound.

        Open MPI's ranks are killed at once when the job fails, as ``launch/mpi_family.sh`` has it.
        """
        if self.name == "openmpi":
            return [self.mpiexec, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                    "--mca", "odls_base_sigkill_timeout", "0", "-n", str(ranks)]
        return [self.mpiexec, "-n", str(ranks)]


def of_venv(prefix: str | Path = sys.prefix) -> MpiFamily:
    """The MPI the venv at ``prefix`` was set up with; Open MPI's ``mpirun`` for a venv that does not say."""
    marker = Path(prefix) / MARKER
    if not marker.is_file():
        return MpiFamily("openmpi", "mpirun")
    fields = marker.read_text().split()
    if len(fields) != 2 or fields[0] not in FAMILIES:
        raise ValueError(f"{marker}: expected 'FAMILY MPIEXEC' with FAMILY one of {FAMILIES}, got {fields}; "
                         f"run launch/setup.sh again")
    return MpiFamily(fields[0], fields[1])
