"""``launch/gpu_check.sh``: every GPU figure the project needs, from one command on a bare GPU host.

A GPU host is lent for minutes, with no network, one command at a time
(docs/gpu.md). So the check is one prepared run of stages, in order, each
with a time budget; a stage that fails or runs out of time costs only
itself, and what it learnt is on disk the moment it ends:

1. ``setup``: ``launch/setup.sh`` offline with the host's own PyTorch
   (``HYBRID_TORCH=system HYBRID_OFFLINE=1``) from the carried wheel
   directory, without Horovod; Horovod's wheel builds in the background
   (``setup.sh --horovod-wheel``) while the stages that sum with MPI run;
   MovieLens-100k from the carried RecBole wheel.
2. ``train``: GPU training on MovieLens-100k, 3 workers + 1 PS, vanilla and
   herald: device, allreduce, samples/s, transmissions, AUC.
3. ``exactness``: the multi-rank CUDA tests (``pytest -m cuda``: float64
   against the single-process reference, measured == simulated counts, FAE).
4. ``e2e``: ``hybrid bench e2e`` across emulated hosts with GPU workers at
   the Herald paper's testbed setting (dim 512, batch 256 per worker), five
   modes, at 1 and 10 Gbit/s and unshaped; on one host where namespaces
   cannot be made.
5. ``horovod``: Horovod's wheel installed; NCCL with one worker, the
   host-staged sum with three on one GPU.
6. ``cores``: what 16 cores show that 2 cannot: 3 + 1 against one plain
   PyTorch process, the scheduler, preprocessing and launch benchmarks.

The stages end by fixed marks (:func:`marks`): a stage may use what earlier
stages left over, never time of a later one, and the whole check ends by
the last mark. Output (``--out``, at most 8 files, as a GPU host returns):
``summary.json`` and ``summary.txt``, rewritten after every stage, and one
``<stage>.log`` per stage. ``--rehearse`` runs the same stages here, on the
CPU with a stand-in ``nvidia-smi`` and tiny sizes, so that the script
reaches a GPU host working; ``--plan`` prints the stages and their budgets.

Standard library only (and ``hybrid.bench``'s own, which is too): it starts
with the host's ``python3``, before set-up.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from hybrid.bench import case_overrides  # standard library only, as this module

ROOT = Path(__file__).resolve().parents[2]
MODES = ("vanilla", "herald", "herald+scheduler.scoring=cost+scheduler.order=confident", "het", "fae")
LINKS = ("1gbit", "10gbit", "none")
LIMIT_S = 540  # 9 minutes: a GPU host runs one command for at most 10
REHEARSAL_RUN = ("cluster.workers=1", "train.iterations=20")  # a rehearsal's training runs: the fewest ranks


class OutOfTime(Exception):
    """A stage reached its mark; the command it ran was stopped."""


class StageFailed(Exception):
    """A stage's check did not hold (its message says which and why)."""


