"""``hybrid bench transmissions``: embedding transmissions per mode, normalized to vanilla (paper Fig. 11, Table 2).

The paper's simulation setting (8 workers x 128 samples, caches of 10% of
the rows, 10 warm-up iterations excluded) on the synthetic W1-W4 smoke
workloads and the real MovieLens-100k, in time order and shuffled. Counts
are deterministic (seeded allocation, no clock in any decision), so one
run suffices.
"""
from __future__ import annotations

from pathlib import Path

from hybrid.bench import simulated
from hybrid.bench.result_files import deterministic_counts, finish, grouped_bars, markdown_table, pyplot

NAME = "transmissions"
TITLE = "Embedding transmissions per mode (paper Fig. 11 and Table 2)"

# every case of the suite, vanilla first (the baseline); a new allocation order is one more entry here
CASES = ("vanilla", "laia", "plan", "herald", "herald+scheduler.order=confident", "herald+scheduler.scoring=cost",
         "herald+scheduler.scoring=cost+scheduler.order=confident",
         "herald+scheduler.scoring=cost+scheduler.order=confident+scheduler.swap_rounds=2",
         "herald+scheduler.scoring=cost+scheduler.order=confident+scheduler.lookahead=true", "het",
         "het+scheduler.staleness=100", "fae")
WORKLOADS = ("w1", "w2", "w3", "w4", "ml100k", "ml100k-shuffled")
KINDS = ("pulls", "pushes", "transmissions")
repeats_note = deterministic_counts

# what the paper's text states (reductions against vanilla); per-workload bars of Fig. 11: figure only
PAPER = {
    "table2_w1_criteo_reduction": {"laia": {"pulls": 0.54, "pushes": 0.17, "transmissions": 0.35},
                                   "plan": {"pulls": 0.0, "pushes": 0.13, "transmissions": 0.07},
                                   "herald": {"pulls": 0.54, "pushes": 0.63, "transmissions": 0.59}},
    "fig11_herald_reduction_range": {"pulls": [0.43, 0.88], "pushes": [0.51, 0.90], "transmissions": [0.48, 0.89]},
}


def run(*, workloads=WORKLOADS, cases=CASES, iterations: int = 0, overrides=(), say=lambda line: None) -> dict:
    """Counts of every case on every workload in the paper's setting (``overrides`` after it)."""
    if cases[0] != "vanilla":
        raise ValueError(f"the first case must be vanilla (the baseline), got {cases[0]!r}")
    setting = [*simulated.PAPER_SETTING, *overrides]
    return {"cases": list(cases), "setting": setting, "paper": PAPER,
            "workloads": {item.name: simulated.count_cases(item, cases, overrides=setting, iterations=iterations,
                                                           say=say)
                          for item in map(simulated.workload, workloads)}}


def format_table(result: dict) -> str:
    width = max(len(case) for case in result["cases"]) + 2
    lines = [f"{'workload':<17}{'case':<{width}}{'pulls':>10}{'pushes':>10}{'total':>10}"
             f"{'pull/v':>8}{'push/v':>8}{'total/v':>8}{'iters':>7}"]
    for name, w in result["workloads"].items():
        for case, c in w["cases"].items():
            n = c["normalized"]
            lines.append(f"{name:<17}{case:<{width}}{c['pulls']:>10}{c['pushes']:>10}{c['transmissions']:>10}"
                         + "".join(f"{n[k]:>8.3f}" for k in KINDS) + f"{c['iterations']:>7}")
    return "\n".join(lines)


def _paper_w1(case: str) -> str:
    cut = PAPER["table2_w1_criteo_reduction"].get(case)
    if cut is None:
        return "—"
    return f"{1 - cut['transmissions']:.2f} ({1 - cut['pulls']:.2f} / {1 - cut['pushes']:.2f})"


def _paper_range(case: str) -> str:
    if case != "herald":
        return "—"
    r = {k: f"{1 - hi:.2f}–{1 - lo:.2f}" for k, (lo, hi) in PAPER["fig11_herald_reduction_range"].items()}
    return f"{r['transmissions']} ({r['pulls']} / {r['pushes']})"


def markdown(document: dict) -> str:
    """Cases x workloads, each cell total (pulls / pushes) over vanilla's, the paper's two statements beside."""
    result = document["result"]
    names = list(result["workloads"])
    rows = []
    for case in result["cases"]:
        cells = [result["workloads"][name]["cases"][case]["normalized"] for name in names]
        rows.append([case, *(f"{n['transmissions']:.2f} ({n['pulls']:.2f} / {n['pushes']:.2f})" for n in cells),
                     _paper_w1(case), _paper_range(case)])
    table = markdown_table(["case", *names, "paper W1, real Criteo (Table 2)",
                            "paper, range over its 4 datasets (§6.2.1)"], rows)
    counted = ", ".join(f"{name} {next(iter(w['cases'].values()))['iterations']}"
                        for name, w in result["workloads"].items())
    return ("Total (pulls / pushes) transmissions over vanilla's, " + ", ".join(result["setting"])
            + f"; counted iterations after 10 warm-up: {counted}. The paper's cells are 1 minus the reductions "
            "its text states; its per-workload bars (Fig. 11): figure only. Ours are synthetic W1-W4 "
            "stand-ins and the real MovieLens-100k, not the paper's datasets.\n\n" + table)


def plot(document: dict, path: Path) -> None:
    """Pulls, pushes and total over vanilla's: grouped bars per workload, one per case (as Fig. 11)."""
    plt = pyplot()
    result = document["result"]
    names = list(result["workloads"])
    fig, axes = plt.subplots(3, 1, figsize=(12, 12))
    for ax, kind in zip(axes, KINDS):
        series = {case: [result["workloads"][n]["cases"][case]["normalized"][kind] or 0.0 for n in names]
                  for case in result["cases"][1:]}
        grouped_bars(ax, names, series, f"{kind} / vanilla's")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, ncol=2, loc="lower center")
    finish(fig, path, "hybrid bench transmissions: " + ", ".join(result["setting"]), rect=(0, 0.12, 1, 1))
