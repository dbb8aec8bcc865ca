"""What every paper suite writes: ``results/SUITE.json`` (the result with its command, machine and date) and a PNG.

A number is only worth comparing with the paper's when it says where it
came from, so every document carries the exact command line, the machine
(platform, CPU model and count, Python and NumPy versions), the date and
how many repeats its figures are medians of.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (the processor string elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict:
    """Where a result was measured: timings from another machine are not comparable."""
    return {"platform": platform.platform(), "cpu": cpu_model(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "numpy": np.__version__}


def machine_line(info: dict) -> str:
    return f"{info['platform']}, {info['cpu']} x {info['cpus']} CPUs, Python {info['python']}, NumPy {info['numpy']}"


def command_line(argv) -> str:
    """The command as a user would type it again."""
    return shlex.join(["hybrid", *argv])


def run_suite(suite, kwargs: dict, *, out: Path, command: str, say: Callable[[str], None]) -> Optional[dict]:
    """Run ``suite.run(**kwargs)``, write its JSON and PNG under ``out``, print its table; the document.

    ``suite`` is a module with ``NAME``, ``repeats_note``, ``run``,
    ``format_table`` and ``plot``; ``repeats_note(kwargs)`` says what the
    figures are medians of (or that the counts are deterministic). A suite
    run under MPI returns its result on one rank only: the others get None.
    """
    started = time.perf_counter()
    result = suite.run(**kwargs)
    if result is None:
        return None
    document = {"suite": suite.NAME, "command": command, "machine": machine(),
                "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                "repeats": suite.repeats_note(kwargs), "seconds": round(time.perf_counter() - started, 1),
                "result": result}
    json_path, png_path = save(Path(out) / suite.NAME, document, suite.plot)
    say(header(document))
    say(suite.format_table(result))
    say(f"wrote {json_path} and {png_path} ({document['seconds']} s)")
    return document


def deterministic_counts(kwargs: dict) -> str:
    """The repeats note of a suite that counts rows: no clock decides anything, so one run is the result."""
    return "1 run: the counts are deterministic, so repeats would be identical"


def header(document: dict) -> str:
    return (f"command: {document['command']}\nmachine: {machine_line(document['machine'])}\n"
            f"date: {document['date']}\nrepeats: {document['repeats']}")


def save(stem: Path, document: dict, plot: Callable[[dict, Path], None]) -> tuple[Path, Path]:
    """``stem.json`` holding ``document`` and ``stem.png`` drawn by ``plot(document, path)``."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    json_path, png_path = stem.with_name(stem.name + ".json"), stem.with_name(stem.name + ".png")
    json_path.write_text(json.dumps(document, indent=2) + "\n")
    plot(document, png_path)
    return json_path, png_path


def markdown_table(header: list, rows: list) -> str:
    """A markdown table: every suite's section of docs/results.md is one."""
    lines = ["| " + " | ".join(map(str, header)) + " |", "|---" * len(header) + "|"]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


def line_chart(ax, x: list, series: dict, xlabel: str, ylabel: str) -> None:
    """One marked line per series over ``x``: the suites that vary one setting plot this way."""
    for label, values in series.items():
        ax.plot(x, values, marker="o", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)


def grouped_bars(ax, groups: list[str], series: dict, title: str) -> None:
    """One bar per series within each group (a distinct color each), and the baseline at 1.0."""
    import matplotlib

    width = 0.8 / max(1, len(series))
    colors = matplotlib.colormaps["tab20"]  # the default cycle repeats after 10 series
    for i, (label, values) in enumerate(series.items()):
        ax.bar([g + i * width for g in range(len(groups))], values, width, label=label, color=colors(i % 20))
    ax.axhline(1.0, color="grey", linewidth=0.8)
    top = max([1.0, *(v for values in series.values() for v in values)])
    ax.set_ylim(0, 1.05 * top)
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))], groups, fontsize=8)
    ax.set_title(title)


def pyplot():
    """matplotlib's pyplot on the Agg backend: the suites run on machines without a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def finish(fig, path: Path, title: str, rect=None) -> None:
    """Title, lay out (within ``rect`` of the figure, leaving the rest to a figure legend), write and close ``fig``."""
    fig.suptitle(title)
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=110)
    fig.clf()
    pyplot().close(fig)
