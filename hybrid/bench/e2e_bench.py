"""``hybrid bench e2e``: training across emulated hosts joined by shaped links (docs/design.md section 12).

Each rank runs in its own network namespace (:mod:`hybrid.bench.emulated_hosts`),
so every embedding row and every allreduced gradient crosses veth links
shaped to ``--bandwidth`` (default 1 Gbit/s) and ``--latency-ms``. Two
workloads, as in the Herald paper's end-to-end runs:

- ``movielens-100k``: NCF on the real MovieLens-100k at embedding dim 512
  (the paper's default), one pass over the training split;
- ``w1-scale0.1``: Wide&Deep on synthetic Criteo-like data with the tables
  at 0.1 of Criteo Kaggle's cardinalities (3.4M rows), dim 128.

Each (workload, mode) is a separate ``hybrid train``; modes alternate within
a repeat and the report keeps medians, so a noisy machine slows them alike.
Per case it reports samples/s, test AUC, rows moved, milliseconds per stage,
and bytes per iteration: what each worker's link carried while it trained
(read from its interface counters), the embedding payload the store moved
(rows x row bytes, plus 8-byte ids), and the rest of the workers' traffic,
which is the allreduce (and protocol overhead). Rows and bytes are measured
over every iteration the run trained, warm-up included: they are what
crossed the links. Beside them, ``counted`` holds the figures ``hybrid
simulate`` reports for the same run (after ``scheduler.warmup_iterations``;
hybrid/training/figures.py), hit rate included. The namespaces' own
counters, read in the root namespace, give each host's bytes over the
whole run (start-up and evaluation included).

``--ps`` runs the store micro-benchmark (``hybrid bench ps``) across two
emulated hosts instead.
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from hybrid.bench import case_overrides
from hybrid.bench.emulated_hosts import EmulatedHosts, LinkShape
from hybrid.config import load_config

ROOT = Path(__file__).resolve().parents[2]
STAGES = ("data", "schedule_wait", "pull", "compute", "allreduce", "push", "barrier")
RUN_TIMEOUT_S = 1200


@dataclass(frozen=True)
class Workload:
    name: str
    config: str
    overrides: tuple
    iterations: int  # 0 = one pass over the training split
    synthetic: Optional[dict] = None  # how to make the store when it is missing


WORKLOADS = {
    "movielens-100k": Workload("movielens-100k", "configs/ml100k.yaml", ("model.embedding_dim=512",), 0),
    "w1-scale0.1": Workload("w1-scale0.1", "configs/w1-smoke.yaml",
                            ("model.embedding_dim=128", "data.path=data/w1-scale0.1"), 150,
                            {"like": "criteo-kaggle", "rows": 200_000, "scale": 0.1, "seed": 0}),
}


def prepare(workload: Workload, say: Callable[[str], None]) -> None:
    """Make the workload's store if it is missing (download MovieLens-100k, synthesize W1)."""
    config = load_config(str(ROOT / workload.config), list(workload.overrides))
    path = ROOT / config.data.path
    if (path / "meta.json").is_file():
        return
    if workload.synthetic is None:
        from hybrid.data.fetch import fetch_movielens_100k

        say(f"fetching MovieLens-100k into {path}")
        fetch_movielens_100k(path)
        return
    from hybrid.data.synthetic import synthesize

    say(f"synthesizing {path} ({workload.synthetic})")
    synthesize(path, **workload.synthetic)


def _mpirun(hosts: EmulatedHosts, ranks: int, argv: list[str], env: dict) -> list[str]:
    forwarded = [arg for key in sorted(env) for arg in ("-x", key)]
    return ["bash", str(ROOT / "launch" / "mpirun.sh"), "--tcp", *hosts.mpirun_args(),
            "-x", "PATH", "-x", "VIRTUAL_ENV", *forwarded, "-n", str(ranks), *argv]