@dataclass
class Context:
    """What every stage needs: the directories, the venv, the environment, the clock."""

    out: Path
    work: Path
    venv: Path
    wheels: Path
    rehearse: bool
    start: float = field(default_factory=time.monotonic)
    env: dict = field(default_factory=dict)
    deadline: float = 0.0  # the running stage's mark (time.monotonic)
    log: Optional[object] = None  # the running stage's log file
    horovod_build: Optional[subprocess.Popen] = None
    horovod_build_started: float = 0.0  # seconds from the start of the check
    horovod_build_ended: Optional[float] = None
    horovod_build_paused: float = 0.0  # seconds it spent stopped while a quiet stage measured
    facts: dict = field(default_factory=dict)

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    @property
    def device(self) -> str:
        return "cpu" if self.rehearse else "cuda"

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def say(self, line: str) -> None:
        """A line in the stage's log and on stderr."""
        stamped = f"[gpu-check {self.elapsed():6.1f} s] {line}"
        print(stamped, file=sys.stderr, flush=True)
        if self.log is not None:
            self.log.write(stamped + "\n")
            self.log.flush()

    def run(self, argv: list[str], *, env: Optional[dict] = None, check: bool = True,
            timeout: Optional[float] = None) -> str:
        """Run ``argv`` from the repository root, its output into the stage's log; returns its stdout.

        It runs in a session of its own, stopped with everything it started
        (mpirun's ranks, emulated hosts) when the stage reaches its mark:
        SIGTERM first, so that benchmarks clean up, then SIGKILL. A failure
        is raised with the last lines the command wrote to stderr.
        """
        limit = self.left() if timeout is None else min(timeout, self.left())
        if limit <= 1:
            raise OutOfTime(f"no time left to run {' '.join(argv[:4])}")
        self.say("$ " + " ".join(argv))
        stem = self.work / f"command-{time.monotonic_ns()}"
        with open(f"{stem}.out", "w") as stdout, open(f"{stem}.err", "w") as stderr:
            process = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **self.env, **(env or {})},
                                       stdout=stdout, stderr=stderr, start_new_session=True)
            try:
                process.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                stop_session(process)
                self._keep(stem)
                raise OutOfTime(f"stopped after {limit:.0f} s: {' '.join(argv[:6])}") from None
            except BaseException:
                stop_session(process)
                self._keep(stem)
                raise
        out, err = self._keep(stem)
        if check and process.returncode != 0:
            tail = "\n".join((err.strip() or out.strip()).splitlines()[-8:])
            raise StageFailed(f"exit {process.returncode}: {' '.join(argv[:8])}" + (f"\n{tail}" if tail else ""))
        return out

    def _keep(self, stem: Path) -> tuple[str, str]:
        """The command's stdout and stderr, copied into the stage's log and removed."""
        texts = []
        for suffix in (".out", ".err"):
            path = Path(f"{stem}{suffix}")
            text = path.read_text(errors="replace")
            path.unlink()
            if self.log is not None and text:
                self.log.write(text if text.endswith("\n") else text + "\n")
                self.log.flush()
            texts.append(text)
        return texts[0], texts[1]


def stop_session(process: subprocess.Popen) -> None:
    """SIGTERM to the process's session, then SIGKILL to what is left."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
            os.killpg(process.pid, signal.SIGCONT)  # a paused build must run to see the SIGTERM
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


# ------------------------------------------------------------------ helpers
def train(ctx: Context, name: str, *overrides: str) -> dict:
    """``launch/train.sh`` with ``overrides`` (the config first); the run's summary (``--summary-json``)."""
    summary_path = ctx.work / f"{name}.json"
    summary_path.unlink(missing_ok=True)
    ctx.run(["bash", "launch/train.sh", *overrides, "--no-progress", "--summary-json", str(summary_path)])
    return json.loads(summary_path.read_text())


def summary_line(label: str, summary: dict) -> str:
    """One run: where it computed, how it summed, and the figures the issue asks for."""
    compute = summary.get("compute") or {}
    evaluation = summary.get("evaluation") or {}
    auc = f"{evaluation['auc']:.4f}" if evaluation.get("auc") is not None else "-"
    workers = f"{summary['workers']} worker{'s' if summary['workers'] != 1 else ''}"
    return (f"{label}: {workers} + {summary['ps']} PS on {compute.get('device', '?')}; "
            f"{summary['throughput']:.0f} samples/s; transmissions {summary['transmissions']['rows']} rows; "
            f"AUC {auc}; allreduce: {compute.get('allreduce', '?')}")


def last_json(stdout: str):
    """The JSON a ``--json`` command printed last on stdout."""
    lines = [line for line in stdout.splitlines() if line.startswith(("{", "["))]
    if not lines:
        raise StageFailed("the command printed no JSON result")
    return json.loads(lines[-1])


def pytest_counts(output: str) -> dict:
    """passed/failed/skipped/errors from pytest's last summary line (every rank prints the same)."""
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0, "deselected": 0}
    lines = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed|skipped|error|deselected)", line)]
    if not lines:
        raise StageFailed("pytest printed no result line")
    for number, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", lines[-1]):
        counts["errors" if word.startswith("error") else word] = int(number)
    return counts


