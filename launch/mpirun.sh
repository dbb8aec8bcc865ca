#!/usr/bin/env bash
# mpirun with the options this project needs on any machine: run as root in
# containers, more ranks than cores, and a timeout so a deadlock fails instead
# of hanging. Prints the command it runs.
#
# Usage: launch/mpirun.sh [--tcp[=IFACE]] -n 4 python -m hybrid train CONFIG
#
# --tcp: ranks on different hosts that talk over TCP (Ethernet clusters,
# OpenMPI): the settings of launch/tcp_transport.sh, forwarded to every rank.
set -euo pipefail
forward=()
case "${1:-}" in
    --tcp|--tcp=*)
        iface=""
        [[ "$1" == --tcp=* ]] && iface=${1#--tcp=}
        source "$(dirname "$0")/tcp_transport.sh" "$iface"
        forward=(-x UCX_TLS -x UCX_RNDV_THRESH)  # OpenMPI forwards OMPI_MCA_* itself
        [ -n "$iface" ] && forward+=(-x UCX_NET_DEVICES)
        echo "+ $(env | grep -E '^(OMPI_MCA|UCX)_' | sort | tr '\n' ' ')" >&2
        shift ;;
esac
command=(mpirun --allow-run-as-root --oversubscribe --bind-to none "${forward[@]}" "$@")
echo "+ ${command[*]}" >&2
# mpirun kills the ranks a moment after it forwards a SIGTERM, but forwards SIGUSR1 and lets them
# run: a SIGTERM or SIGINT sent here (a scheduler's time limit, Ctrl-C) reaches the ranks as
# SIGUSR1, on which `hybrid train` checkpoints and exits 0. A second one interrupts it.
timeout --signal=TERM --kill-after=30 "${HYBRID_MPI_TIMEOUT:-1800}" "${command[@]}" &
launched=$!
stop_gracefully() {
    echo "launch/mpirun.sh: $1: sending SIGUSR1 to the ranks (checkpoint and stop)" >&2
    pkill -USR1 -P "$launched" -x mpirun || true
}
trap 'stop_gracefully SIGTERM' TERM
trap 'stop_gracefully SIGINT' INT
while true; do
    status=0
    wait "$launched" || status=$?
    kill -0 "$launched" 2>/dev/null || exit "$status"
done
