#!/usr/bin/env bash
# The sbatch templates, for real, under a Slurm on this machine
# (launch/slurm/local_slurm.sh: Debian's slurm-wlm and munge, installed if missing).
#
#   bash tests/slurm/run_templates.sh [VENV ...]   # default: $HYBRID_VENV, else .venv
#
# Each VENV is one MPI family (its venv's MPI: launch/mpi_family.sh). One Slurm runs the templates
# of every family, all submitted at once: the jobs share the cores, and the time a job waits (Slurm
# starting it, a requeued job's restart) passes while the others compute.
#
# preprocess.sbatch converts a Criteo-format file on 3 ranks into the store one process writes.
# hetjob.sbatch runs its two components on the cluster's two nodes.
# Each training template trains a small W1 smoke run with `sbatch --wait`, stopped mid-run by a
# SIGTERM the way a time limit or a preemption sends it (single-node: to the batch shell, as
# --signal=B:TERM does; train.sbatch: to the ranks, as --signal=TERM does). The job must
# checkpoint, exit 0, requeue itself, and its second run must resume from the checkpoint and
# finish the run; both runs must say how they were launched. Needs root; prints SKIPPED and exits
# 0 otherwise.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
if [ "$(id -u)" != 0 ]; then
    echo "SKIPPED: the Slurm template tests start slurmctld, slurmd and munged as root (SlurmUser=root)" \
         "and install slurm-wlm with apt-get; this is not root"
    exit 0