# ------------------------------------------------------------------ stages
def stage_setup(ctx: Context, result: dict) -> list[str]:
    """Set-up offline with the host's PyTorch, Horovod's build started apart, the real data in place."""
    result["host"] = ctx.facts
    began = time.monotonic()
    ctx.run(["bash", "launch/setup.sh"], env={"HYBRID_SKIP_HOROVOD": "1"})
    result["setup_s"] = round(time.monotonic() - began, 1)
    start_horovod_build(ctx)
    ctx.run([ctx.python, "-m", "hybrid", "fetch", "movielens-100k", "--out", "data/ml-100k"])
    probe = ("import json, torch; print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, "
             "'gpus': [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}))")
    result["torch"] = last_json(ctx.run([ctx.python, "-c", probe]))
    if not ctx.rehearse and not result["torch"]["gpus"]:
        raise StageFailed(f"torch {result['torch']['torch']} sees no GPU")
    gpus = ", ".join(result["torch"]["gpus"]) or "no GPU (rehearsal)"
    return [f"ready in {result['setup_s']} s without Horovod: torch {result['torch']['torch']} "
            f"(CUDA {result['torch']['cuda']}), {gpus}; {ctx.facts['gpu']}",
            f"Horovod's wheel building in the background since {ctx.horovod_build_started:.0f} s"]


def base_env(ctx: Context, path: str) -> dict:
    """The environment of every command: the venv first on PATH, set-up offline with the host's PyTorch."""
    env = {"PATH": f"{ctx.venv / 'bin'}:{path}", "VIRTUAL_ENV": str(ctx.venv), "HYBRID_VENV": str(ctx.venv),
           "HYBRID_TORCH": "system", "HYBRID_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    if ctx.rehearse:
        env["HYBRID_GPU"] = "0"  # the stand-in nvidia-smi lists a GPU; this venv's torch is a CPU build
    else:
        env["HYBRID_WHEEL_DIR"] = str(ctx.wheels)
        env["HYBRID_CACHE_DIR"] = str(ctx.wheels)  # hybrid fetch finds RecBole's wheel there
    return env


def host_facts(ctx: Context) -> dict:
    """What the host is: its GPU as nvidia-smi sees it, cores, kernel, MPI, and whether it can emulate hosts."""
    def first_line(argv: list[str]) -> str:
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30, env={**os.environ, **ctx.env})
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"({argv[0]}: {err})"
        return (out.stdout.strip() or out.stderr.strip()).splitlines()[0] if (out.stdout or out.stderr) else ""

    tools = {tool: shutil.which(tool, path=ctx.env.get("PATH")) for tool in ("ip", "tc", "mpirun", "nvcc", "sbatch")}
    return {"gpu": first_line(["nvidia-smi", "--query-gpu=name,memory.total,compute_cap,driver_version",
                               "--format=csv,noheader"]),
            "cores": len(os.sched_getaffinity(0)), "kernel": platform.release(), "python": platform.python_version(),
            "mpi": first_line(["mpirun", "--version"]), "tools": tools, "euid": os.geteuid()}


def start_horovod_build(ctx: Context) -> None:
    """``setup.sh --horovod-wheel`` in the background, niced, its output into horovod.log."""
    log = open(ctx.out / "horovod.log", "a")
    log.write(f"[gpu-check {ctx.elapsed():6.1f} s] $ bash launch/setup.sh --horovod-wheel (background)\n")
    log.flush()
    ctx.horovod_build = subprocess.Popen(["nice", "-n", "10", "bash", "launch/setup.sh", "--horovod-wheel"], cwd=ROOT,
                                         env={**os.environ, **ctx.env}, stdout=log, stderr=log,
                                         start_new_session=True)
    ctx.horovod_build_started = ctx.elapsed()

    def note_the_end() -> None:
        ctx.horovod_build.wait()
        ctx.horovod_build_ended = ctx.elapsed()

    threading.Thread(target=note_the_end, daemon=True).start()


