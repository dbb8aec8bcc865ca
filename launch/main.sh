#!/usr/bin/env bash
# The main job on a fresh machine: set up, build small synthetic Criteo-like
# data (workload W1, smoke size), then train it on 3 workers + 1 PS, once with
# vanilla BSP and once with Herald: throughput, embedding transmissions and
# test AUC of both (BSP: the two models are the same).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/launch/setup.sh"
source "${HYBRID_VENV:-$ROOT/.venv}/bin/activate"
cd "$ROOT"
mkdir -p results
CONFIG=${1:-configs/w1-smoke.yaml}
hybrid synth --config "$CONFIG"
RANKS=$(hybrid config "$CONFIG" | python -c 'import sys, yaml; c = yaml.safe_load(sys.stdin)["cluster"]; print(c["workers"] + c["ps"])')
for mode in vanilla herald; do
    bash launch/mpirun.sh -n "$RANKS" python -m hybrid train "$CONFIG" scheduler.mode="$mode" \
        --summary-json "results/$(basename "$CONFIG" .yaml)-$mode.json"
done
