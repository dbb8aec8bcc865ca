"""``hybrid project --validate CONFIG --profile FILE``: the model's predictions against runs it never saw.

Each case (``MODE[+KEY=VALUE...]``, as ``hybrid bench train`` names them) is
trained on this host by ``hybrid bench train`` (interleaved, medians of the
repeats) and predicted from the profile and its own loads. The floor runs
among them: this machine's speed drifts by tens of percent within an hour,
so every CPU cost of the profile is scaled by the floor's ms per iteration
now over the floor's at calibration (``speed``; the floor is a measure of
the machine, not a case predicted). Reported per
case: measured and predicted ms per iteration, per stage and in total, the
relative error, and each case's throughput over the first case's, measured
(the median of per-repeat ratios) and predicted. The emulated-host cases
(``hybrid bench e2e``) are not part of it yet (docs/projection.md).
"""
from __future__ import annotations

import os
import statistics
from typing import Callable

from hybrid.bench import case_overrides, train_bench
from hybrid.config import load_config
from hybrid.data.store import BatchStore
from hybrid.projection.calibration import FLOOR, read_profile
from hybrid.projection.prediction import predict
from hybrid.projection.time_model import Cluster

# multi-worker runs on one host: the calibration runs one worker only
ONE_HOST_CASES = ("vanilla+cluster.workers=3", "herald+cluster.workers=3", "het+cluster.workers=3",
                  "herald+cluster.workers=2", "het+cluster.workers=2")


def one_host(config, cores: int) -> Cluster:
    """Every rank of ``config`` on this host, sharing its ``cores``."""
    return Cluster(workers=config.cluster.workers, ps=config.cluster.ps, workers_per_host=config.cluster.workers,
                   cores_per_host=cores)


def compare(cases: list[dict]) -> dict:
    """Errors of ``cases`` (each with ``measured_ms``, ``predicted_ms``, ``measured_ratio``, ``predicted_ratio``):
    the median and largest relative error of ms per iteration, the largest error of a throughput ratio."""
    errors = [abs(c["predicted_ms"] - c["measured_ms"]) / c["measured_ms"] for c in cases]
    ratios = [abs(c["predicted_ratio"] - c["measured_ratio"]) for c in cases[1:]]
    return {"median_error": round(statistics.median(errors), 4), "max_error": round(max(errors), 4),
            "max_ratio_error": round(max(ratios), 4) if ratios else 0.0}


def validate(config_path: str, profile_path: str, *, cases=ONE_HOST_CASES, overrides=(), iterations: int = 300,
             repeats: int = 3, say: Callable[[str], None] = print) -> dict:
    """Measure and predict every case; the first is the ratios' denominator."""
    overrides, profile = list(overrides), read_profile(profile_path)
    cases = list(cases)
    measured = train_bench.run(config_path=config_path, sizes=("smoke",), modes=(FLOOR, *cases),
                               iterations=iterations, repeats=repeats, overrides=overrides, progress=say)
    if measured["failed"]:
        raise RuntimeError(f"validation runs failed: {measured['failed']}")
    rows = {r["mode"]: r for r in measured["cases"]}
    batch = load_config(config_path, overrides).train.batch_per_worker
    speed = rows[FLOOR]["iteration_ms"]["compute"] / profile.floor_ms(batch)
    profile = profile.slower(speed)
    cores = os.cpu_count() or 1
    out = []
    for case in cases:
        config = load_config(config_path, [*overrides, *case_overrides(case), f"train.iterations={iterations}"])
        predicted = predict(config, BatchStore.of(config.data, "train"), one_host(config, cores), profile,
                            iterations=iterations)  # the scheduler: timed now, at the machine's speed now
        row = rows[case]
        out.append({"case": case, "global_batch": config.global_batch,
                    "measured_ms": round(1e3 * config.global_batch / row["samples_per_s"], 3),
                    "predicted_ms": round(predicted["iteration_ms"], 3),
                    "measured_stages": row["iteration_ms"],
                    "predicted_stages": {k: round(v, 3) for k, v in predicted["stages"].items()},
                    "runs_samples_per_s": row["samples_per_s_runs"]})
    first = out[0]
    for case in out:
        case["error"] = round((case["predicted_ms"] - case["measured_ms"]) / case["measured_ms"], 4)
        case["predicted_ratio"] = round((case["global_batch"] / case["predicted_ms"])
                                        / (first["global_batch"] / first["predicted_ms"]), 3)
        case["measured_ratio"] = round(statistics.median(
            a / b for a, b in zip(case["runs_samples_per_s"], first["runs_samples_per_s"])), 3)
    return {"config": measured["config"], "profile": str(profile_path), "iterations": iterations, "repeats": repeats,
            "cores": cores, "speed": round(speed, 3), "cases": out, **compare(out)}


def format_table(result: dict) -> str:
    lines = [f"{result['config']}: measured (hybrid bench train, median of {result['repeats']}) against predicted "
             f"(profile {result['profile']}, its costs x {result['speed']:.2f}: the floor now over then), ms per "
             f"iteration",
             f"{'case':<28}{'measured':>10}{'predicted':>10}{'error':>8}{'ratio':>8}{'pred.':>8}"]
    for c in result["cases"]:
        lines.append(f"{c['case']:<28}{c['measured_ms']:>10.2f}{c['predicted_ms']:>10.2f}{c['error']:>8.1%}"
                     f"{c['measured_ratio']:>8.2f}{c['predicted_ratio']:>8.2f}")
    lines.append(f"median |error| {result['median_error']:.1%}, largest {result['max_error']:.1%}, largest ratio "
                 f"error {result['max_ratio_error']:.2f}")
    return "\n".join(lines)