fi
venvs=("$@")
[ ${#venvs[@]} -gt 0 ] || venvs=("${HYBRID_VENV:-$ROOT/.venv}")
for venv in "${venvs[@]}"; do
    [ -x "$venv/bin/python" ] || { echo "FAILED: $venv is not a virtualenv (run launch/setup.sh)" >&2; exit 1; }
done
source "${venvs[0]}/bin/activate"
# Every template of every family at once: 4 + 3 + 3 + 4 tasks per family, and 3 + 3 for the two jobs
# of one checkpoint directory, on the node of the default partition (its declared CPUs, not the
# host's: tasks share the real cores).
export HYBRID_SLURM_CPUS=${HYBRID_SLURM_CPUS:-$(( 24 * ${#venvs[@]} ))}
bash launch/slurm/local_slurm.sh start
export SLURM_CONF=${HYBRID_SLURM_DIR:-/tmp/hybrid-slurm}/etc/slurm.conf
work=$(mktemp -d /tmp/hybrid-slurm-test.XXXXXX)
trap 'bash launch/slurm/local_slurm.sh stop; while read -r id; do rm -f results/"$id"-*; done < <(cat "$work"/*/*.id 2>/dev/null); rm -rf "$work"' EXIT
hybrid synth --like criteo-kaggle --rows 20000 --scale 0.001 --seed 1 --out "$work/store" >/dev/null
python -c "from hybrid.data.criteo_text import write_criteo_text; write_criteo_text('$work/day_0', lines=20000)"
hybrid preprocess --format criteo --processes 1 --out "$work/pp-one" "$work/day_0" > /dev/null 2>&1
WAIT=${HYBRID_SLURM_JOB_TIMEOUT:-400}

# fail MESSAGE: this test failed; its job's output, and Slurm's view where a job never ended.
fail() {
    echo "FAILED: $1" >&2
    for file in "$out"/*.out; do echo "== $file" >&2; cat "$file" >&2; done
    squeue --steps >&2 2>/dev/null || true
    exit 1
}

# preempt_and_resume NAME TEMPLATE SCANCEL_OPTION SIGNAL_SEEN LAUNCHED: signalled once 30 of its 600
# iterations are logged (looked at every 0.2 s: a 2-core AMD EPYC trains 150 of them in under a second,
# so a run of 150 looked at every second had ended before the signal), requeued, resumed to the end;
# both runs launched as LAUNCHED says.
preempt_and_resume() {
    local name=$1 template=$2 option=$3 seen=$4 launched=$5 id status=0 iterations=600
    echo "== $template: SIGTERM ($option) mid-run, requeue, resume"
    timeout "$WAIT" sbatch --wait --parsable --ntasks=3 -o "$out/$name.out" "launch/slurm/$template" \
        configs/w1-smoke.yaml cluster.workers=2 "data.path=$work/store" train.batch_per_worker=16 "train.iterations=$iterations" \
        "train.checkpoint_dir=$out/ck-$name" > "$out/$name.id" &
    local submitter=$!
    for _ in $(seq 1 $((WAIT * 5))); do
        id=$(cat "$out/$name.id" 2>/dev/null || true)
        [ -n "$id" ] && [ -f "results/$id-0.jsonl" ] && [ "$(wc -l < "results/$id-0.jsonl")" -ge 30 ] && break
        kill -0 "$submitter" 2>/dev/null || fail "$template ended before it was signalled"
        sleep 0.2
    done
    [ -n "$id" ] || fail "$template was not submitted"
    scancel -s TERM ${option:+"$option"} "$id"
    wait "$submitter" || status=$?
    [ "$status" -eq 0 ] || fail "$template exited $status after the signal and the requeue"
    grep -Eq "stopped by $seen on rank [0-9]+ after iteration" "$out/$name.out" || fail "$template did not stop on $seen"
    grep -q "requeueing job $id" "$out/$name.out" || fail "$template did not requeue itself"
    grep -q "resuming from $out/ck-$name/step-" "$out/$name.out" || fail "the requeued run did not resume"
    # 3 ranks on this machine's cores: each rank decides to yield while it waits in MPI (docs/cluster.md)
    if [ "$(nproc)" -lt 6 ]; then
        [ "$(grep -c "launched by $launched on .*MPI yields while idle (hybrid: 3 ranks x 2 threads >" \
            "$out/$name.out")" = 2 ] || fail "$template: its two runs did not report '$launched' and yielding"
    fi
    echo "ok: $(grep -o 'launched by .*' "$out/$name.out" | tail -1)"
    python - "results/$id-0.json" "results/$id-1.json" "$iterations" <<'PY' || fail "$template: runs do not add up"
import json, sys
first, second = (json.load(open(p)) for p in sys.argv[1:3])
total = int(sys.argv[3])
assert first["stopped_by"] and first["start_step"] == 0 and first["iterations"] < total, first
assert second["stopped_by"] is None and second["start_step"] == first["iterations"], second
assert second["start_step"] + second["iterations"] == total and second["evaluation"]["auc"] > 0, second
print(f"ok: stopped after {first['iterations']} iterations ({first['stopped_by']}), resumed at "
      f"{second['start_step']} and finished {total}; test AUC {second['evaluation']['auc']:.4f}")
PY
}

# preprocess.sbatch: 3 ranks share the parts of a Criteo-format file; the store is the one-process one.
preprocess_on_ranks() {
    local status=0
    echo "== preprocess.sbatch: 3 ranks"
    timeout "$WAIT" sbatch --wait --parsable --ntasks=3 -o "$out/pp.out" launch/slurm/preprocess.sbatch \
        --format criteo --part-mb 0.5 --out "$out/pp-slurm" "$work/day_0" > "$out/pp.id" || status=$?
    [ "$status" -eq 0 ] || fail "preprocess.sbatch exited $status"
    grep -q "preprocessed 20000 lines in .* on 3 ranks" "$out/pp.out" || fail "preprocess.sbatch did not run on 3 ranks"
    python - "$work/pp-one" "$out/pp-slurm" <<'PY' || fail "preprocess.sbatch wrote another store"
import json, sys
one, slurm = (json.load(open(f"{p}/meta.json"))["fingerprint"] for p in sys.argv[1:3])
assert one == slurm, (one, slurm)
print(f"ok: preprocess.sbatch on 3 ranks wrote the one-process store (fingerprint {one})")
PY
}

# hetjob.sbatch with its two component lines edited as a user edits them: the 3 workers on the
# default partition's node, the PS rank on the other node (partition het, launch/slurm/local_slurm.sh).
# The nodes are two to MPI, so the job runs as on nodes joined by Ethernet (HYBRID_TCP=1): Open MPI
# creates no one-sided window across nodes without UCX.
het_job() {
    local status=0
    echo "== hetjob.sbatch: 3 workers and 1 PS as two components on two nodes"
    sed -e 's/^#SBATCH --partition=gpu .*/#SBATCH --partition=debug --ntasks=3/' \
        -e 's/^#SBATCH --partition=cpu .*/#SBATCH --partition=het --ntasks=1/' launch/slurm/hetjob.sbatch > "$out/hetjob.sbatch"
    [ "$(grep -c '^#SBATCH --partition=.* --ntasks=[13]$' "$out/hetjob.sbatch")" = 2 ] \
        || fail "hetjob.sbatch's two component lines were not found"
    HYBRID_TCP=1 timeout "$WAIT" sbatch --wait --parsable -o "$out/het.out" "$out/hetjob.sbatch" configs/w1-smoke.yaml \
        "data.path=$work/store" train.batch_per_worker=16 train.iterations=30 "train.checkpoint_dir=$out/ck-het" \
        > "$out/het.id" || status=$?
    [ "$status" -eq 0 ] || fail "hetjob.sbatch exited $status"
    python - "results/$(cat "$out/het.id")-0.json" <<'PY' || fail "hetjob.sbatch: not 3 workers on one node and the PS on another"
import json, sys
summary = json.load(open(sys.argv[1]))
launch, roles = summary["launch"], [r["role"] for r in summary["ranks"]]
assert roles == ["worker"] * 3 + ["ps"] and summary["iterations"] == 30 and summary["evaluation"]["auc"] > 0, summary
# worker 0's node ran the first component's 3 tasks, so the PS rank ran on the other node
assert launch["via"] == "hetjob.sbatch" and launch["ranks_on_host"] == 3, launch
assert launch["ranks_on_host_from"] == "SLURM_STEP_TASKS_PER_NODE", launch
print(f"ok: hetjob.sbatch: 3 workers on one node (SLURM_STEP_TASKS_PER_NODE), the PS on the other; "
      f"30 iterations, test AUC {summary['evaluation']['auc']:.4f}")
PY
}

single_node() { preempt_and_resume single single-node.sbatch -b SIGUSR1 "$plain_launcher via single-node.sbatch"; }

# dir_in_use: a second train.sbatch job given the checkpoint directory of a job that is running is
# refused at start-up, naming the first (hybrid/runtime/run_lease.py); both run with --resume, as
# every run of the templates does, so only the holder's liveness tells them apart.
dir_in_use() {
    local first second status=0
    echo "== train.sbatch twice with one train.checkpoint_dir"
    local args=(configs/w1-smoke.yaml cluster.workers=2 "data.path=$work/store" train.batch_per_worker=16
                train.iterations=1000000 "train.checkpoint_dir=$out/ck-shared")
    first=$(sbatch --parsable --ntasks=3 -o "$out/first.out" launch/slurm/train.sbatch "${args[@]}")
    echo "$first" > "$out/first.id"
    for _ in $(seq 1 "$WAIT"); do
        [ -f "$out/ck-shared/owner.json" ] && break
        squeue -h -j "$first" | grep -q . || fail "the first train.sbatch job ended before it took its directory"
        sleep 1
    done
    [ -f "$out/ck-shared/owner.json" ] || fail "the first train.sbatch job never took its checkpoint directory"
    timeout "$WAIT" sbatch --wait --parsable --ntasks=3 -o "$out/second.out" launch/slurm/train.sbatch "${args[@]}" \
        > "$out/second.id" || status=$?
    scancel "$first"
    [ "$status" -ne 0 ] || fail "the second job was not refused"
    grep -Eq "error on ranks 0-2 of 3 \(.*\): CheckpointError: train.checkpoint_dir=$out/ck-shared is in use by run [0-9a-f]{12} \(w1-smoke, started .*\) on host .*, process [0-9]+; wait for it to end" \
        "$out/second.out" || fail "the second job did not say the directory is in use, and by whom"
    echo "ok: a second job given the running job's checkpoint directory was refused, naming the holder"
}

# run_test VENV NAME FUNCTION [ARGS]: FUNCTION in the background, in VENV's MPI family; its output in
# $work/FAMILY-NAME/log, its jobs' files beside it ($out).
tests=()
run_test() {
    local venv=$1 name=$2 family
    family=$(HYBRID_VENV=$venv bash -c 'source launch/mpi_family.sh && echo "$MPI_FAMILY"')
    local out=$work/$family-$name
    mkdir -p "$out"
    (
        export HYBRID_VENV=$venv  # the templates activate it; the jobs run in its MPI
        source "$venv/bin/activate"
        source launch/mpi_family.sh
        plain_launcher=$([ "$MPI_FAMILY" = mpich ] && echo "mpiexec (MPICH)" || echo mpirun)
        "${@:3}"
    ) > "$out/log" 2>&1 &
    tests+=("$!:$family $name:$out")
}

for venv in "${venvs[@]}"; do
    run_test "$venv" preprocess preprocess_on_ranks
    run_test "$venv" hetjob het_job
    run_test "$venv" single-node single_node
    run_test "$venv" train preempt_and_resume srun train.sbatch "" SIGTERM "srun via train.sbatch"
    run_test "$venv" dir-in-use dir_in_use
done
failed=()
for test in "${tests[@]}"; do
    IFS=: read -r pid label out <<< "$test"
    status=0
    wait "$pid" || status=$?
    echo "== $label"
    cat "$out/log"
    [ "$status" -eq 0 ] || failed+=("$label")
done
[ ${#failed[@]} -eq 0 ] || { echo "Slurm templates: FAILED: ${failed[*]}" >&2; exit 1; }
echo "Slurm templates: all passed (${#tests[@]} tests: ${tests[*]##*:$work/})"
