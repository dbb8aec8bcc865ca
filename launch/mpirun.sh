#!/usr/bin/env bash
# The MPI launcher with the options this project needs on any machine: run as
# root in containers, more ranks than cores, and a timeout so a deadlock fails
# instead of hanging. Prints the command it runs.
#
# Usage: launch/mpirun.sh [--tcp[=IFACE]] -n 4 [-x VAR] [-H HOSTS --map-by slot] python -m hybrid train CONFIG
#
# The MPI is the venv's (launch/mpi_family.sh; HYBRID_VENV=.venv-mpich for MPICH). Open MPI's
# mpirun gets the options as given. MPICH's mpiexec gets them translated: -x VAR is dropped (it
# forwards the whole environment), -H HOSTS becomes -hosts HOSTS, --map-by slot is dropped (it
# fills the hosts in order); Hydra's own options before the command pass as they are.
# --tcp: ranks on different hosts that talk over TCP (Ethernet clusters):
# the settings of launch/tcp_transport.sh, forwarded to every rank.
set -euo pipefail
source "$(dirname "$0")/mpi_family.sh"
forward=()
case "${1:-}" in
    --tcp|--tcp=*)
        iface=""
        [[ "$1" == --tcp=* ]] && iface=${1#--tcp=}
        source "$(dirname "$0")/tcp_transport.sh" "$iface"
        forward=(-x UCX_TLS -x UCX_RNDV_THRESH)  # OpenMPI forwards OMPI_MCA_* itself
        [ -n "$iface" ] && forward+=(-x UCX_NET_DEVICES)
        echo "+ $(env | grep -E '^(OMPI_MCA|UCX|HYDRA)_' | sort | tr '\n' ' ')" >&2
        shift ;;
esac
if [ "$MPI_FAMILY" = mpich ]; then
    args=()
    while [ $# -gt 0 ]; do
        case "$1" in
            -x) shift 2 ;;
            --map-by)
                if [ "${2:-}" != slot ]; then
                    echo "launch/mpirun.sh: MPICH fills hosts in order: --map-by ${2:-} has no translation" >&2
                    exit 2
                fi
                shift 2 ;;
            -H|--host) args+=(-hosts "${2:?$1 needs a host list}"); shift 2 ;;
            -n|-np|-f|-hostfile|-machinefile|-hosts|-ppn|-genvlist|-envlist|-wdir|-iface|-bind-to|-map-by|\
            -launcher|-launcher-exec|-bootstrap|-bootstrap-exec|-configfile|-outfile-pattern|-errfile-pattern)
                args+=("$1" "${2:?$1 needs a value}"); shift 2 ;;  # Hydra's options with a value
            -genv|-env) args+=("$1" "${2:?$1 needs a name}" "${3:?$1 needs a value}"); shift 3 ;;
            -*) args+=("$1"); shift ;;
            *) break ;;
        esac
    done
    command=("$MPIEXEC" "${args[@]}" "$@")
else
    command=("$MPIEXEC" --allow-run-as-root --oversubscribe --bind-to none "${forward[@]}" "$@")
fi
echo "+ ${command[*]}" >&2
# The launcher kills the ranks a moment after it forwards a SIGTERM, but forwards SIGUSR1 and lets
# them run: a SIGTERM or SIGINT sent here (a scheduler's time limit, Ctrl-C) reaches the ranks as
# SIGUSR1, on which `hybrid train` checkpoints and exits 0. A second one interrupts it.
timeout --signal=TERM --kill-after=30 "${HYBRID_MPI_TIMEOUT:-1800}" "${command[@]}" &
launched=$!
stop_gracefully() {
    echo "launch/mpirun.sh: $1: sending SIGUSR1 to the ranks (checkpoint and stop)" >&2
    pkill -USR1 -P "$launched" || true
}
trap 'stop_gracefully SIGTERM' TERM
trap 'stop_gracefully SIGINT' INT
while true; do
    status=0
    wait "$launched" || status=$?
    kill -0 "$launched" 2>/dev/null || exit "$status"
done
