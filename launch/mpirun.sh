#!/usr/bin/env bash
# mpirun with the options this project needs on any machine: run as root in
# containers, more ranks than cores, and a timeout so a deadlock fails instead
# of hanging. Prints the command it runs.
#
# Usage: launch/mpirun.sh [--tcp[=IFACE]] -n 4 python -m hybrid train CONFIG
#
# --tcp: ranks on different hosts that talk over TCP (Ethernet clusters,
# OpenMPI). Debian's OpenMPI disables UCX in openmpi-mca-params.conf, and its
# other one-sided components cannot serve this job over TCP (osc rdma over btl
# tcp cannot create a window, osc pt2pt refuses MPI_THREAD_MULTIPLE), so this
# selects UCX for point-to-point and one-sided MPI over TCP, eager sends (a
# message leaves at once instead of waiting for the receiver to call into
# MPI), and the ring allreduce so every worker's link carries the same bytes.
# IFACE (e.g. eth0) restricts MPI to that interface. See docs/design.md
# section 12.
set -euo pipefail
tcp=()
case "${1:-}" in
    --tcp|--tcp=*)
        tcp=(--mca btl tcp,self --mca pml ucx --mca osc ucx
             --mca pml_ucx_tls any --mca pml_ucx_devices any --mca osc_ucx_tls any --mca osc_ucx_devices any
             -x UCX_TLS=tcp,self -x UCX_RNDV_THRESH=inf
             --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4)
        if [[ "$1" == --tcp=* ]]; then
            iface=${1#--tcp=}
            tcp+=(-x "UCX_NET_DEVICES=$iface" --mca btl_tcp_if_include "$iface" --mca oob_tcp_if_include "$iface")
        fi
        shift ;;
esac
command=(mpirun --allow-run-as-root --oversubscribe --bind-to none "${tcp[@]}" "$@")
echo "+ ${command[*]}" >&2
exec timeout --signal=TERM --kill-after=30 "${HYBRID_MPI_TIMEOUT:-1800}" "${command[@]}"
