"""``hybrid bench preprocess``: ``hybrid preprocess`` against pyarrow's own floor, and across processes.

On Criteo-format files written for the purpose (:mod:`hybrid.data.criteo_text`,
kept in ``data_dir`` and reused), each case runs in a fresh process, the
cases alternating within a repeat:

- **floor**: ``pyarrow.csv.read_csv`` (one thread, types inferred) and
  ``dictionary_encode`` of every column: the least a converter built on
  pyarrow does;
- **ours at N processes**: the whole ``preprocess`` into a store, with its
  stage breakdown (scan, vocabulary, write, commit).

Reported per case: seconds (median), lines/s, the ratio to the floor and to
one process (medians of per-repeat ratios), the peak resident memory of the
largest process, and whether every process count wrote the same store (its
fingerprint). The Criteo 1TB estimate divides its 4,373,472,329 lines by the
best lines/s measured.
"""
from __future__ import annotations

import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hybrid.bench.result_files import finish, pyplot

NAME = "preprocess"
TITLE = "hybrid preprocess against pyarrow's floor"
CRITEO_1TB_LINES = 4_373_472_329


def repeats_note(kwargs: dict) -> str:
    return f"{kwargs.get('repeats', 1)} runs per case, alternating, each in a fresh process; seconds the median"


def process_counts() -> tuple[int, ...]:
    """1, 2, 4, ... up to this process's usable cores, and the cores themselves."""
    from hybrid.data.task_pool import usable_cores

    cores = usable_cores()
    return tuple(sorted({1 << k for k in range(cores.bit_length()) if 1 << k <= cores} | {cores}))


def input_file(data_dir: Path, lines: int, say) -> Path:
    """The Criteo-format file of ``lines`` lines, written once."""
    from hybrid.data.criteo_text import write_criteo_text

    path = data_dir / f"criteo-{lines}.tsv"
    if not path.is_file():
        data_dir.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        tmp = path.with_name(path.name + ".tmp")
        write_criteo_text(tmp, lines=lines)
        tmp.rename(path)
        say(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - started:.0f} s")
    return path


def _peak_mb() -> float:
    """The largest resident set of this process and of the worker processes it waited for, in MiB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return round(max(own, children) / 1024, 1)


def measure_floor(path: str) -> dict:
    """pyarrow's read_csv + dictionary_encode of every column, timed here (in a fresh process)."""
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    from hybrid.data.formats import CRITEO

    started = time.perf_counter()
    table = pacsv.read_csv(path, read_options=pacsv.ReadOptions(column_names=list(CRITEO.columns),
                                                                 use_threads=False),
                           parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False))
    for column in table.columns:
        pc.dictionary_encode(column)
    return {"seconds": time.perf_counter() - started, "lines": table.num_rows, "peak_mb": _peak_mb()}


def measure_ours(path: str, processes: int, out: str) -> dict:
    """The whole ``preprocess`` on ``processes`` local processes, timed here (in a fresh process)."""
    from hybrid.data.preprocess import preprocess
    from hybrid.data.task_pool import TaskPool

    facts: dict = {}
    started = time.perf_counter()
    with TaskPool(processes) as pool:
        meta = preprocess([path], out, format_name="criteo", force=True, pool=pool, facts=facts)
    seconds = time.perf_counter() - started
    shutil.rmtree(out)
    return {"seconds": seconds, "lines": meta["n_samples"], "fingerprint": meta["fingerprint"],
            "stages": facts["stages"], "parts": facts["parts"], "peak_mb": _peak_mb()}