def run_across(hosts: EmulatedHosts, ranks: int, argv: list[str], env: dict,
               timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    """``argv`` on ``ranks`` ranks, one per emulated host (e.g. a micro-benchmark under MPI); output captured."""
    return _run(_mpirun(hosts, ranks, argv, env), env, timeout)


def _run(command: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """Run ``command`` in its own session; on any exception (Ctrl-C, SIGTERM, timeout) kill the whole session.

    mpirun's daemons in the namespaces are in that session, so none is left
    behind when the namespaces are removed.
    """
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, **env}, cwd=ROOT, start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except BaseException:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(process.pid, sig)
                process.wait(timeout=10)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
        raise
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def train_once(hosts: EmulatedHosts, workload: Workload, mode: str, env: dict, overrides: list[str]) -> dict:
    """One ``hybrid train`` across the emulated hosts; returns its summary with the hosts' byte counters."""
    ranks = _ranks(workload, overrides)
    with tempfile.TemporaryDirectory(prefix="hybrid-e2e-") as tmp:
        summary_path = Path(tmp) / "summary.json"
        argv = [sys.executable, "-m", "hybrid", "train", str(ROOT / workload.config), *workload.overrides,
                *case_overrides(mode), f"train.iterations={workload.iterations}", *overrides,
                "--no-progress", "--summary-json", str(summary_path)]
        before = hosts.counters()
        command = _mpirun(hosts, ranks, argv, env)
        result = _run(command, env, RUN_TIMEOUT_S)
        after = hosts.counters()
        if result.returncode != 0 or not summary_path.is_file():
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-25:])
            raise RuntimeError(f"training failed with exit {result.returncode}:\n{' '.join(command)}\n{tail}")
        summary = json.loads(summary_path.read_text())
    summary["host_bytes"] = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before)][:ranks]
    return summary


