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
(the median of per-repeat ratios) and predicted.

Across emulated hosts (``--e2e WORKLOAD=PROFILE``, as root): each link of
``links`` joins one host per rank (``hybrid bench e2e``, the packed
transport), every case of ``E2E_CASES`` is trained there and predicted
with that workload's profile (calibrated with ``--across-hosts none``: the
store's operations over TCP) on hosts emulated on this machine; the floor
of that workload runs right before each link's runs, for the speed.
Ratios are taken within a group (one host; a workload over one link),
against the group's first case.
"""
from __future__ import annotations

import os
import statistics
from typing import Callable, Optional

from hybrid.bench import case_overrides, train_bench
from hybrid.bench.result_files import finish, pyplot
from hybrid.config import load_config
from hybrid.data.store import BatchStore
from hybrid.projection.calibration import FLOOR, read_profile
from hybrid.projection.prediction import predict
from hybrid.projection.time_model import Cluster

# multi-worker runs on one host: the calibration runs one worker only
ONE_HOST_CASES = ("vanilla+cluster.workers=3", "herald+cluster.workers=3", "het+cluster.workers=3",
                  "fae+cluster.workers=3", "vanilla+cluster.workers=2", "herald+cluster.workers=2",
                  "het+cluster.workers=2")

E2E_CASES = ("vanilla", "herald", "herald+scheduler.scoring=cost+scheduler.order=confident",
             "het+scheduler.staleness=0", "fae")


def rate_gbps(rate: Optional[str]) -> Optional[float]:
    """A tc rate (``1gbit``, ``100mbit``) in Gbit/s, as ``LinkShape`` reads it; None (unshaped) stays None."""
    from hybrid.bench.emulated_hosts import LinkShape

    bits_per_s = LinkShape(rate).bits_per_s()
    if rate is not None and bits_per_s is None:
        raise ValueError(f"link rate {rate!r}: expected a tc rate such as 1gbit or 100mbit")
    return None if bits_per_s is None else bits_per_s / 1e9


def one_host(config, cores: int) -> Cluster:
    """Every rank of ``config`` on this host, sharing its ``cores``."""
    return Cluster(workers=config.cluster.workers, ps=config.cluster.ps, workers_per_host=config.cluster.workers,
                   cores_per_host=cores)


def compare(cases: list[dict]) -> dict:
    """Errors of ``cases`` (each with ``case``, ``measured_ms``, ``predicted_ms``, ``measured_ratio``,
    ``predicted_ratio``): the median and largest relative error of ms per iteration; the largest error of a
    herald case's throughput over its cluster's first case (vanilla), and of any case's."""
    errors = [abs(c["predicted_ms"] - c["measured_ms"]) / c["measured_ms"] for c in cases]
    ratios = [(c["case"], abs(c["predicted_ratio"] - c["measured_ratio"])) for c in cases if not c.get("first")]
    herald = [error for case, error in ratios if case.startswith("herald")]
    return {"median_error": round(statistics.median(errors), 4), "max_error": round(max(errors), 4),
            "max_ratio_error": round(max(herald), 4) if herald else 0.0,
            "max_any_ratio_error": round(max(error for _, error in ratios), 4) if ratios else 0.0}


def validate(config_path: str, profile_path: str, *, cases=ONE_HOST_CASES, overrides=(), iterations: int = 300,
             repeats: int = 3, e2e=(), links=(None, "1gbit", "100mbit"), e2e_cases=E2E_CASES,
             e2e_repeats: Optional[int] = None, say: Callable[[str], None] = print) -> dict:
    """Measure and predict every case: ``cases`` on this host, and for each ``(workload, profile path)`` of
    ``e2e`` every one of ``e2e_cases`` across emulated hosts over each of ``links``."""
    out, speeds = [], {}
    if cases:
        one, speeds["one host"] = _one_host(config_path, profile_path, list(cases), list(overrides), iterations,
                                            repeats, say)
        out += one
    for workload, e2e_profile in e2e:
        for link in links:
            group, speeds[f"{workload} {link or 'unshaped'}"] = _emulated(workload, e2e_profile, link,
                                                                         list(e2e_cases), e2e_repeats or repeats,
                                                                         say)
            out += group
    return {"config": config_path, "profile": str(profile_path), "iterations": iterations, "repeats": repeats,
            "e2e_repeats": e2e_repeats or repeats, "cores": os.cpu_count() or 1, "speed": speeds, "cases": out,
            **compare(out)}