def _in_fresh_process(call: str) -> dict:
    code = f"import json; from hybrid.bench.preprocess_bench import *; print(json.dumps({call}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"benchmark case {call} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(*, lines=(1_000_000, 4_000_000), processes=(1, 2), repeats: int = 1, data_dir=None,
        say=lambda line: None) -> dict:
    """Every (lines, case) ``repeats`` times; one row per case."""
    if 1 not in processes:
        raise ValueError("processes must include 1: speed-ups are over one process")
    data_dir = Path(data_dir) if data_dir else Path(tempfile.gettempdir()) / "hybrid-bench-preprocess"
    rows = []
    for n in lines:
        path = input_file(data_dir, n, say)
        cases = [("floor", 0)] + [("ours", p) for p in processes]
        runs: dict = {case: [] for case in cases}
        for repeat in range(repeats):
            for kind, p in (cases if repeat % 2 == 0 else cases[::-1]):
                call = (f"measure_floor({str(path)!r})" if kind == "floor" else
                        f"measure_ours({str(path)!r}, {p}, {str(data_dir / f'store-{n}-{p}')!r})")
                result = _in_fresh_process(call)
                runs[(kind, p)].append(result)
                say(f"repeat {repeat + 1}/{repeats} {n} lines {kind}{f' {p} processes' if p else ''}: "
                    f"{result['seconds']:.2f} s")
        floor = runs[("floor", 0)]
        one = runs[("ours", 1)]
        fingerprints = {r["fingerprint"] for (kind, _), case in runs.items() if kind == "ours" for r in case}
        for (kind, p), case in runs.items():
            seconds = statistics.median(r["seconds"] for r in case)
            row = {"lines": n, "file_mb": round(path.stat().st_size / 2**20, 1), "case": kind, "processes": p,
                   "seconds": round(seconds, 3), "seconds_runs": [r["seconds"] for r in case],  # unrounded: the ratios are of these
                   "lines_per_s": round(n / seconds), "peak_mb": max(r["peak_mb"] for r in case),
                   "of_floor": round(statistics.median(r["seconds"] / f["seconds"] for r, f in zip(case, floor)), 3)}
            if kind == "ours":
                row["of_one_process"] = round(statistics.median(
                    r["seconds"] / o["seconds"] for r, o in zip(case, one)), 3)
                row["stages"] = {k: round(statistics.median(r["stages"][k] for r in case), 3)
                                 for k in case[0]["stages"]}
                row["parts"] = case[0]["parts"]
                row["same_store"] = len(fingerprints) == 1
            rows.append(row)
    best = max((r for r in rows if r["case"] == "ours"), key=lambda r: r["lines_per_s"])
    return {"repeats": repeats, "rows": rows, "data_dir": str(data_dir),
            "criteo_1tb_hours": round(CRITEO_1TB_LINES / best["lines_per_s"] / 3600, 2),
            "criteo_1tb_from": f"{best['lines']} lines on {best['processes']} processes"}


def format_table(result: dict) -> str:
    lines = [f"{'lines':>9}{'MiB':>6}  {'case':<13}{'seconds':>8}{'lines/s':>10}{'of floor':>9}{'of 1 proc':>10}"
             f"{'peak MiB':>9}  stages s (scan/vocabulary/write/commit)"]
    for r in result["rows"]:
        case = "floor" if r["case"] == "floor" else f"{r['processes']} processes"
        stages = "/".join(f"{v:.2f}" for v in r["stages"].values()) if "stages" in r else "pyarrow"
        of_one = f"{r['of_one_process']:.2f}" if "of_one_process" in r else "-"
        lines.append(f"{r['lines']:>9}{r['file_mb']:>6.0f}  {case:<13}{r['seconds']:>8.2f}{r['lines_per_s']:>10}"
                     f"{r['of_floor']:>9.2f}{of_one:>10}{r['peak_mb']:>9.0f}  {stages}")
    same = all(r.get("same_store", True) for r in result["rows"])
    return ("\n".join(lines) + f"\nthe same store at every process count: {'yes' if same else 'NO'}"
            f"\nCriteo 1TB ({CRITEO_1TB_LINES:,} lines) at the best rate ({result['criteo_1tb_from']}): "
            f"{result['criteo_1tb_hours']} hours")


def plot(document: dict, path: Path) -> None:
    """Lines/s per case, grouped by input size."""
    plt = pyplot()
    rows = document["result"]["rows"]
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(rows)), 4))
    labels = [f"{r['lines'] // 1000}k\n{'floor' if r['case'] == 'floor' else str(r['processes']) + ' proc'}"
              for r in rows]
    ax.bar(range(len(rows)), [r["lines_per_s"] for r in rows],
           color=["tab:gray" if r["case"] == "floor" else "tab:blue" for r in rows])
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("lines per second")
    finish(fig, path, TITLE)
