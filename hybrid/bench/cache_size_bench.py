"""``hybrid bench cache-size``: Herald's cut in transmissions as the caches shrink (paper Fig. 16).

The transmissions suite's setting at cache ratios of 2-10% of the rows on
W1 and MovieLens-100k: herald (and herald in the confident order) over
vanilla at the same ratio. The paper's Fig. 16 plots training speedup over
HET at 4-10%; what it says in numbers is that speedup, so the comparison
here is of the trend (does the cut hold at small caches?), not of values.

A worker's cache must hold what its batch may need (128 samples x 26
tables = 3,328 rows on W1; the config refuses less), which 2% of the smoke
store's 34,169 rows is not. So W1 runs on a store at 0.01 of Criteo's
cardinalities (337,865 rows, 2,000,000 samples, made once into
``data/bench-w1-s0.01-2m``), and MovieLens-100k (2,625 rows; 256 per batch
of 128) at 16 samples per worker.
"""
from __future__ import annotations

from pathlib import Path

from hybrid.bench import simulated
from hybrid.bench.result_files import deterministic_counts, finish, line_chart, markdown_table, pyplot

NAME = "cache-size"
TITLE = "Transmissions against cache size (paper Fig. 16)"
RATIOS = (0.02, 0.04, 0.06, 0.08, 0.10)
WORKLOADS = ("w1-s0.01", "ml100k-b16")
CASES = ("vanilla", "herald", "herald+scheduler.order=confident",
         "herald+scheduler.scoring=cost+scheduler.order=confident")
repeats_note = deterministic_counts
PAPER = {"fig16_w1_training_speedup_over_het": [1.97, 2.15], "fig16_cache_ratios": [0.04, 0.10]}


def run(*, workloads=WORKLOADS, ratios=RATIOS, cases=CASES, iterations: int = 0, overrides=(),
        say=lambda line: None) -> dict:
    """``{workload: {ratio: counts per case}}``, each case over vanilla's at the same ratio."""
    if cases[0] != "vanilla":
        raise ValueError(f"the first case must be vanilla (the baseline), got {cases[0]!r}")
    per_workload = {}
    for item in map(simulated.workload, workloads):
        per_workload[item.name] = {
            f"{ratio:g}": simulated.count_cases(item, cases, iterations=iterations, say=say,
                                                overrides=[*simulated.PAPER_SETTING, *overrides,
                                                           f"cache.ratio={ratio}"])
            for ratio in ratios}
    return {"cases": list(cases), "ratios": [f"{r:g}" for r in ratios], "paper": PAPER, "workloads": per_workload}


def format_table(result: dict) -> str:
    lines = [f"{'workload':<10}{'cache':>7}  " + "".join(f"{case[:24]:>26}" for case in result["cases"])]
    lines.append(" " * 19 + "".join(f"{'total (total/vanilla)':>26}" for _ in result["cases"]))
    for name, ratios in result["workloads"].items():
        for ratio, counted in ratios.items():
            cells = "".join(f"{c['transmissions']:>17} ({c['normalized']['transmissions']:.3f})"
                            for c in counted["cases"].values())
            lines.append(f"{name:<10}{float(ratio):>7.0%}  {cells}")
    return "\n".join(lines)


def markdown(document: dict) -> str:
    result = document["result"]
    compared = result["cases"][1:]
    columns = [(name, case) for name in result["workloads"] for case in compared]
    table = markdown_table(
        ["cache ratio", *(f"{name} {case}" for name, case in columns), "paper"],
        [[f"{float(ratio):.0%}", *(f"{result['workloads'][name][ratio]['cases'][case]['normalized']['transmissions']:.2f}"
                                   for name, case in columns), "figure only"] for ratio in result["ratios"]])
    low, high = PAPER["fig16_w1_training_speedup_over_het"]
    setting = ", ".join(f"{name} {w[result['ratios'][0]]['batch_per_worker']} samples per worker"
                        for name, w in result["workloads"].items())
    return (f"Total transmissions over vanilla's at the same cache ratio, 8 workers ({setting}; a cache must hold "
            "what one worker's batch can need, hence W1 at 0.01 of Criteo's cardinalities and MovieLens-100k at "
            "16 samples per worker). The paper's Fig. 16 "
            f"is training speedup over HET on W1 ({low}x–{high}x at 4%–10%); its transmissions: figure only.\n\n"
            + table)


def plot(document: dict, path: Path) -> None:
    """Total over vanilla's against the cache ratio, one panel per workload, one line per case."""
    plt = pyplot()
    result = document["result"]
    fig, axes = plt.subplots(1, len(result["workloads"]), figsize=(5 * len(result["workloads"]), 4), squeeze=False)
    ratios = [float(r) for r in result["ratios"]]
    for ax, (name, per_ratio) in zip(axes[0], result["workloads"].items()):
        line_chart(ax, ratios, {case: [per_ratio[r]["cases"][case]["normalized"]["transmissions"]
                                       for r in result["ratios"]] for case in result["cases"][1:]},
                   "cache ratio", "transmissions / vanilla's")
        ax.axhline(1.0, color="grey", linewidth=0.8, label="vanilla")
        ax.set_ylim(0, 1.1)
        ax.set_title(name)
        ax.legend(fontsize=7)
    finish(fig, path, "hybrid bench cache-size")
