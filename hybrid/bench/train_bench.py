"""``hybrid bench train``: end-to-end training side by side: modes, sizes, batch sizes, the floor, another checkout.

The question it answers: what does an iteration cost beyond its model's
arithmetic, and does it cost what its batch costs or what the tables cost?
Each case is a separate ``hybrid train`` under ``launch/mpirun.sh``, named
``MODE[+KEY=VALUE...]`` (its own settings, e.g. ``herald+cluster.workers=1+
cluster.ps=1``, ranks included). Within a repeat the cases alternate (modes,
sizes, batch sizes and checkouts interleaved) so that a noisy machine slows
all of them alike, and the table reports medians.

- ``plain[+KEY=VALUE...]``: the floor, the same model and global batches in
  one plain PyTorch process on one thread (``hybrid bench plain``): a case's
  ratio to it is what the system keeps of the model's own speed.
- sizes: the config's own (smoke) store and one with the same generator at
  scale 1.0 (the public dataset's full cardinalities, e.g. 33.76M rows for
  Criteo Kaggle).
- ``batches``: ``train.batch_per_worker`` values; with two or more, each
  stage's milliseconds per iteration are fitted as a fixed cost per
  iteration (the calls) plus a cost per sample (per row moved for pull and
  push), by least squares over the batch sizes.
- ``beside``: a checkout of another commit (built: ``launch/setup.sh`` or
  ``python setup.py build_ext --inplace`` there): every case also runs from
  it (``CASE@beside``), and each case's ratio to its twin there is reported.

Reported per case: samples/s, embedding rows moved, milliseconds per stage
and outside compute, PS start-up seconds and peak memory over its shard, the
largest worker peak memory; then throughput ratios, each the median over
repeats of the ratio within a repeat.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from hybrid.bench import case_overrides
from hybrid.config import Config, ConfigError, load_config
from hybrid.training.summary_text import counted_rows, other_ms

ROOT = Path(__file__).resolve().parents[2]
# the training loop's stages (hybrid.training.loop.STAGES) and "other": the rest of an iteration's time
STAGES = ("data", "schedule_wait", "pull", "compute", "allreduce", "push", "barrier", "other")


OUTSIDE_COMPUTE = tuple(stage for stage in STAGES if stage != "compute")
PLAIN = "plain"  # the floor's case name (hybrid.bench.plain_torch)


def other_ms_of(summary: dict) -> float:
    """An iteration's time outside its stages, from a summary that does not report it (another checkout's), as
    ``hybrid train`` computes it (``summary_text.other_ms``); 0 for the floor's, which has no iterations."""
    training = summary.get("seconds", 0.0) - summary.get("paused_seconds", 0.0)
    return round(other_ms(training, summary.get("iterations", 0), summary["iteration_ms"]), 3)


def is_floor(case: str) -> bool:
    """Whether a case (``plain[+KEY=VALUE...]``) is the one-process floor, not a mode."""
    return case.split("+")[0] == PLAIN


