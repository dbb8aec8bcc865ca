#!/usr/bin/env bash
# Every test: set up, then the unit tests, then the MPI tests under mpirun, under Open MPI and MPICH.
# Any failure, or a run that collects no test (pytest exit 5), fails the script.
#   --quick  the check between edits (about 2 minutes here): the unit tests that start no multi-process job
#            (not marked `job`) and the MPI tests whose outcome depends on the cluster shape (marked
#            `shape`) on 3 ranks. CI and a change that is done run the whole command.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
QUICK=0
case "${1:-}" in
    --quick) QUICK=1 ;;
    "") ;;
    *) echo "usage: launch/test.sh [--quick]" >&2; exit 2 ;;
esac

# stage NAME: starts the next stage; the seconds of every stage are printed at the end, with the CPU
# seconds its processes used (user + system, of the processes this script waited for: not those a
# Slurm daemon started). CPU near twice the wall time: the stage kept both cores busy here.
timings=() current="set-up" began=$SECONDS cpu_began=0 times_file=$(mktemp)
trap 'rm -f "$times_file"' EXIT
stage() {
    local cpu
    times >"$times_file"  # not in a subshell: a forked shell counts no children
    cpu=$(awk 'NR == 2 { split($1, u, /[ms]/); split($2, s, /[ms]/); printf "%d", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$times_file")
    timings+=("$current: $((SECONDS - began)) s (cpu $((cpu - cpu_began)) s)")
    current=$1 began=$SECONDS cpu_began=$cpu
    [ "$1" = end ] && { echo "== stages: $(IFS=';'; echo "${timings[*]}" | sed 's/;/; /g')"; return; }
    echo "== $1"
}

# Python writes the bytecode of the package and the tests (pytest's rewritten test modules) into the
# checkout's __pycache__ (ignored by git) even where PYTHONDONTWRITEBYTECODE is set, as on this machine:
# without it each of the suite's some 400 Python processes compiled them again, 4.4 s of CPU for each
# pytest that collects tests/unit and 0.1-0.15 s for each rank of a job (docs/testing.md).
unset PYTHONDONTWRITEBYTECODE
# The third-party packages from a venv every clone on this machine shares (made by the first:
# docs/setup.md): a fresh clone's set-up installs the package alone.
export HYBRID_SHARED_DEPS=${HYBRID_SHARED_DEPS:-1}
bash "$ROOT/launch/setup.sh"
source "${HYBRID_VENV:-$ROOT/.venv}/bin/activate"
cd "$ROOT"
# HYBRID_MPI_TIMEOUT bounds every MPI run (tests' own jobs included) regardless of what hangs.
export HYBRID_MPI_TIMEOUT=${HYBRID_MPI_TIMEOUT:-600}
# OpenMP threads that wait instead of spinning: pytest-xdist runs a test process per core, each with
# OpenMP threads (the kernels' prange, torch's) that by default spin after every parallel region and
# take the other processes' cores. The scheduler's 1000-iteration determinism tests took 42-84 s that
# way beside one another, 12-15 s with this (docs/testing.md). A user's own setting wins.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
# mpi_tests RANKS [PYTEST ARGS]: tests/mpi under --with-mpi on RANKS ranks of the venv's MPI
# (HYBRID_VENV; launch/mpirun.sh).
mpi_tests() {
    local ranks=$1
    shift
    bash launch/mpirun.sh -n "$ranks" python -m pytest -q -p no:cacheprovider --durations=10 --color=no --with-mpi "$@" tests/mpi
}
if [ "$QUICK" = 1 ]; then
    stage "unit tests without jobs"
    python -m pytest -q -p no:cacheprovider --durations=10 -n auto -m "not job" --timeout=120 tests/unit
    stage "shape-dependent MPI tests on 3 ranks"
    mpi_tests 3 -m shape
    stage end
    exit 0
fi
# The unit tests, and the robustness tests: mistakes a user makes (bad configs, damaged stores, wrong
# input files, files that are not what they claim), each of which must end in seconds with one line
# that says what to do. Tests that start no multi-process job run on every core (pytest-xdist); those
# that do (marked `job`: mpirun trainings, new venvs) one at a time, so that no MPI job shares its
# cores with other tests.
stage "unit and robustness tests"
# 120 s, not pyproject's 300, for a test without jobs (the slowest take seconds): a defect that makes
# kernels loop for ever fails each test it reaches in 2 minutes, not 5
python -m pytest -q -p no:cacheprovider --durations=10 -n auto -m "not job" --timeout=120 tests/unit tests/robustness
stage "unit and robustness tests that start jobs"
python -m pytest -q -p no:cacheprovider --durations=10 -m job tests/unit tests/robustness

# The MPI tests also train on the real MovieLens-100k (from RecBole's wheel on PyPI, cached).
stage "real data"
hybrid fetch movielens-100k --out data/ml-100k

# The GPU check (docs/gpu.md) rehearsed on this CPU: every stage of launch/gpu_check.sh at tiny sizes,
# with a stand-in nvidia-smi, so that the one command a GPU host runs reaches it working. It fails
# unless every stage ran.
stage "GPU check rehearsal"
bash launch/gpu_check.sh --rehearse --out "$(mktemp -d -t hybrid-gpu-rehearsal-XXXXXX)"

# 4 ranks: 3 workers + 1 PS and 2 + 2, every test; then the tests whose outcome depends on the shape
# (marked `shape`) on 5 ranks (4 + 1 and 3 + 2) and, under MPICH below, on 3 (2 + 1 and 1 + 2: one
# worker alone): every shape runs each of them once, in one MPI family or the other.
# A failing test prints its failure and aborts every rank (tests/conftest.py); a hanging test fails
# after 300 s (pytest-timeout, pyproject.toml); HYBRID_MPI_TIMEOUT bounds the whole run regardless.
stage "MPI tests on 4 ranks"
mpi_tests 4
stage "shape-dependent MPI tests on 5 ranks"
mpi_tests 5 -m shape

# The other MPI family (MPICH, in a venv of its own): the tests that launch MPI jobs themselves (a
# failing or killed rank, SIGTERM to the launcher, horovodrun, a waiting rank that yields where ranks
# share cores, ranks across emulated hosts) but not those marked any_mpi_family (what they check is
# the same under any MPI), then, on 3 ranks (2 + 1 and 1 + 2), the MPI tests of the MPI's own
# behaviour (marked `family`: windows, collectives, agreement) and those whose outcome depends on the
# shape. The rest (more models, modes and cache sizes over the same calls) ran under Open MPI above.
# HYBRID_TEST_MPICH=0 skips MPICH: the shape tests on 3 ranks then run under Open MPI.
if [ "${HYBRID_TEST_MPICH:-1}" = 1 ]; then
    stage "set-up MPICH"
    HYBRID_MPI=mpich HYBRID_VENV=$ROOT/.venv-mpich HYBRID_VENV_BASE=$ROOT/.venv bash launch/setup.sh
    stage "launcher tests under MPICH"
    launcher_tests=(tests/unit/launch tests/unit/runtime/test_mpi_family.py tests/unit/bench/test_launch_bench.py
                    tests/unit/training/test_mpi_failfast.py tests/unit/training/test_resume.py tests/unit/bench/test_e2e_bench.py)
    HYBRID_VENV=$ROOT/.venv-mpich bash -c 'source launch/mpi_family.sh && pytest=(python -m pytest -q -p no:cacheprovider --durations=10) \
        && "${pytest[@]}" -n auto -m "not any_mpi_family and not job" "$@" && "${pytest[@]}" -m "job and not any_mpi_family" "$@"' \
        _ "${launcher_tests[@]}"
    stage "MPI family and shape tests on 3 ranks under MPICH"
    HYBRID_VENV=$ROOT/.venv-mpich mpi_tests 3 -m "family or shape"
else
    stage "shape-dependent MPI tests on 3 ranks"
    mpi_tests 3 -m shape
fi

# The sbatch templates under a real Slurm of two nodes on this machine (installed with apt-get if
# missing; skipped, saying why, where it cannot run: not root): one Slurm, the templates of both MPI
# families submitted at once (srun --mpi=pmix and mpirun; srun --mpi=pmi2 and Hydra's mpiexec).
stage "Slurm templates"
slurm_venvs=("${HYBRID_VENV:-$ROOT/.venv}")
[ "${HYBRID_TEST_MPICH:-1}" = 1 ] && slurm_venvs+=("$ROOT/.venv-mpich")
bash tests/slurm/run_templates.sh "${slurm_venvs[@]}"
stage end
