# Helpers of the sbatch templates (sourced from the repository root, the venv active).
# HYBRID_VENV picks the venv, and with it the MPI (HYBRID_VENV=.venv-mpich: MPICH's family).

source launch/mpi_family.sh
# srun's PMI for the venv's MPI: Open MPI talks PMIx (Debian's build has no PMI2), MPICH PMI2.
SRUN_MPI=${HYBRID_SRUN_MPI:-$([ "$MPI_FAMILY" = mpich ] && echo pmi2 || echo pmix)}

# check_tasks CONFIG [key=value ...]: the job's task count must be the config's rank count.
check_tasks() {
    local overrides=() arg
    for arg in "${@:2}"; do
        [[ "$arg" == *=* && "$arg" != -* ]] && overrides+=("$arg")
    done
    eval "$(python -m hybrid config "$1" "${overrides[@]}" --layout)"
    if [ "$HYBRID_RANKS" != "${SLURM_NTASKS:-}" ]; then
        echo "the config needs $HYBRID_RANKS tasks (cluster.workers $HYBRID_WORKERS + cluster.ps $HYBRID_PS)," \
             "the job has ${SLURM_NTASKS:-none}: submit with --ntasks=$HYBRID_RANKS" >&2
        exit 2
    fi
}

# run_forwarding_term COMMAND...: run COMMAND; a SIGTERM or SIGINT to this shell (Slurm's
# --signal=B:TERM@..., scancel -s TERM -b) is passed on to it as SIGTERM. Returns its status.
run_forwarding_term() {
    "$@" &
    local child=$! status
    trap "echo \"$(basename "$0"): SIGTERM: the ranks checkpoint and stop\" >&2; kill -TERM $child 2>/dev/null || true" TERM INT
    while true; do
        status=0
        wait "$child" || status=$?
        kill -0 "$child" 2>/dev/null || break
    done
    trap - TERM INT
    return "$status"
}

# requeue_if_stopped SUMMARY_JSON: when the run stopped early on a signal (and checkpointed),
# put the job back in the queue; its next run resumes from the checkpoint (--resume).
requeue_if_stopped() {
    local stopped
    [ -f "$1" ] || return 0  # no summary: nothing was left to train (the run had ended before)
    stopped=$(python -c 'import json, sys; print(json.load(open(sys.argv[1])).get("stopped_by") or "")' "$1")
    if [ -n "$stopped" ]; then
        echo "stopped by $stopped with a checkpoint: requeueing job $SLURM_JOB_ID" \
             "(restart ${SLURM_RESTART_COUNT:-0})" >&2
        scontrol requeue "$SLURM_JOB_ID"
    fi
}

# use_tcp_if_asked: nodes joined by Ethernet: HYBRID_TCP=1 (or HYBRID_TCP=eth0 to pin the
# interface) exports the MPI settings of launch/tcp_transport.sh; srun passes them to every rank.
use_tcp_if_asked() {
    [ -n "${HYBRID_TCP:-}" ] || return 0
    local iface=""
    [ "$HYBRID_TCP" != 1 ] && iface=$HYBRID_TCP
    source launch/tcp_transport.sh "$iface"
    echo "+ $(env | grep -E '^(OMPI_MCA|UCX|HYDRA)_' | sort | tr '\n' ' ')" >&2
}
