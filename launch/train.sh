#!/usr/bin/env bash
# Launch `hybrid train CONFIG` with the rank layout the config asks for, and print the command.
#
#   launch/train.sh [LAUNCH OPTIONS] CONFIG [key=value ...] [hybrid train options, e.g. --resume]
#
# Launch options (before CONFIG):
#   --workers-on HOSTS   hosts for the workers, as mpirun's -H list (gpu1:4,gpu2:4): GPU hosts, a
#                        slot per GPU; the workers fill them in order
#   --ps-on HOSTS        hosts for the PS ranks (cpu1:1): CPU hosts with the memory for the tables
#   --tcp[=IFACE]        hosts joined by Ethernet: the MPI settings of launch/tcp_transport.sh
#   --horovodrun         start the ranks with horovodrun instead of mpirun
#   --dry-run            print the command, do not run it
#
# The MPI is the venv's: HYBRID_VENV=.venv-mpich bash launch/train.sh CONFIG runs under MPICH
# (launch/mpi_family.sh); each family gets its launcher's flags (launch/mpirun.sh).
#
# The rank count is cluster.workers + cluster.ps of the resolved config. World ranks
# 0 .. workers-1 are the workers and the last ranks the PS ranks (hybrid/runtime/comm.py), so
# with --workers-on/--ps-on (filled in that order, --map-by slot) the PS ranks land on
# the PS hosts. launch/rank_env.sh then keeps PS ranks off GPUs and gives each worker a GPU
# where the host has them; each rank sets its threads and how it waits in MPI itself
# (docs/cluster.md). Without host options every rank runs on this host.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/launch/mpi_family.sh"
tcp="" worker_hosts="" ps_hosts="" runner=mpirun dry_run=""
while [ $# -gt 0 ]; do
    case "$1" in
        --tcp|--tcp=*) tcp=$1; shift ;;
        --workers-on) worker_hosts=${2:?--workers-on needs a host list}; shift 2 ;;
        --ps-on) ps_hosts=${2:?--ps-on needs a host list}; shift 2 ;;
        --horovodrun) runner=horovodrun; shift ;;
        --dry-run) dry_run=1; shift ;;
        -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
        -*) echo "launch/train.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) break ;;
    esac
done
config=${1:?usage: launch/train.sh [--workers-on HOSTS --ps-on HOSTS] [--tcp] [--horovodrun] CONFIG [key=value ...]}
shift
overrides=()
for arg in "$@"; do
    [[ "$arg" == *=* && "$arg" != -* ]] && overrides+=("$arg")
done
# The ranks' python must have what launch/setup.sh installs: without a venv activated (or
# HYBRID_VENV), `python` is the system's, and the config step and every rank would die on an import.
if ! python -c 'import importlib.util as u, sys
sys.exit(any(u.find_spec(m) is None for m in ("mpi4py", "horovod", "torch", "tqdm")))' 2>/dev/null; then
    echo "launch/train.sh: $(command -v python || echo "no python on PATH") lacks the packages launch/setup.sh" \
        "installs (mpi4py, horovod, torch, tqdm): activate its venv (source $ROOT/.venv/bin/activate) or" \
        "set HYBRID_VENV" >&2
    exit 2
fi
layout=$(python -m hybrid config "$config" "${overrides[@]}" --layout)
eval "$layout"
launcher=$runner
[ "$MPI_FAMILY:$runner" = mpich:mpirun ] && launcher="mpiexec (MPICH)"
export HYBRID_WORKERS HYBRID_LAUNCHER=$launcher  # the ranks report their launcher (docs/cluster.md)
echo "+ $layout" >&2
hosts=()
if [ -n "$worker_hosts$ps_hosts" ]; then
    if [ -z "$worker_hosts" ] || [ -z "$ps_hosts" ]; then
        echo "launch/train.sh: give both --workers-on and --ps-on (or neither, for one host)" >&2
        exit 2
    fi
    hosts=(-H "$worker_hosts,$ps_hosts")
fi
rank_command=(bash "$ROOT/launch/rank_env.sh" python -m hybrid train "$config" "$@")
if [ "$runner" = horovodrun ]; then
    # horovodrun runs the `mpirun` on PATH and adds its own flags for that MPI's family
    if [ "$MPI_FAMILY" = mpich ]; then
        # Hydra's mpiexec as `mpirun`; it forwards the environment and runs as root as it is. horovodrun
        # learns the family from "MPICH" in `mpirun --version`, which Debian's Hydra does not print.
        mpi_args=""
        hydra_bin=$(mktemp -d)
        trap 'rm -rf "$hydra_bin"' EXIT
        printf '#!/bin/sh\n[ "$1" = --version ] && echo "MPICH (Hydra)"\nexec %q "$@"\n' \
            "$(command -v "$MPIEXEC")" >"$hydra_bin/mpirun"
        chmod +x "$hydra_bin/mpirun"
        PATH="$hydra_bin:$PATH"
    else
        mpi_args="--allow-run-as-root --oversubscribe --bind-to none -x HYBRID_WORKERS -x HYBRID_LAUNCHER"
        [ ${#hosts[@]} -gt 0 ] && mpi_args+=" --map-by slot"
    fi
    if [ -n "$tcp" ]; then
        iface=""
        [[ "$tcp" == --tcp=* ]] && iface=${tcp#--tcp=}
        source "$ROOT/launch/tcp_transport.sh" "$iface"
        if [ "$MPI_FAMILY" = openmpi ]; then
            mpi_args+=" -x UCX_TLS -x UCX_RNDV_THRESH"
            [ -n "$iface" ] && mpi_args+=" -x UCX_NET_DEVICES"
        fi
    fi
    [ ${#hosts[@]} -eq 0 ] && hosts=(-H "localhost:$HYBRID_RANKS")
    command=(horovodrun -np "$HYBRID_RANKS" "${hosts[@]}" ${mpi_args:+--mpi-args="$mpi_args"} "${rank_command[@]}")
    echo "+ $(printf '%q ' "${command[@]}")" >&2
    [ -n "$dry_run" ] && exit 0
    [ "$MPI_FAMILY" = mpich ] && { "${command[@]}"; exit; }  # the EXIT trap removes hydra_bin
    exec "${command[@]}"
fi
command=(bash "$ROOT/launch/mpirun.sh" ${tcp:+"$tcp"} -n "$HYBRID_RANKS" "${hosts[@]}")
[ ${#hosts[@]} -gt 0 ] && command+=(--map-by slot)
command+=(-x HYBRID_WORKERS -x HYBRID_LAUNCHER ${HYBRID_LAUNCH_VIA:+-x HYBRID_LAUNCH_VIA} "${rank_command[@]}")
if [ -n "$dry_run" ]; then
    echo "+ $(printf '%q ' "${command[@]}")" >&2
    exit 0
fi
exec "${command[@]}"
