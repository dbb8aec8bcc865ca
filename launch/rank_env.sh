#!/usr/bin/env bash
# Per-rank environment, run by the launchers in front of each rank's command:
#   launch/rank_env.sh python -m hybrid train CONFIG ...
# HYBRID_WORKERS (exported by launch/train.sh) says which ranks are workers: world
# ranks 0 .. HYBRID_WORKERS-1; the rest are PS ranks (hybrid/runtime/comm.py).
# - PS ranks never see a GPU (CUDA_VISIBLE_DEVICES=""): they serve rows from host memory.
# - A worker on a host with GPUs gets one, by its local rank.
# Threads per rank and how ranks wait in MPI are decided in the rank itself, before MPI starts
# (hybrid/runtime/launch_facts.py, docs/cluster.md).
set -euo pipefail
rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${SLURM_PROCID:-0}}}
local_rank=${OMPI_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-${SLURM_LOCALID:-0}}}
workers=${HYBRID_WORKERS:?launch/rank_env.sh needs HYBRID_WORKERS: cluster.workers of the config}
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
if [ "$rank" -ge "$workers" ]; then
    export CUDA_VISIBLE_DEVICES=""
elif [ "$gpus" -gt 0 ]; then
    export CUDA_VISIBLE_DEVICES=$((local_rank % gpus))
fi
exec "$@"
