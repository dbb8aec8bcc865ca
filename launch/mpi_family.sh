# Sourced, not run, by the launchers: the MPI of the venv that runs the ranks.
#
# HYBRID_VENV names the venv (it is then put first on PATH); without it, the
# python on PATH. launch/setup.sh writes the MPI it built mpi4py and Horovod
# against into <venv>/.hybrid-mpi ("FAMILY MPIEXEC"); a venv without that file
# (set up before it existed, or by hand) is taken as Open MPI's.
# Sets MPI_FAMILY (openmpi or mpich) and MPIEXEC (the launcher to run).
# The families' launchers differ (docs/cluster.md, "MPI families"):
#   Open MPI: mpirun; as root --allow-run-as-root; more ranks than slots
#             --oversubscribe; binds ranks unless --bind-to none; forwards only
#             the variables named with -x; hosts as -H h1:4,h2:1 --map-by slot.
#   MPICH (Hydra's mpiexec; Intel MPI and MVAPICH too): runs as root, never
#             binds and oversubscribes unless asked, forwards the whole
#             environment, hosts as -hosts h1:4,h2:1 (filled in that order).
if [ -n "${HYBRID_VENV:-}" ]; then
    if [ ! -x "$HYBRID_VENV/bin/python" ]; then
        echo "HYBRID_VENV=$HYBRID_VENV has no bin/python: make it with launch/setup.sh" >&2
        exit 2
    fi
    VIRTUAL_ENV=$(cd "$HYBRID_VENV" && pwd)
    PATH="$VIRTUAL_ENV/bin:$PATH"
    export VIRTUAL_ENV PATH
fi
MPI_FAMILY=openmpi MPIEXEC=mpirun
mpi_marker="$(dirname "$(dirname "$(command -v python || echo /nonexistent/bin/python)")")/.hybrid-mpi"
if [ -f "$mpi_marker" ]; then
    read -r MPI_FAMILY MPIEXEC <"$mpi_marker"
fi
unset mpi_marker
# Open MPI's mpirun ends a job whose rank failed or aborted with SIGTERM to the other ranks, then waits
# a second before SIGKILL. A rank of `hybrid train` catches SIGTERM (Slurm's signal to checkpoint), so
# every failed job took that second, with its ranks stuck in collectives with the dead one. A user's
# own setting wins; a stop that should checkpoint reaches the ranks as SIGUSR1 (launch/mpirun.sh).
if [ "$MPI_FAMILY" = openmpi ]; then
    export OMPI_MCA_odls_base_sigkill_timeout=${OMPI_MCA_odls_base_sigkill_timeout:-0}
fi
