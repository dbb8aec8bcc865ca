"""``hybrid bench launch CONFIG``: the same training through every launch path this machine has (docs/cluster.md).

A user picks a launcher by what their cluster offers, not by speed; each
must train at the same speed. Paths, each a separate ``hybrid train`` with
the same config and overrides:

- ``train.sh``: ``launch/train.sh`` (``launch/mpirun.sh``: mpirun with
  ``--oversubscribe``);
- ``train.sh --horovodrun``: the same through horovodrun (where installed);
- ``mpirun -H localhost:N``: the venv's MPI launcher by hand, told the host
  has a slot per rank, as a user's hostfile would say, so Open MPI sees no
  oversubscription (MPICH: ``mpiexec -hosts localhost:N``);
- ``single-node.sbatch`` and ``train.sbatch`` (srun, PMIx): the Slurm
  templates, under the Slurm that ``sbatch`` reaches or, as root, a
  local Slurm started here (``launch/slurm/local_slurm.sh``) and stopped
  after. ``hetjob.sbatch`` names example partitions and is not run.

Every path runs from the repository root (the templates need it), so
relative paths in the overrides are read from there. Paths alternate within
each repeat and the report keeps medians, so a noisy machine slows them
alike. Per path: samples/s (median), its ratio to the
fastest path (the median of the ratios within each repeat),
allreduce and barrier ms per iteration, how far apart the workers finished
starting (the clock starts after the last one: that skew is reported, not
counted as training), and what the ranks decided about waiting (the
summary's ``launch``).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from hybrid.config import load_config
from hybrid.runtime.mpi_family import of_venv

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 900
SLURM = ROOT / "launch" / "slurm" / "local_slurm.sh"


@dataclass(frozen=True)
class LaunchPath:
    name: str
    kind: str  # "direct": a command on this host; "sbatch": a template submitted with sbatch --wait

    def command(self, config: str, args: list[str], ranks: int, summary: Path, out: Path) -> list[str]:
        """The command that trains ``config`` with ``args`` (overrides and train options) on this path."""
        train = [config, *args, "--no-progress", "--summary-json", str(summary)]
        if self.name == "train.sh":
            return ["bash", "launch/train.sh", *train]
        if self.name == "train.sh --horovodrun":
            return ["bash", "launch/train.sh", "--horovodrun", *train]
        if self.name == "mpirun -H localhost:N":
            family = of_venv()
            if family.name == "openmpi":
                plain = ["--allow-run-as-root", "-n", str(ranks), "-H", f"localhost:{ranks}", "--bind-to", "none"]
            else:
                plain = ["-n", str(ranks), "-hosts", f"localhost:{ranks}"]
            return [family.mpiexec, *plain, sys.executable, "-m", "hybrid", "train", *train]
        template = f"launch/slurm/{self.name}"  # sbatch: the template writes results/JOBID-0.json itself
        return ["sbatch", "--wait", "--parsable", f"--ntasks={ranks}", "-o", str(out), template, config, *args]


PATHS = (LaunchPath("train.sh", "direct"), LaunchPath("train.sh --horovodrun", "direct"),
         LaunchPath("mpirun -H localhost:N", "direct"), LaunchPath("single-node.sbatch", "sbatch"),
         LaunchPath("train.sbatch", "sbatch"))


def available(say: Callable[[str], None], names=None) -> tuple[list[LaunchPath], dict[str, str]]:
    """The paths this machine can run (of ``names``; None: all), and why each other one is left out."""
    known = {p.name for p in PATHS}
    unknown = [n for n in names or () if n not in known]
    if unknown:
        raise ValueError(f"unknown launch path(s) {', '.join(unknown)}; choose from {', '.join(sorted(known))}")
    skipped = {} if names else {"hetjob.sbatch": "its #SBATCH lines name example partitions and GPUs: "
                                                 "edit them for a cluster"}
    paths = []
    for path in PATHS:
        if names and path.name not in names:
            continue
        if path.name.endswith("--horovodrun") and shutil.which("horovodrun") is None:
            skipped[path.name] = "horovodrun is not installed"
        elif path.kind == "sbatch" and shutil.which("sbatch") is None and os.geteuid() != 0:
            skipped[path.name] = "no sbatch here, and starting a local Slurm needs root"
        else:
            paths.append(path)
    for name, why in skipped.items():
        say(f"not run: {name}: {why}")
    return paths, skipped


class LocalSlurm:
    """The Slurm that ``sbatch`` reaches, or a local Slurm started here (root) and stopped on exit."""

    def __init__(self, say: Callable[[str], None]):
        self.say, self.started, self.conf = say, False, os.environ.get("SLURM_CONF")

    def __enter__(self) -> "LocalSlurm":
        reachable = shutil.which("sinfo") and subprocess.run(["sinfo"], capture_output=True).returncode == 0
        if not reachable:
            self.say("starting a local Slurm here (launch/slurm/local_slurm.sh)")
            started = subprocess.run(["bash", str(SLURM), "start"], capture_output=True, text=True)
            if started.returncode != 0:
                raise RuntimeError(f"sbatch reaches no Slurm and a local one did not start:\n{started.stderr[-2000:]}"
                                   f"\n(leave the Slurm paths out with --paths)")
            os.environ["SLURM_CONF"] = os.environ.get("HYBRID_SLURM_DIR", "/tmp/hybrid-slurm") + "/etc/slurm.conf"
            self.started = True
        return self

    def __exit__(self, *exc) -> None:
        if self.started:
            subprocess.run(["bash", str(SLURM), "stop"], capture_output=True)
            if self.conf is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = self.conf


def run_once(path: LaunchPath, config: str, overrides: list[str], ranks: int) -> dict:
    """One training on ``path``; its summary. Checkpoints go to a fresh directory (the templates resume)."""
    with tempfile.TemporaryDirectory(prefix="hybrid-bench-launch-") as tmp:
        summary, out = Path(tmp) / "summary.json", Path(tmp) / "slurm.out"
        args = [*overrides, f"train.checkpoint_dir={tmp}/checkpoints"]
        command = path.command(config, args, ranks, summary, out)
        # the templates source HYBRID_VENV (default .venv): this venv's, so that they run under its MPI
        result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=RUN_TIMEOUT_S,
                                env={**os.environ, "HYBRID_VENV": os.environ.get("HYBRID_VENV", sys.prefix)})
        job = result.stdout.strip().split(";")[0] if path.kind == "sbatch" else ""
        if job.isdigit():  # the template's files: the summary comes here, the rest goes
            written = [ROOT / "results" / f"{job}-0.json", ROOT / "results" / f"{job}-0.jsonl"]
            if written[0].is_file():
                shutil.move(str(written[0]), summary)
            written[1].unlink(missing_ok=True)
        if result.returncode != 0 or not summary.is_file():
            log = out.read_text() if out.is_file() else ""
            tail = "\n".join((result.stdout + result.stderr + log).splitlines()[-30:])
            raise RuntimeError(f"{path.name} failed with exit {result.returncode} ({' '.join(command)}):\n{tail}")
        return json.loads(summary.read_text())


def report(path: LaunchPath, summaries: list[dict]) -> dict:
    """Medians over the repeats of one path, and what its ranks decided."""
    last = summaries[-1]
    return {"path": path.name, "repeats": len(summaries),
            "samples_per_s": statistics.median(s["throughput"] for s in summaries),
            "samples_per_s_runs": [s["throughput"] for s in summaries],
            "allreduce_ms": round(statistics.median(s["iteration_ms"]["allreduce"] for s in summaries), 3),
            "barrier_ms": round(statistics.median(s["iteration_ms"]["barrier"] for s in summaries), 3),
            # how far apart the workers finished starting (worker 0's clock starts after the last one)
            "start_skew_s": round(statistics.median(max(r["start_wait_s"] for r in s["ranks"])
                                                    for s in summaries), 3),
            "auc": (last["evaluation"] or {}).get("auc"), "transmissions": last["transmissions"]["rows"],
            "launch": last.get("launch")}


def run(*, config: str, overrides=(), repeats: int = 3, names=None, say=print) -> dict:
    """``{"paths": [report, ...], "skipped": {name: why}}``, paths alternating within each repeat."""
    resolved = load_config(config, list(overrides))  # a bad config fails here, before any launch
    ranks = resolved.cluster.workers + resolved.cluster.ps
    shown, config = config, str(Path(config).resolve())  # every path runs from the repository root
    paths, skipped = available(say, names)
    if not paths:
        raise ValueError("no launch path to run on this machine: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    runs: dict[str, list] = {p.name: [] for p in paths}
    with LocalSlurm(say) if any(p.kind == "sbatch" for p in paths) else contextlib.nullcontext():
        for repeat in range(repeats):
            for path in (paths if repeat % 2 == 0 else paths[::-1]):
                summary = run_once(path, config, list(overrides), ranks)
                runs[path.name].append(summary)
                say(f"repeat {repeat + 1}/{repeats} {path.name:<24} {summary['throughput']:>9.0f} samples/s")
    reports = [report(p, runs[p.name]) for p in paths]
    fastest = max(reports, key=lambda r: r["samples_per_s"])
    for r in reports:  # the median of per-repeat ratios: runs of one repeat are minutes apart, so drift cancels
        r["of_fastest"] = round(statistics.median(
            a / b for a, b in zip(r["samples_per_s_runs"], fastest["samples_per_s_runs"])), 3)
    return {"config": shown, "overrides": list(overrides), "ranks": ranks, "repeats": repeats,
            "paths": reports, "skipped": skipped}


def format_table(result: dict) -> str:
    lines = [f"{'launch path':<24}{'samples/s':>10}{'of best':>8}{'allreduce':>10}{'barrier':>9}{'skew s':>7}  "
             f"how the ranks wait (ranks on host x threads vs cores: who decided)"]
    for r in result["paths"]:
        launch = r["launch"] or {}
        wait = f"{'yield' if launch.get('yields') else 'spin'} ({launch.get('decided_by', 'not reported')})"
        lines.append(f"{r['path']:<24}{r['samples_per_s']:>10.0f}{r['of_fastest']:>8.2f}{r['allreduce_ms']:>10.2f}"
                     f"{r['barrier_ms']:>9.2f}{r['start_skew_s']:>7.2f}  {wait}")
    skipped = "".join(f"\nnot run: {name}: {why}" for name, why in result["skipped"].items())
    return (f"{result['config']} {' '.join(result['overrides'])}: {result['ranks']} ranks, median of "
            f"{result['repeats']} (of best: median of per-repeat ratios); ms per iteration\n" + "\n".join(lines) + skipped)
