"""``hybrid bench train``: end-to-end training at smoke and at full table size, side by side.

The question it answers: does an iteration cost what its batch costs, or
what the tables cost? It trains one workload twice: on its own (smoke) store
and on a store with the same generator at scale 1.0 (the public dataset's
full cardinalities, e.g. 33.76M rows for Criteo Kaggle), each with every
mode. Each case is a separate ``hybrid train`` under ``launch/mpirun.sh``;
within a repeat the cases alternate (modes and sizes interleaved) so that a
noisy machine slows all of them alike, and the table reports medians.

Reported per case: samples/s, embedding rows moved, milliseconds per stage,
PS start-up seconds and peak memory over its shard, the largest worker peak
memory; then throughput ratios full/smoke per mode and mode/vanilla per size,
each the median over repeats of the ratio within a repeat.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hybrid.bench import case_overrides
from hybrid.config import Config, ConfigError, load_config
from hybrid.training.summary_text import counted_rows

ROOT = Path(__file__).resolve().parents[2]
STAGES = ("data", "schedule_wait", "pull", "compute", "allreduce", "push", "barrier")


@dataclass
class Case:
    size: str
    mode: str
    store: Path
    summaries: list = field(default_factory=list)

    def median(self, pick: Callable[[dict], float]) -> float:
        return statistics.median(pick(s) for s in self.summaries)

    def to_dict(self) -> dict:
        ps = [r for r in self.summaries[-1]["ranks"] if r["role"] == "ps"]
        workers = [r for r in self.summaries[-1]["ranks"] if r["role"] == "worker"]
        last = self.summaries[-1]
        return {
            "size": self.size, "mode": self.mode, "store": str(self.store), "table_rows": last["table_rows"],
            "samples_per_s": self.median(lambda s: s["throughput"]),
            "samples_per_s_runs": [s["throughput"] for s in self.summaries],
            # both after the warm-up, as hybrid simulate and hybrid compare count them
            "rows_moved": counted_rows(last), "hit_rate": last["hit_rate"],
            "auc": (last["evaluation"] or {}).get("auc"),
            "iteration_ms": {k: round(self.median(lambda s: s["iteration_ms"].get(k, 0.0)), 3) for k in STAGES},
            "ps_startup_s": max(r["startup_s"] for r in ps), "ps_peak_rss_mb": max(r["peak_rss_mb"] for r in ps),
            "ps_shard_mb": last["ps_shard_mb"],
            "ps_peak_over_shard": round(max(r["peak_rss_mb"] for r in ps) / max(last["ps_shard_mb"], 1e-9), 3),
            "worker_startup_s": max(r["startup_s"] for r in workers),
            "worker_peak_rss_mb": max(r["peak_rss_mb"] for r in workers),
        }


def store_specs(config: Config, sizes, full_rows: int) -> dict[str, tuple[Path, dict]]:
    """Per size, where its store lives and how ``hybrid synth`` makes it.

    ``smoke`` is the config's own store; ``full`` the same generator at scale
    1.0 (the public dataset's cardinalities) with ``full_rows`` samples.
    """
    if config.data.synthetic is None:
        raise ConfigError(f"{config.name}: data.synthetic is not set; bench train scales a synthetic workload")
    spec = config.data.synthetic
    smoke = {"like": spec.like, "rows": spec.rows, "scale": spec.scale, "seed": spec.seed,
             "recurrence": spec.recurrence()}
    specs = {"smoke": (Path(config.data.path), smoke),
             "full": (Path(config.data.path).parent / f"{config.name}-full-{full_rows}",
                      {**smoke, "rows": full_rows, "scale": 1.0})}
    unknown = [size for size in sizes if size not in specs]
    if unknown:
        raise ConfigError(f"--sizes: expected smoke and/or full, got {', '.join(unknown)}")
    return {size: specs[size] for size in sizes}


def ensure_store(path: Path, synthetic: dict, say: Callable[[str], None]) -> None:
    from hybrid.data.synthetic import synthesize

    if (path / "meta.json").is_file():
        return
    say(f"synthesizing {path} ({synthetic})")
    synthesize(path, **synthetic)


def run_case(config_path: str, case: Case, iterations: int, ranks: int, overrides: list[str]) -> dict:
    """One ``hybrid train`` under mpirun; returns its summary."""
    with tempfile.TemporaryDirectory(prefix="hybrid-bench-") as tmp:
        summary_path = Path(tmp) / "summary.json"
        command = ["bash", str(ROOT / "launch" / "mpirun.sh"), "-n", str(ranks), sys.executable, "-m", "hybrid",
                   "train", config_path, f"data.path={case.store}", *case_overrides(case.mode),
                   f"train.iterations={iterations}", *overrides, "--no-progress", "--summary-json", str(summary_path)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0 or not summary_path.is_file():
            tail = "\n".join((result.stdout.splitlines() + result.stderr.splitlines())[-30:])
            raise RuntimeError(f"training failed with exit {result.returncode}, summary "
                               f"{'written' if summary_path.is_file() else 'missing'} ({' '.join(command)}):\n{tail}")
        return json.loads(summary_path.read_text())


def run(*, config_path: str, sizes=("smoke", "full"), modes=("vanilla", "herald"), iterations: int = 200,
        repeats: int = 3, full_rows: int = 2_000_000, overrides=(), progress=print) -> dict:
    config = load_config(config_path, list(overrides))
    for mode in modes:
        case_overrides(mode)  # a malformed case fails here, not after the first runs
    stores = store_specs(config, sizes, full_rows)
    for path, synthetic in stores.values():
        ensure_store(path, synthetic, progress)
    ranks = config.cluster.workers + config.cluster.ps
    cases = [Case(size, mode, stores[size][0]) for size in sizes for mode in modes]
    for repeat in range(repeats):
        order = cases if repeat % 2 == 0 else cases[::-1]  # alternate, so drift hits every case alike
        for case in order:
            summary = run_case(config_path, case, iterations, ranks, list(overrides))
            case.summaries.append(summary)
            progress(f"repeat {repeat + 1}/{repeats} {case.size:<6} {case.mode:<8} {summary['throughput']:>9.0f} samples/s")
    rows = [case.to_dict() for case in cases]
    return {"config": config.name, "iterations": iterations, "repeats": repeats, "ranks": ranks,
            "cases": rows, "ratios": ratios(rows, sizes, modes)}


def ratios(rows: list[dict], sizes, modes) -> dict:
    """Throughput of each size over the first size's, and of each mode over the first mode's.

    Each is the median over repeats of the ratio within one repeat: the two
    runs of a pair ran minutes apart at most, so slow drift of a shared
    machine cancels out.
    """
    runs = {(r["size"], r["mode"]): r["samples_per_s_runs"] for r in rows}

    def paired(a, b) -> float:
        return round(statistics.median(x / y for x, y in zip(runs[a], runs[b])), 3)

    out = {}
    for size in sizes[1:]:
        for mode in modes:
            out[f"{size}/{sizes[0]} {mode}"] = paired((size, mode), (sizes[0], mode))
    for size in sizes:
        for mode in modes[1:]:
            out[f"{mode}/{modes[0]} {size}"] = paired((size, mode), (size, modes[0]))
    return out


def format_table(result: dict) -> str:
    width = max(9, *(len(r["mode"]) + 1 for r in result["cases"]))
    head = (f"{'size':<6}{'mode':<{width}}{'rows':>10}{'samples/s':>10}{'moved':>10}"
            + "".join(f"{s[:8]:>9}" for s in STAGES) + f"{'PS up s':>8}{'PS/shard':>9}{'wk MB':>8}")
    lines = [f"{result['config']}: {result['iterations']} iterations, median of {result['repeats']}, "
             f"{result['ranks']} ranks; ms per iteration by stage", head]
    for r in result["cases"]:
        lines.append(f"{r['size']:<6}{r['mode']:<{width}}{r['table_rows']:>10}{r['samples_per_s']:>10.0f}{r['rows_moved']:>10}"
                     + "".join(f"{r['iteration_ms'][s]:>9.2f}" for s in STAGES)
                     + f"{r['ps_startup_s']:>8.1f}{r['ps_peak_over_shard']:>9.2f}{r['worker_peak_rss_mb']:>8.0f}")
    lines.append("ratios (median of per-repeat ratios): "
                 + ", ".join(f"{k} {v:.2f}" for k, v in result["ratios"].items()))
    return "\n".join(lines)
