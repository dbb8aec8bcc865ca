#!/usr/bin/env bash
# The main job on a fresh machine: set up, get the real MovieLens-100k (from
# RecBole's wheel on PyPI) and build small synthetic Criteo-like data (W1,
# smoke size), then train each on 3 workers + 1 PS, with vanilla BSP and with
# Herald: throughput, embedding transmissions and test AUC of every run, then
# the modes side by side (BSP: both modes train the same model).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/launch/setup.sh"
source "${HYBRID_VENV:-$ROOT/.venv}/bin/activate"
cd "$ROOT"
mkdir -p results
hybrid fetch movielens-100k --out data/ml-100k
hybrid synth --config configs/w1-smoke.yaml
summaries=()
for config in ${HYBRID_MAIN_CONFIGS:-configs/ml100k.yaml configs/w1-smoke.yaml}; do
    for mode in vanilla herald; do
        summary="results/$(basename "$config" .yaml)-$mode.json"
        bash launch/train.sh "$config" scheduler.mode="$mode" --summary-json "$summary"
        summaries+=("$summary")
    done
done
echo
hybrid compare "${summaries[@]}"
