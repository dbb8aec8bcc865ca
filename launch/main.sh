#!/usr/bin/env bash
# The main job on a fresh machine: set up, build small synthetic Criteo-like
# data (workload W1, smoke size), report its access statistics and simulate
# the scheduler on it (transmissions per mode). Multi-rank training joins
# this script with the runtime issue.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/launch/setup.sh"
source "${HYBRID_VENV:-$ROOT/.venv}/bin/activate"
cd "$ROOT"
CONFIG=${1:-configs/w1-smoke.yaml}
hybrid synth --config "$CONFIG"
hybrid stats "$(hybrid config "$CONFIG" | python -c 'import sys, yaml; print(yaml.safe_load(sys.stdin)["data"]["path"])')"
hybrid simulate --config "$CONFIG"
