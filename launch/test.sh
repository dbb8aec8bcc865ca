#!/usr/bin/env bash
# Every test: set up, then the unit tests, then the MPI tests under mpirun.
# Any failure, or a run that collects no test (pytest exit 5), fails the script.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/launch/setup.sh"
source "${HYBRID_VENV:-$ROOT/.venv}/bin/activate"
cd "$ROOT"
RANKS=${HYBRID_TEST_RANKS:-3}

echo "== unit tests"
python -m pytest -q -p no:cacheprovider tests/unit

echo "== MPI tests on $RANKS ranks"
bash launch/mpirun.sh -n "$RANKS" python -m pytest -q -p no:cacheprovider --color=no --with-mpi tests/mpi