@dataclass
class Case:
    size: str
    mode: str  # the case: MODE[+KEY=VALUE...], or plain[+KEY=VALUE...]
    store: Path
    batch: Optional[int] = None  # train.batch_per_worker, None: the config's
    tree: Path = ROOT  # the checkout it runs from
    label: str = ""  # "" here, "@beside" for the other checkout
    summaries: list = field(default_factory=list)
    error: Optional[str] = None  # why a run of it failed; it is then left out of the later repeats and the table

    @property
    def name(self) -> str:
        return self.mode + self.label

    def median(self, pick: Callable[[dict], float]) -> float:
        return statistics.median(pick(s) for s in self.summaries)

    def to_dict(self) -> dict:
        last = self.summaries[-1]
        for summary in self.summaries:
            summary["iteration_ms"].setdefault("other", other_ms_of(summary))
        ms = {k: round(self.median(lambda s: s["iteration_ms"].get(k, 0.0)), 3) for k in STAGES}
        row = {"size": self.size, "mode": self.mode, "case": self.name, "batch_per_worker": last["batch_per_worker"],
               "tree": str(self.tree), "store": str(self.store),
               "samples_per_s": self.median(lambda s: s["throughput"]),
               "samples_per_s_runs": [s["throughput"] for s in self.summaries],
               "iteration_ms": ms, "table_rows": last["table_rows"],
               "outside_compute_ms": round(self.median(lambda s: sum(s["iteration_ms"].get(k, 0.0)
                                                                     for k in OUTSIDE_COMPUTE)), 3)}
        if is_floor(self.mode):
            return {**row, "rows_moved": 0, "rows_per_iteration": 0.0}
        ps = [r for r in last["ranks"] if r["role"] == "ps"]
        workers = [r for r in last["ranks"] if r["role"] == "worker"]
        return {
            **row, "workers": last["workers"], "ps": last["ps"],
            # both after the warm-up, as hybrid simulate and hybrid compare count them
            "rows_moved": counted_rows(last), "hit_rate": last["hit_rate"],
            # rows each worker moved through the store per iteration (the per-row fit's x for pull and push)
            "rows_per_iteration": round(last["transmissions"]["rows"] / max(1, last["iterations"] * last["workers"]),
                                        2),
            "auc": (last["evaluation"] or {}).get("auc"),
            "ps_startup_s": max(r["startup_s"] for r in ps), "ps_peak_rss_mb": max(r["peak_rss_mb"] for r in ps),
            "ps_shard_mb": last["ps_shard_mb"],
            "ps_peak_over_shard": round(max(r["peak_rss_mb"] for r in ps) / max(last["ps_shard_mb"], 1e-9), 3),
            "worker_startup_s": max(r["startup_s"] for r in workers),
            "worker_peak_rss_mb": max(r["peak_rss_mb"] for r in workers),
        }


def store_specs(config: Config, sizes, full_rows: int) -> dict[str, tuple[Path, dict]]:
    """Per size, where its store lives and how ``hybrid synth`` makes it.

    ``smoke`` is the config's own store; ``full`` the same generator at scale
    1.0 (the public dataset's cardinalities) with ``full_rows`` samples. A
    config of real data (no ``data.synthetic``) has its own store only.
    """
    if config.data.synthetic is None:  # real data: its own store only
        if tuple(sizes) != ("smoke",):
            raise ConfigError(f"{config.name}: data.synthetic is not set; bench train scales only a synthetic "
                              f"workload (--sizes smoke runs its own store)")
        return {"smoke": (Path(config.data.path), {})}
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
    if not synthetic:
        raise ConfigError(f"{path}: no store there (hybrid fetch or hybrid preprocess makes it)")
    say(f"synthesizing {path} ({synthetic})")
    synthesize(path, **synthetic)


def case_settings(case: Case) -> list[str]:
    """The overrides a case adds to the run's: its mode's (none for the floor) and its batch size."""
    settings = case.mode.split("+")[1:] if is_floor(case.mode) else case_overrides(case.mode)
    return [*settings, *([f"train.batch_per_worker={case.batch}"] if case.batch else [])]


def run_case(config_path: str, case: Case, iterations: int, overrides: list[str]) -> dict:
    """One ``hybrid train`` under mpirun (the floor: one ``hybrid bench plain``) from the case's checkout; its
    summary (the floor's: the fields the table reads)."""
    config_path = str(Path(config_path).resolve())  # the other checkout runs in its own directory
    settings = [*overrides, f"data.path={case.store.resolve()}", *case_settings(case)]
    config = load_config(config_path, settings)
    if is_floor(case.mode):
        return _run_plain(config_path, case, iterations, settings, config)
    ranks = config.cluster.workers + config.cluster.ps
    with tempfile.TemporaryDirectory(prefix="hybrid-bench-") as tmp:
        summary_path = Path(tmp) / "summary.json"
        command = ["bash", str(case.tree / "launch" / "mpirun.sh"), "-n", str(ranks), sys.executable, "-m", "hybrid",
                   "train", config_path, *settings, f"train.iterations={iterations}",
                   f"train.checkpoint_dir={Path(tmp) / 'checkpoints'}", "--no-progress",
                   "--summary-json", str(summary_path)]
        result = subprocess.run(command, capture_output=True, text=True, cwd=case.tree)
        if result.returncode != 0 or not summary_path.is_file():
            tail = "\n".join((result.stdout.splitlines() + result.stderr.splitlines())[-30:])
            raise RuntimeError(f"training failed with exit {result.returncode}, summary "
                               f"{'written' if summary_path.is_file() else 'missing'} ({' '.join(command)}):\n{tail}")
        summary = json.loads(summary_path.read_text())
    summary.setdefault("batch_per_worker", config.train.batch_per_worker)
    return summary


