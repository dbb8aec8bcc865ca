#!/usr/bin/env bash
# The main job on a fresh machine: set up, get the real MovieLens-100k (from
# RecBole's wheel on PyPI) and build small synthetic Criteo-like data (W1,
# smoke size), then train each on 3 workers + 1 PS, with vanilla BSP, with
# Herald as the paper allocates, and with Herald's cost-scored allocation in the
# confident order: throughput, embedding transmissions and test AUC of every
# run, then the runs side by side (BSP: every run trains the same model).
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
    for case in vanilla herald "herald scheduler.scoring=cost scheduler.order=confident"; do
        read -r mode settings <<< "$case"
        summary="results/$(basename "$config" .yaml)-$mode${settings:+-cost}.json"
        # shellcheck disable=SC2086  # settings: zero or more key=value words
        bash launch/train.sh "$config" scheduler.mode="$mode" $settings --summary-json "$summary"
        summaries+=("$summary")
    done
done
echo
hybrid compare "${summaries[@]}"