def _ratios(group: list[dict]) -> None:
    """Each case's throughput over the group's first case of the same cluster (its global batch: the first is
    vanilla), predicted and measured (the median of per-repeat ratios)."""
    firsts: dict = {}
    for case in group:
        first = firsts.setdefault(case["global_batch"], case)
        case["error"] = round((case["predicted_ms"] - case["measured_ms"]) / case["measured_ms"], 4)
        case["predicted_ratio"] = round((case["global_batch"] / case["predicted_ms"])
                                        / (first["global_batch"] / first["predicted_ms"]), 3)
        case["measured_ratio"] = round(statistics.median(
            a / b for a, b in zip(case["runs_samples_per_s"], first["runs_samples_per_s"])), 3)
        case["first"] = first is case


def _case(case: str, group: str, config, measured: dict, predicted: dict) -> dict:
    """One case's row: ``measured`` as ``hybrid bench train`` and ``hybrid bench e2e`` report a case (samples/s,
    its runs', ms per stage), ``predicted`` as ``prediction.predict`` returns it."""
    return {"case": case, "group": group, "global_batch": config.global_batch,
            "measured_ms": round(1e3 * config.global_batch / measured["samples_per_s"], 3),
            "predicted_ms": round(predicted["iteration_ms"], 3), "measured_stages": measured["iteration_ms"],
            "predicted_stages": {k: round(v, 3) for k, v in predicted["stages"].items()},
            "runs_samples_per_s": measured["samples_per_s_runs"]}


def _one_host(config_path: str, profile_path: str, cases: list, overrides: list, iterations: int, repeats: int,
              say) -> tuple[list, float]:
    """The one-host cases measured and predicted, and the profile's speed factor then."""
    profile = read_profile(profile_path)
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
        out.append(_case(case, "one host", config, rows[case], predicted))
    _ratios(out)
    return out, round(speed, 3)


def _emulated(workload_name: str, profile_path: str, rate: Optional[str], cases: list, repeats: int,
              say) -> tuple[list, float]:
    """One workload's cases across emulated hosts joined by ``rate``, measured and predicted, and the speed."""
    from hybrid.bench import e2e_bench
    from hybrid.bench.emulated_hosts import LinkShape

    workload = e2e_bench.WORKLOADS[workload_name]
    config_path = str(e2e_bench.ROOT / workload.config)
    base = [*workload.overrides, f"train.iterations={workload.iterations}"]
    e2e_bench.prepare(workload, say)
    floor = train_bench.run(config_path=config_path, sizes=("smoke",), modes=(FLOOR,), iterations=300, repeats=1,
                            overrides=list(workload.overrides), progress=say)
    profile = read_profile(profile_path)
    batch = load_config(config_path, base).train.batch_per_worker
    speed = floor["cases"][0]["iteration_ms"]["compute"] / profile.floor_ms(batch)
    profile = profile.slower(speed)
    shape = LinkShape(rate)
    measured = e2e_bench.run(workloads=(workload_name,), modes=tuple(cases), shape=shape, repeats=repeats,
                             say=say)[workload_name]
    cores, out = os.cpu_count() or 1, []
    for case in cases:
        config = load_config(config_path, [*base, *case_overrides(case)])
        cluster = Cluster(workers=config.cluster.workers, ps=config.cluster.ps, workers_per_host=1,
                          gbps=rate_gbps(rate), cores_per_host=cores, one_machine=True,
                          burst_bytes=shape.burst_bytes())
        predicted = predict(config, BatchStore.of(config.data, "train"), cluster, profile,
                            iterations=workload.iterations)
        out.append(_case(case, f"{workload_name} {shape.label()}", config, measured[case], predicted))
    _ratios(out)
    return out, round(speed, 3)