def _run_plain(config_path: str, case: Case, iterations: int, settings: list[str], config: Config) -> dict:
    """The floor: ``hybrid bench plain`` in a process of its own (one thread), as a summary of one stage. It
    trains the case's global batch (``cluster.workers`` x ``train.batch_per_worker``) in one process."""
    command = [sys.executable, "-m", "hybrid", "bench", "plain", config_path, *settings, "--threads", "1",
               "--iterations", str(iterations), "--json"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=case.tree)
    if result.returncode != 0:
        tail = "\n".join((result.stdout.splitlines() + result.stderr.splitlines())[-30:])
        raise RuntimeError(f"bench plain failed with exit {result.returncode} ({' '.join(command)}):\n{tail}")
    floor = json.loads(result.stdout.strip().splitlines()[-1])[0]
    from hybrid.data.store import BatchStore

    table_rows = int(BatchStore(config.data.path, split="train").cardinalities.sum())
    return {"throughput": floor["samples_per_s"], "iteration_ms": {"compute": floor["ms_per_iteration"]},
            "table_rows": table_rows, "batch_per_worker": config.train.batch_per_worker}


def run(*, config_path: str, sizes=("smoke", "full"), modes=("vanilla", "herald"), iterations: int = 200,
        repeats: int = 3, full_rows: int = 2_000_000, overrides=(), batches=(None,),
        beside: Optional[Path] = None, progress=print) -> dict:
    config = load_config(config_path, list(overrides))
    for mode in modes:
        if not is_floor(mode):
            case_overrides(mode)  # a malformed case fails here, not after the first runs
    if beside is not None and not (Path(beside) / "hybrid" / "__init__.py").is_file():
        raise ConfigError(f"--beside {beside}: not a checkout of this project (no hybrid/__init__.py)")
    stores = store_specs(config, sizes, full_rows)
    for path, synthetic in stores.values():
        ensure_store(path, synthetic, progress)
    trees = [(ROOT, "")] + ([(Path(beside).resolve(), "@beside")] if beside is not None else [])
    cases = [Case(size, mode, stores[size][0], batch, tree, label)
             for size in sizes for batch in batches for mode in modes for tree, label in trees]
    for repeat in range(repeats):
        order = cases if repeat % 2 == 0 else cases[::-1]  # alternate, so drift hits every case alike
        for case in order:
            if case.error is not None:
                continue
            try:
                summary = run_case(config_path, case, iterations, list(overrides))
            except RuntimeError as err:  # the other cases go on: one bad setting loses no other measurement
                case.error = failure_line(str(err))
                progress(f"repeat {repeat + 1}/{repeats} {case.size:<6} b{case.batch or '':<5} {case.name:<24} "
                         f"failed: {case.error}")
                continue
            case.summaries.append(summary)
            progress(f"repeat {repeat + 1}/{repeats} {case.size:<6} b{summary['batch_per_worker']:<5} {case.name:<24} "
                     f"{summary['throughput']:>9.0f} samples/s")
    rows = [case.to_dict() for case in cases if case.error is None]
    failed = [{"size": case.size, "case": case.name, "batch_per_worker": case.batch, "error": case.error}
              for case in cases if case.error is not None]
    return {"config": config.name, "iterations": iterations, "repeats": repeats,
            "ranks": config.cluster.workers + config.cluster.ps, "beside": str(beside) if beside else None,
            "cases": rows, "failed": failed, "ratios": ratios(rows, sizes, modes), "fits": fits(rows)}