def stage_train(ctx: Context, result: dict) -> list[str]:
    """MovieLens-100k, 3 workers + 1 PS, on the GPU, vanilla then herald."""
    lines = []
    extra = REHEARSAL_RUN if ctx.rehearse else []
    for mode in ("herald",) if ctx.rehearse else ("vanilla", "herald"):
        summary = train(ctx, f"train-{mode}", "configs/ml100k.yaml", f"scheduler.mode={mode}",
                        f"train.device={ctx.device}", "train.allreduce=mpi", *extra)
        result[mode] = summary
        lines.append(summary_line(f"ml100k {mode}", summary))
    return lines + [f"ended {ctx.elapsed():.0f} s after the start"]


def stage_exactness(ctx: Context, result: dict) -> list[str]:
    """The CUDA cases of the multi-rank suite; in a rehearsal, those (skipped) and one CPU case."""
    ranks = "3" if ctx.rehearse else "4"
    base = ["bash", "launch/mpirun.sh", "-n", ranks, "python", "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "--color=no", "--with-mpi"]
    # A rehearsal has no GPU: the CUDA cases of one test (they skip) and one CPU case that runs.
    selection = ["tests/mpi/test_exactness.py::test_gpu_workers_equal_the_single_process_reference",
                 "tests/mpi/test_exactness.py::test_the_host_staged_allreduce_equals_the_reference[mpi-vanilla]"] \
        if ctx.rehearse else ["-m", "cuda", "tests/mpi"]
    result["selection"] = selection
    result["counts"] = counts = pytest_counts(ctx.run([*base, *selection], check=False))
    line = (f"pytest {' '.join(selection)} on {ranks} ranks: {counts['passed']} passed, {counts['failed']} failed, "
            f"{counts['errors']} errors, {counts['skipped']} skipped")
    if counts["failed"] or counts["errors"] or not counts["passed"]:
        raise StageFailed(line)
    if not ctx.rehearse and counts["skipped"]:
        raise StageFailed(line + ": the CUDA cases must run, not skip, on a GPU host")
    return [line]


def e2e_overrides(ctx: Context) -> list[str]:
    """The Herald paper's testbed setting with as many GPU workers as 16 cores hold; tiny in a rehearsal."""
    if ctx.rehearse:
        return ["cluster.workers=1", "cluster.ps=1", "train.batch_per_worker=64", "train.iterations=12",
                "train.device=cpu", "train.allreduce=mpi"]
    return ["cluster.workers=8", "cluster.ps=1", "train.batch_per_worker=256", "train.device=cuda",
            "train.allreduce=mpi"]


def stage_e2e(ctx: Context, result: dict) -> list[str]:
    """``hybrid bench e2e`` per link setting, 1 Gbit/s first; on one host if emulated hosts fail."""
    modes = MODES[:2] if ctx.rehearse else MODES
    links = LINKS[:1] if ctx.rehearse else LINKS
    overrides = e2e_overrides(ctx)
    result["overrides"] = overrides
    lines = []
    for link in links:
        try:
            stdout = ctx.run([ctx.python, "-m", "hybrid", "bench", "e2e", "--workloads", "movielens-100k",
                              "--modes", ",".join(modes), "--bandwidth", link, "--repeats", "1", "--json",
                              "--out", str(ctx.work / "e2e"), *overrides])
        except StageFailed as err:
            if result.get("links"):
                raise
            result["emulation_failed"] = str(err)
            ctx.say(f"emulated hosts failed ({err}); the same runs on one host instead")
            why = str(err).splitlines()[-1]  # the command's last word on stderr
            return [f"emulated hosts failed: {why}", *one_host(ctx, result, modes, overrides)]
        report = last_json(stdout)["movielens-100k"]
        result.setdefault("links", {})[link] = report
        lines.append(e2e_line(link, report))
    return lines


def e2e_line(link: str, report: dict) -> str:
    """Samples/s of each mode and Herald's ratios to vanilla and to HET s=0."""
    rate = {mode: r["samples_per_s"] for mode, r in report.items()}
    parts = [f"{mode} {value:.0f}" for mode, value in rate.items()]
    ratios = [f"{mode}/vanilla {rate[mode] / rate['vanilla']:.2f}x" for mode in rate if mode != "vanilla"]
    if "het" in rate:
        ratios.append(f"herald/het {rate['herald'] / rate['het']:.2f}x")
    return f"links {link}: samples/s " + ", ".join(parts) + "; " + ", ".join(ratios)


def one_host(ctx: Context, result: dict, modes, overrides: list[str]) -> list[str]:
    """The e2e cases trained on this host alone (no links to shape): still GPU workers at dim 512."""
    runs = {}
    for mode in modes:
        summary = train(ctx, f"one-host-{len(runs)}", "configs/ml100k.yaml", "model.embedding_dim=512",
                        *case_overrides(mode), *overrides)
        runs[mode] = {"samples_per_s": summary["throughput"], "iteration_ms": summary["iteration_ms"],
                      "auc": (summary["evaluation"] or {}).get("auc"),
                      "rows_per_iteration": round(summary["transmissions"]["rows"] / max(1, summary["iterations"]), 1)}
        result["one_host"] = runs
    return [e2e_line("none (one host, no emulated links)", runs)]


def stage_horovod(ctx: Context, result: dict) -> list[str]:
    """Wait for Horovod's wheel, install it, and train with it: NCCL on one worker, host-staged on three."""
    if ctx.horovod_build is None:  # the setup stage did not run (--stages) or failed first
        start_horovod_build(ctx)
    build = ctx.horovod_build
    try:
        build.wait(timeout=max(1.0, ctx.left() - (45 if not ctx.rehearse else 30)))  # 45 s: install, 2 runs
    except subprocess.TimeoutExpired:
        raise OutOfTime(f"Horovod's wheel was still building {ctx.elapsed() - ctx.horovod_build_started:.0f} s "
                        f"after it started (horovod.log)") from None
    while ctx.horovod_build_ended is None:  # the watcher notes the moment the build ended
        time.sleep(0.05)
    result["build_s"] = round(ctx.horovod_build_ended - ctx.horovod_build_started, 1)
    result["build_paused_s"] = round(ctx.horovod_build_paused, 1)
    if build.returncode != 0:
        raise StageFailed(f"Horovod's build failed (exit {build.returncode}); horovod.log has its last lines")
    ctx.run(["bash", "launch/setup.sh"])  # installs the cached wheel
    size = REHEARSAL_RUN if ctx.rehearse else ("train.iterations=100",)
    lines = [f"Horovod's wheel: {result['build_s']} s from {ctx.horovod_build_started:.0f} s after the start, "
             f"{result['build_paused_s']} s of it paused"]
    result["one_worker"] = one = train(ctx, "horovod-1", "configs/ml100k.yaml", f"train.device={ctx.device}",
                                       "train.allreduce=horovod", *size, "cluster.workers=1")
    lines.append(summary_line("ml100k herald, train.allreduce=horovod", one))
    if not ctx.rehearse:  # the same code as the run above: a rehearsal leaves it out
        result["three_workers"] = three = train(ctx, "horovod-3", "configs/ml100k.yaml", "train.device=cuda",
                                                "train.allreduce=auto", *size)
        lines.append(summary_line("ml100k herald, train.allreduce=auto", three))
    return lines


def stage_cores(ctx: Context, result: dict) -> list[str]:
    """Training on the CPU through every launch path, against plain PyTorch; the scheduler and preprocessing."""
    cores = ctx.facts.get("cores") or len(os.sched_getaffinity(0))
    bench = [ctx.python, "-m", "hybrid", "bench"]
    out = ["--out", str(ctx.work / "bench")]
    paths = ["train.sh"] if ctx.rehearse else ["train.sh", "mpirun -H localhost:N"]
    if not ctx.rehearse and shutil.which("horovodrun", path=ctx.env.get("PATH")):
        paths.append("train.sh --horovodrun")
    if not ctx.rehearse and (shutil.which("sbatch", path=ctx.env.get("PATH"))
                             or shutil.which("slurmctld", path=ctx.env.get("PATH"))):
        paths += ["single-node.sbatch", "train.sbatch"]
    result["launch"] = launch = last_json(ctx.run([*bench, "launch", "configs/ml100k.yaml", "--paths", ",".join(paths),
                                                   "--repeats", "1", "--json", "train.device=cpu",
                                                   *(REHEARSAL_RUN if ctx.rehearse else [])]))
    lines = [f"launch paths, ml100k herald on the CPU, {launch['ranks']} ranks, samples/s: "
             + ", ".join(f"{r['path']} {r['samples_per_s']:.0f}" for r in launch["paths"])
             + "".join(f"; not run: {name} ({why})" for name, why in launch["skipped"].items())]
    result["plain"] = plain = last_json(ctx.run([*bench, "plain", "configs/ml100k.yaml", "--threads", f"1,{cores}",
                                                 "--json", *(["--iterations", "20", *REHEARSAL_RUN]
                                                             if ctx.rehearse else [])]))
    run = launch["paths"][0]["samples_per_s"]  # train.sh, the path users take
    lines.append(f"the same in one plain PyTorch process: {plain[0]['samples_per_s']:.0f} samples/s on 1 thread, "
                 f"{plain[-1]['samples_per_s']:.0f} on {plain[-1]['threads']}; train.sh at "
                 f"{run / plain[0]['samples_per_s']:.2f}x of one plain thread")
    if ctx.rehearse:
        scheduler = ["--workers", "8", "--threads", "1,2", "--laia", "chunked", "--iterations", "3"]
        preprocess = ["--lines", "20000", "--processes", "1,2"]
    else:
        scheduler = ["--workers", "8,128", "--threads", f"1,4,{cores}", "--laia", "chunked,cost,blocks",
                     "--iterations", "10"]
        preprocess = ["--lines", "1000000", "--processes", f"1,4,{cores}"]
    document = last_json(ctx.run([*bench, "scheduler", *scheduler, "--repeats", "1", "--json", *out]))
    result["scheduler"] = document
    lines.append("scheduler ms per global batch (workers/threads/laia): " + ", ".join(
        f"{r['workers']}/{r['threads']}/{r['laia']} {r['total_ms']:.2f}" for r in document["result"]["rows"]))
    document = last_json(ctx.run([*bench, "preprocess", *preprocess, "--repeats", "1", "--json", *out,
                                  "--data-dir", str(ctx.work / "criteo")]))
    result["preprocess"] = found = document["result"]
    lines.append(f"preprocess lines/s ({found['rows'][0]['lines']} lines) by processes: " + ", ".join(
        f"{r['processes'] or 'pyarrow floor'}: {r['lines_per_s']:.0f}" for r in found["rows"])
        + f"; Criteo 1TB in {found['criteo_1tb_hours']} h ({found['criteo_1tb_from']})")
    return lines


@dataclass(frozen=True)
class Stage:
    name: str
    budget_s: int
    what: str
    run: Callable[[Context, dict], list[str]]
    quiet: bool = False  # Horovod's background build is paused while it runs: its figures are timings


STAGES = (
    Stage("setup", 100, "set-up offline with the host's PyTorch, no Horovod (its wheel builds in the background); "
                       "MovieLens-100k from the carried RecBole wheel", stage_setup),
    Stage("train", 60, "GPU training, MovieLens-100k, 3 workers + 1 PS, vanilla and herald (MPI allreduce)",
          stage_train),
    Stage("exactness", 75, "pytest -m cuda on 4 ranks: float64 against the reference, measured == simulated, FAE, "
                           "a bf16 wire against its rounding reference",
          stage_exactness),
    Stage("e2e", 150, "hybrid bench e2e, MovieLens-100k dim 512, 8 GPU workers x batch 256 + 1 PS, 5 modes, "
                      "at 1gbit, 10gbit, unshaped (one host if namespaces fail); Horovod's build paused",
          stage_e2e, quiet=True),
    Stage("horovod", 75, "Horovod's wheel installed; ml100k with train.allreduce=horovod (1 worker: NCCL) and "
                         "auto (3 workers on 1 GPU: host-staged)", stage_horovod),
    Stage("cores", 75, "CPU 3 + 1 by every launch path against plain PyTorch; bench scheduler (8,128 workers "
                       "x 1,4,16 threads), preprocess (1,4,16 processes)", stage_cores),
)


def marks(stages=STAGES) -> list[int]:
    """Seconds from the start by which each stage must end: the running sum of the budgets."""
    total, out = 0, []
    for stage in stages:
        total += stage.budget_s
        out.append(total)
    return out


def plan_text(stages=STAGES) -> str:
    rows = [f"GPU check: {len(stages)} stages, {sum(s.budget_s for s in stages)} s in all (limit {LIMIT_S} s); "
            f"each stage ends by its mark, using what earlier stages left over",
            f"{'stage':<10}{'budget':>8}{'ends by':>9}  what"]
    for stage, mark in zip(stages, marks(stages)):
        rows.append(f"{stage.name:<10}{stage.budget_s:>6} s{mark:>7} s  {stage.what}")
    return "\n".join(rows)


# ------------------------------------------------------------------ the run
def run_stages(ctx: Context, stages=STAGES) -> list[dict]:
    """Every stage in order, each ended by its mark; the summary rewritten after each one."""
    records = [{"name": s.name, "budget_s": s.budget_s, "status": "not run"} for s in stages]
    for stage, mark, record in zip(stages, marks(stages), records):
        ctx.deadline = ctx.start + mark
        result: dict = {}
        began = time.monotonic()
        with open(ctx.out / f"{stage.name}.log", "a") as log:
            ctx.log = log
            ctx.say(f"stage {stage.name}: {stage.what} (ends by {mark} s)")
            paused = stage.quiet and pause_build(ctx, signal.SIGSTOP)
            try:
                record["headline"] = stage.run(ctx, result)
                record["status"] = "ran"
            except OutOfTime as err:
                record["status"], record["error"] = "out of time", str(err)
            except StageFailed as err:
                record["status"], record["error"] = "failed", str(err)
            except Exception as err:  # a bug or a surprise of the host: this stage's, not the check's
                record["status"], record["error"] = "failed", f"{type(err).__name__}: {err}"
            finally:
                if paused:
                    pause_build(ctx, signal.SIGCONT)
                    ctx.horovod_build_paused += time.monotonic() - began
            record["seconds"] = round(time.monotonic() - began, 1)
            record["ended_at_s"] = round(ctx.elapsed(), 1)
            record["result"] = result
            ctx.say(f"stage {stage.name}: {record['status']} in {record['seconds']} s"
                    + (f": {record['error']}" if "error" in record else ""))
            ctx.log = None
        write_summary(ctx, records)
    if ctx.horovod_build is not None and ctx.horovod_build.poll() is None:
        stop_session(ctx.horovod_build)
    return records


def pause_build(ctx: Context, sig: int) -> bool:
    """SIGSTOP or SIGCONT to Horovod's background build (its whole session); whether it was running."""
    build = ctx.horovod_build
    if build is None or build.poll() is not None:
        return False
    try:
        os.killpg(build.pid, sig)
    except ProcessLookupError:
        return False
    ctx.say(f"Horovod's build {'paused' if sig == signal.SIGSTOP else 'resumed'}")
    return True


def write_summary(ctx: Context, records: list[dict]) -> None:
    """summary.json and summary.txt, each replaced whole (a stopped check leaves the last complete one)."""
    document = {"rehearsal": ctx.rehearse, "limit_s": LIMIT_S, "elapsed_s": round(ctx.elapsed(), 1),
                "host": ctx.facts, "stages": records}
    for name, text in (("summary.json", json.dumps(document, indent=1, default=str)),
                       ("summary.txt", summary_text(document))):
        tmp = ctx.out / f".{name}.tmp"
        tmp.write_text(text + "\n")
        os.replace(tmp, ctx.out / name)


def summary_text(document: dict) -> str:
    host = document.get("host") or {}
    lines = [f"GPU check{' (rehearsal: CPU, stand-in nvidia-smi, tiny sizes)' if document['rehearsal'] else ''}: "
             f"{document['elapsed_s']:.0f} s of {document['limit_s']} s; GPU {host.get('gpu', '?')}; "
             f"{host.get('cores', '?')} cores"]
    for record in document["stages"]:
        took = f"{record['seconds']:.0f}/{record['budget_s']} s" if "seconds" in record else f"-/{record['budget_s']} s"
        lines.append(f"{record['name']:<10} {record['status']:<12} {took:>10}")
        lines += [f"    {line}" for line in record.get("headline", [])]
        if "error" in record:
            lines += [f"    ! {line}" for line in record["error"].splitlines()[:6]]
    return "\n".join(lines)


def stand_in_nvidia_smi(directory: Path) -> None:
    """A ``nvidia-smi`` that lists one GPU and answers a query with one field per asked column."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "nvidia-smi"
    script.write_text("#!/bin/sh\n"
                      "# The GPU check's rehearsal: one GPU that is not there.\n"
                      'case "$*" in\n'
                      '  *-L*) echo "GPU 0: Rehearsal stand-in (UUID: GPU-00000000-0000-0000-0000-rehearsal0)" ;;\n'
                      '  *--query-gpu=*) q=$(printf "%s\\n" "$@" | sed -n "s/^--query-gpu=//p");\n'
                      '     printf "%s\\n" "$q" | tr "," "\\n" | sed "s/.*/stand-in/" | paste -sd, - '
                      '| sed "s/,/, /g" ;;\n'
                      '  *) echo "stand-in nvidia-smi for the GPU check rehearsal" ;;\n'
                      "esac\n")
    script.chmod(0o755)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="launch/gpu_check.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT"), help="where the summary and logs go (default $OUT)")
    parser.add_argument("--rehearse", action="store_true",
                        help="the same stages here: CPU, a stand-in nvidia-smi, tiny sizes")
    parser.add_argument("--plan", action="store_true", help="print the stages and their budgets, run nothing")
    parser.add_argument("--work", default=None, help="scratch space (default: a new directory under /tmp)")
    parser.add_argument("--venv", default=None,
                        help="the venv to set up and use (default .venv-gpu; rehearsal: $HYBRID_VENV or .venv)")
    parser.add_argument("--wheel-dir", default=str(ROOT / ".gpu-wheels"),
                        help="the carried wheel directory (default .gpu-wheels; made by --wheels)")
    parser.add_argument("--stages", default=None, help="a subset, comma-separated (default: all, in order)")
    args = parser.parse_args(argv)
    stages = STAGES
    if args.stages:
        names = args.stages.split(",")
        unknown = [n for n in names if n not in {s.name for s in STAGES}]
        if unknown:
            parser.error(f"unknown stage(s) {', '.join(unknown)}; stages: {', '.join(s.name for s in STAGES)}")
        stages = tuple(s for s in STAGES if s.name in names)
    if args.plan:
        print(plan_text(stages))
        return 0
    if not args.out:
        parser.error("give --out DIR (or set OUT)")
    if not args.rehearse and not Path(args.wheel_dir).is_dir():
        parser.error(f"no wheel directory at {args.wheel_dir}: make it where there is network with "
                     f"'bash launch/gpu_check.sh --wheels' and carry it to this host (docs/gpu.md)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="hybrid-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.rehearse:
        venv = Path(args.venv or os.environ.get("HYBRID_VENV") or ROOT / ".venv")
    else:
        venv = Path(args.venv or ROOT / ".venv-gpu")
    ctx = Context(out=out, work=work, venv=venv.resolve(), wheels=Path(args.wheel_dir).resolve(),
                  rehearse=args.rehearse)
    path = os.environ["PATH"]
    if args.rehearse:
        stand_in_nvidia_smi(work / "stand-in")
        path = f"{work / 'stand-in'}:{path}"
    if not shutil.which("ip", path=path) and (ctx.wheels / "iproute2" / "bin").is_dir():
        path = f"{ctx.wheels / 'iproute2' / 'bin'}:{path}"  # Debian's ip and tc, carried (docs/gpu.md)
    ctx.env = base_env(ctx, path)
    ctx.facts = host_facts(ctx)
    print(plan_text(stages), file=sys.stderr)
    try:
        records = run_stages(ctx, stages)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    print((out / "summary.txt").read_text(), end="")
    return 0 if all(r["status"] == "ran" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