def format_table(result: dict) -> str:
    speeds = ", ".join(f"{group} x {speed:.2f}" for group, speed in result["speed"].items())
    lines = [f"measured (medians of {result['repeats']} on one host, of {result.get('e2e_repeats', result['repeats'])} "
             f"across emulated hosts) against predicted, ms per iteration; the profiles' costs "
             f"scaled by the floor now over then: {speeds}",
             f"{'group':<26}{'case':<56}{'measured':>10}{'predicted':>10}{'error':>8}{'ratio':>8}{'pred.':>8}"]
    for c in result["cases"]:
        lines.append(f"{c['group']:<26}{c['case']:<56}{c['measured_ms']:>10.2f}{c['predicted_ms']:>10.2f}"
                     f"{c['error']:>8.1%}{c['measured_ratio']:>8.2f}{c['predicted_ratio']:>8.2f}")
    lines.append(f"median |error| {result['median_error']:.1%}, largest {result['max_error']:.1%}; largest error "
                 f"of herald over vanilla {result['max_ratio_error']:.2f}, of any ratio "
                 f"{result.get('max_any_ratio_error', 0.0):.2f}")
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    """Two panels: predicted against measured ms per iteration (log scales, the 15% and 35% bounds shaded),
    and each case's throughput over its group's first case, predicted against measured (the 0.10 bound)."""
    cases = result["cases"]
    figure, (times, ratios) = pyplot().subplots(1, 2, figsize=(11, 4.6))
    low = min(min(c["measured_ms"], c["predicted_ms"]) for c in cases) / 1.5
    high = max(max(c["measured_ms"], c["predicted_ms"]) for c in cases) * 1.5
    line = [low, high]
    for bound, alpha in ((0.35, 0.08), (0.15, 0.15)):
        times.fill_between(line, [x * (1 - bound) for x in line], [x * (1 + bound) for x in line], color="grey",
                           alpha=alpha, lw=0)
    times.plot(line, line, color="grey", lw=0.8)
    for group in dict.fromkeys(c["group"] for c in cases):
        mine = [c for c in cases if c["group"] == group]
        times.scatter([c["measured_ms"] for c in mine], [c["predicted_ms"] for c in mine], s=18, label=group)
        others = [c for c in mine if not c.get("first")]
        ratios.scatter([c["measured_ratio"] for c in others], [c["predicted_ratio"] for c in others], s=18,
                       label=group)
    times.set(xscale="log", yscale="log", xlim=line, ylim=line, xlabel="measured ms per iteration",
              ylabel="predicted ms per iteration",
              title=f"median |error| {result['median_error']:.1%}, largest {result['max_error']:.1%}")
    span = [c[k] for c in cases for k in ("measured_ratio", "predicted_ratio")]
    edge = [min(span) - 0.1, max(span) + 0.1]
    ratios.fill_between(edge, [x - 0.1 for x in edge], [x + 0.1 for x in edge], color="grey", alpha=0.15, lw=0)
    ratios.plot(edge, edge, color="grey", lw=0.8)
    ratios.set(xlim=edge, ylim=edge, xlabel="measured throughput / the group's first case",
               ylabel="predicted", title=f"largest error of herald / vanilla {result['max_ratio_error']:.2f}")
    for axis in (times, ratios):
        axis.grid(True, which="both", alpha=0.3)
    ratios.legend(fontsize=7)
    finish(figure, path, f"hybrid project --validate: {result['config']} on this host, and across emulated hosts")