def failure_line(message: str) -> str:
    """The line of a failed run's output that says why (its error line, else its last line)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    said = [line for line in lines if "error" in line.lower() and not line.startswith(("training failed", "bench"))]
    return (said or lines or ["no output"])[-1 if not said else 0]


def ratios(rows: list[dict], sizes, modes) -> dict:
    """Throughput of each size over the first size's, of each mode over the first mode's, and of each case
    over its twin in the other checkout (``@beside``), per batch size where there are several.

    Each is the median over repeats of the ratio within one repeat: the two
    runs of a pair ran minutes apart at most, so slow drift of a shared
    machine cancels out.
    """
    runs = {(r["size"], r["mode"], r["batch_per_worker"], r["case"][len(r["mode"]):]): r["samples_per_s_runs"]
            for r in rows}
    batches = sorted({key[2] for key in runs})
    labels = sorted({key[3] for key in runs})

    def paired(a, b) -> Optional[float]:
        if a not in runs or b not in runs:
            return None
        return round(statistics.median(x / y for x, y in zip(runs[a], runs[b])), 3)

    def suffix(batch, label="") -> str:
        return label + (f" b{batch}" if len(batches) > 1 else "")

    out = {}
    for batch in batches:
        for label in labels:
            for size in sizes[1:]:
                for mode in modes:
                    out[f"{size}/{sizes[0]} {mode}{suffix(batch, label)}"] = \
                        paired((size, mode, batch, label), (sizes[0], mode, batch, label))
            for size in sizes:
                for mode in modes[1:]:
                    out[f"{mode}{label}/{modes[0]}{label} {size}{suffix(batch)}"] = \
                        paired((size, mode, batch, label), (size, modes[0], batch, label))
        for label in labels[1:]:
            for size in sizes:
                for mode in modes:
                    out[f"{mode}/{mode}{label} {size}{suffix(batch)}"] = \
                        paired((size, mode, batch, ""), (size, mode, batch, label))
    return {name: ratio for name, ratio in out.items() if ratio is not None}


def fits(rows: list[dict]) -> dict:
    """Per case over its batch sizes: each stage's ms per iteration as ``fixed + per_unit * x``.

    ``x`` is the rows a worker moves per iteration for pull and push, the
    samples a worker trains per iteration for the other stages. ``fixed`` (ms)
    is what an iteration costs however small its batch: the calls, not the
    data. Least squares; only cases run at two batch sizes or more.
    """
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["size"], r["case"]), []).append(r)
    out = {}
    for (size, case), group in groups.items():
        if len({r["batch_per_worker"] for r in group}) < 2:
            continue
        stages = {}
        for stage in (*STAGES, "outside_compute"):
            per_row = stage in ("pull", "push")
            x = np.array([r["rows_per_iteration"] if per_row else r["batch_per_worker"] for r in group], dtype=float)
            y = np.array([r["outside_compute_ms"] if stage == "outside_compute" else r["iteration_ms"][stage]
                          for r in group])
            if np.ptp(x) == 0:
                continue
            slope, fixed = np.polyfit(x, y, 1)
            stages[stage] = {"fixed_ms": round(float(fixed), 3), "per_unit_us": round(1000 * float(slope), 3),
                             "unit": "row" if per_row else "sample"}
        out[f"{case} {size}"] = stages
    return out


def format_table(result: dict) -> str:
    width = max([9, *(len(r["case"]) + 1 for r in [*result["cases"], *result.get("failed", [])])])
    head = (f"{'size':<6}{'case':<{width}}{'batch':>6}{'rows':>10}{'samples/s':>10}{'moved':>9}"
            + "".join(f"{s[:8]:>9}" for s in STAGES) + f"{'outside':>9}{'PS up s':>8}{'PS/shard':>9}{'wk MB':>7}")
    lines = [f"{result['config']}: {result['iterations']} iterations, median of {result['repeats']}; "
             f"ms per iteration by stage ('outside': all but compute)", head]
    for r in result["cases"]:
        floor = "workers" not in r
        lines.append(f"{r['size']:<6}{r['case']:<{width}}{r['batch_per_worker']:>6}{r['table_rows']:>10}"
                     f"{r['samples_per_s']:>10.0f}{r['rows_moved']:>9}"
                     + "".join(f"{r['iteration_ms'][s]:>9.2f}" for s in STAGES) + f"{r['outside_compute_ms']:>9.2f}"
                     + ("" if floor else f"{r['ps_startup_s']:>8.1f}{r['ps_peak_over_shard']:>9.2f}"
                                         f"{r['worker_peak_rss_mb']:>7.0f}"))
    for failed in result.get("failed", []):
        lines.append(f"{failed['size']:<6}{failed['case']:<{width}}{failed['batch_per_worker'] or '':>6}  failed: "
                     f"{failed['error']}")
    lines.append("ratios (median of per-repeat ratios): "
                 + ", ".join(f"{k} {v:.2f}" for k, v in result["ratios"].items()))
    for case, stages in result.get("fits", {}).items():
        lines.append(f"fit {case}: " + ", ".join(f"{stage} {f['fixed_ms']:.3f} ms + {f['per_unit_us']:.2f} us/"
                                                  f"{f['unit']}" for stage, f in stages.items()))
    return "\n".join(lines)