def case_report(summaries: list[dict], link: str) -> dict:
    """Medians over the repeats of one (workload, mode), and bytes per iteration by kind."""
    last = summaries[-1]
    iterations = max(1, last["iterations"])
    workers = [r for r in last["ranks"] if r["role"] == "worker"]
    worker_link = [{k: v // iterations for k, v in r["train_link_bytes"].items()} for r in workers]
    t = last["transmissions"]
    ps_rows = t["pull_rows"] + t["push_rows"]
    upstream = (t["push_bytes"] + 8 * ps_rows) // iterations  # pushed rows, and every PS row's id (packed)
    downstream = t["pull_bytes"] // iterations
    p2p = t.get("p2p_bytes", 0) // iterations  # rows sent worker to worker: values only
    sent = sum(r["sent"] for r in worker_link)
    return {
        "link": link, "transport": last.get("transport"), "repeats": len(summaries),
        "samples_per_s": statistics.median(s["throughput"] for s in summaries),
        "samples_per_s_runs": [s["throughput"] for s in summaries],
        "auc": (last["evaluation"] or {}).get("auc"), "iterations": last["iterations"],
        # measured at the store over every iteration, as the link bytes below are
        "measured_over_iterations": last["iterations"],
        "rows_moved": t["rows"], "rows_per_iteration": round(t["rows"] / iterations, 1),
        # the figures hybrid simulate reports for this run: after the warm-up (older summaries lack them)
        "counted": last.get("counted"),
        "iteration_ms": {k: round(statistics.median(s["iteration_ms"].get(k, 0.0) for s in summaries), 3)
                         for k in STAGES},
        "bytes_per_iteration": {
            "embedding_payload": upstream + downstream + p2p,
            "workers_link_sent": sent,
            "workers_link_received": sum(r["received"] for r in worker_link),
            # bytes one worker sent to another (each counted once, at its sender): the allreduce
            "allreduce_and_other": max(0, sent - upstream - p2p),
            "per_worker_link": worker_link,
        },
        "host_bytes_whole_run": last["host_bytes"],
        "launch": last.get("launch"),  # how the ranks decided to wait (HYBRID_RANKS_PER_HOST: one machine)
    }


def run(*, workloads=tuple(WORKLOADS), modes=("vanilla", "herald"), shape: LinkShape = LinkShape(),
        repeats: int = 3, env: Optional[dict] = None, overrides=(), say=print) -> dict:
    """``{workload: {mode: report}}``, modes alternating within each repeat."""
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    chosen = [WORKLOADS[w] for w in workloads]
    for mode in modes:
        case_overrides(mode)  # a malformed case fails here, not after the first runs
    for workload in chosen:
        prepare(workload, say)
    ranks = max(_ranks(w, overrides) for w in chosen)
    env = {**one_machine_env(ranks), **(env or {})}
    summaries: dict = {(w.name, m): [] for w in chosen for m in modes}
    with EmulatedHosts(ranks, shape) as hosts:
        say(f"{ranks} emulated hosts, links {shape.label()}; launch/mpirun.sh --tcp {' '.join(hosts.mpirun_args())}")
        cases = [(w, m) for w in chosen for m in modes]
        for repeat in range(repeats):
            for workload, mode in (cases if repeat % 2 == 0 else cases[::-1]):
                start = time.perf_counter()
                summary = train_once(hosts, workload, mode, env, list(overrides))
                summaries[(workload.name, mode)].append(summary)
                say(f"repeat {repeat + 1}/{repeats} {workload.name:<15} {mode:<8} "
                    f"{summary['throughput']:>8.0f} samples/s  AUC {(summary['evaluation'] or {}).get('auc', 0):.4f}"
                    f"  ({time.perf_counter() - start:.0f} s)")
    result: dict = {}
    for workload in chosen:
        per_mode = {mode: case_report(summaries[(workload.name, mode)], shape.label()) for mode in modes}
        base = per_mode[modes[0]]["samples_per_s_runs"]
        for mode in modes:
            runs = per_mode[mode]["samples_per_s_runs"]
            per_mode[mode][f"speedup_vs_{modes[0]}"] = round(statistics.median(a / b for a, b in zip(runs, base)), 3)
        result[workload.name] = per_mode
    return result


def one_machine_env(ranks: int) -> dict:
    """Every emulated host shares this machine's cores, which MPI cannot see across namespaces: say so.

    Each rank then decides how to wait as if its host held all ``ranks``
    (hybrid/runtime/launch_facts.py): on this machine, yield while idle.
    """
    return {"HYBRID_RANKS_PER_HOST": str(ranks)}


def _ranks(workload: Workload, overrides) -> int:
    config = load_config(str(ROOT / workload.config), [*workload.overrides, *overrides])
    return config.cluster.workers + config.cluster.ps


def run_ps(*, shape: LinkShape = LinkShape(), dims=(16, 128, 512), say=print) -> list[dict]:
    """``hybrid bench ps`` between two emulated hosts (a worker and a PS); its result rows."""
    with EmulatedHosts(2, shape) as hosts:
        argv = [sys.executable, "-m", "hybrid", "bench", "ps", "--dims", ",".join(map(str, dims)), "--json"]
        say(f"2 emulated hosts, links {shape.label()}")
        env = one_machine_env(2)
        result = _run(_mpirun(hosts, 2, argv, env), env, RUN_TIMEOUT_S)
        if result.returncode != 0:
            raise RuntimeError(f"bench ps failed with exit {result.returncode}:\n{result.stderr[-3000:]}")
        return json.loads(result.stdout.strip().splitlines()[-1])


def run_sharding(*, shape: LinkShape = LinkShape(), out: Path, iterations: int = 30, say=print) -> dict:
    """``hybrid bench sharding`` with every rank on its own emulated host (1 worker + 4 PS); its document.

    The cost data is collected across the same links, so the cost models
    learn what the network charges, as they would on a cluster.
    """
    with EmulatedHosts(5, shape) as hosts:
        argv = [sys.executable, "-m", "hybrid", "bench", "sharding", "--iterations", str(iterations),
                "--out", str(Path(out).resolve())]
        say(f"5 emulated hosts (1 worker + 4 PS ranks), links {shape.label()}")
        env = one_machine_env(5)
        result = _run(_mpirun(hosts, 5, argv, env), env, RUN_TIMEOUT_S)
        if result.returncode != 0:
            raise RuntimeError(f"bench sharding failed with exit {result.returncode}:\n{result.stderr[-3000:]}")
        return json.loads((Path(out) / "sharding.json").read_text())  # the file: other ranks share stdout


def format_table(result: dict) -> str:
    width = max(9, *(len(mode) + 1 for modes in result.values() for mode in modes))
    lines = [f"{'workload':<16}{'mode':<{width}}{'samples/s':>10}{'speedup':>8}{'AUC':>8}{'rows/it':>9}{'hit':>7}"
             + "".join(f"{s[:8]:>9}" for s in STAGES) + f"{'emb KB/it':>10}{'rest KB/it':>11}{'worker links sent KB/it':>25}"]
    for workload, modes in result.items():
        first = next(iter(modes))
        for mode, r in modes.items():
            b = r["bytes_per_iteration"]
            per_worker = "/".join(f"{w['sent'] / 1e3:.0f}" for w in b["per_worker_link"])
            lines.append(f"{workload:<16}{mode:<{width}}{r['samples_per_s']:>10.0f}{r[f'speedup_vs_{first}']:>8.2f}"
                         f"{r['auc'] or float('nan'):>8.4f}{r['rows_per_iteration']:>9.0f}{_hit_rate(r):>7}"
                         + "".join(f"{r['iteration_ms'][s]:>9.2f}" for s in STAGES)
                         + f"{b['embedding_payload'] / 1e3:>10.0f}{b['allreduce_and_other'] / 1e3:>11.0f}{per_worker:>25}")
    first_case = next(iter(next(iter(result.values())).values()))
    warmup = (first_case.get("counted") or {}).get("after_warmup")
    after = f" after the {warmup} warm-up iterations" if warmup else ""
    return (f"links {first_case['link']}; rows, ms and bytes per iteration measured over every iteration; "
            f"hit rate{after}, as hybrid simulate counts it\n" + "\n".join(lines))


def _hit_rate(report: dict) -> str:
    counted = report.get("counted")
    return f"{counted['hit_rate']:.1%}" if counted and counted["iterations"] else "-"


def plot(result: dict, path: Path) -> None:
    """samples/s, speedup, iteration breakdown and bytes per iteration, one panel each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, reports = [], []
    for workload, modes in result.items():
        for mode, r in modes.items():
            labels.append(f"{workload}\n{mode}")
            reports.append(r)
    first = next(iter(next(iter(result.values()))))
    x = range(len(reports))
    fig, axes = plt.subplots(2, 2, figsize=(13, 8))
    axes[0][0].bar(x, [r["samples_per_s"] for r in reports], color="tab:blue")
    axes[0][0].set_title("samples/s (median)")
    axes[0][1].bar(x, [r[f"speedup_vs_{first}"] for r in reports], color="tab:green")
    axes[0][1].axhline(1.0, color="grey", linewidth=0.8)
    axes[0][1].set_title(f"speedup over {first} (median of paired runs)")
    bottom = [0.0] * len(reports)
    for stage in STAGES:
        values = [r["iteration_ms"][stage] for r in reports]
        axes[1][0].bar(x, values, bottom=bottom, label=stage)
        bottom = [b + v for b, v in zip(bottom, values)]
    axes[1][0].set_title("ms per iteration by stage")
    axes[1][0].legend(fontsize=7)
    emb = [r["bytes_per_iteration"]["embedding_payload"] / 1e6 for r in reports]
    rest = [r["bytes_per_iteration"]["allreduce_and_other"] / 1e6 for r in reports]
    axes[1][1].bar(x, emb, label="embedding payload")
    axes[1][1].bar(x, rest, bottom=emb, label="allreduce and other")
    axes[1][1].set_title("MB per iteration on the workers' links")
    axes[1][1].legend(fontsize=7)
    for ax in (a for row in axes for a in row):
        ax.set_xticks(list(x), labels, fontsize=7)
    fig.suptitle(f"hybrid bench e2e: links {reports[0]['link']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
