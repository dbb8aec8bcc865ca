#!/usr/bin/env bash
# mpirun with the options this project needs on any machine: run as root in
# containers, more ranks than cores, and a timeout so a deadlock fails instead
# of hanging. Usage: launch/mpirun.sh -n 4 python -m hybrid train CONFIG
set -euo pipefail
exec timeout --signal=TERM --kill-after=30 "${HYBRID_MPI_TIMEOUT:-1800}" \
    mpirun --allow-run-as-root --oversubscribe --bind-to none "$@"
