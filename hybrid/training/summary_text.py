"""The training summary as text: the lines ``hybrid train`` prints and ``hybrid compare``'s table.

Pure functions of the summary dict (``hybrid.training.job`` writes it), so reading
summaries never imports MPI: a process that has started MPI cannot launch
``mpirun`` itself.
"""
from __future__ import annotations


def format_summary(summary: dict) -> str:
    t, e = summary["transmissions"], summary["evaluation"]
    tested = (f"test AUC {e['auc']:.4f}, log loss {e['logloss']:.4f} on {e['samples']} samples" if e
              else "not evaluated (stopped early)")
    if e and e.get("nonfinite"):
        tested += (f" ({e['nonfinite']} outputs are not finite: the model diverged; lower train.embedding_lr and "
                   f"train.dense_lr, or add train.lr_warmup)")
    best, last = summary.get("best"), summary.get("evaluation_last")
    if e and best and last:  # train.keep_best put an earlier model back
        tested += (f" with the best validation model (AUC {best['auc']:.4f} after iteration {best['step']}, "
                   f"epoch {best['epoch']:g}; the last model: test AUC {last['auc']:.4f})")
    p2p = f", p2p {t['p2p_rows']}" if t.get("p2p_rows") else ""
    apart = ""  # traffic that is not rows moved through the PS
    if summary.get("version_checks", {}).get("rows"):
        apart += f"; {summary['version_checks']['rows']} version checks"
    if summary.get("allreduced_rows"):
        apart += f"; {summary['allreduced_rows']} rows allreduced"
    if summary.get("wire_precision", "fp32") != "fp32":  # docs/design.md section 14
        moved = (t["pull_bytes"] + t["push_bytes"] + t.get("p2p_bytes", 0)) / 2**20
        apart += f"; rows and gradients in {summary['wire_precision']} on the wire ({moved:.1f} MB of rows)"
    return (f"{summary['config']} {summary.get('label', summary['mode'])}: {summary['workers']} workers + "
            f"{summary['ps']} PS, "
            f"{summary['iterations']} iterations{_epochs(summary)}, {summary['throughput']:.0f} samples/s; "
            f"transmissions {t['rows']} rows (pull {t['pull_rows']}, push {t['push_rows']}{p2p}){apart}, "
            f"{_hit_rate(summary)}; train loss {summary['train_loss']:.4f}, {tested}")


def _epochs(summary: dict) -> str:
    """' (N epochs)' for a run past one pass over the train split, else ''."""
    epochs = summary.get("epochs", 0)
    return f" ({epochs:g} epochs)" if epochs > 1 else ""


def _hit_rate(summary: dict) -> str:
    """The hit rate, and the iterations it and the transmissions cover when the warm-up leaves some out.

    ``hybrid simulate`` counts after ``scheduler.warmup_iterations``, as the
    paper does; the measured transmissions cover every iteration.
    """
    counted, everything = summary.get("counted"), summary.get("all_iterations")
    if not counted or counted["iterations"] == everything["iterations"]:
        return f"hit rate {summary['hit_rate']:.1%}"
    if not counted["iterations"]:
        return f"hit rate {summary['hit_rate']:.1%} (no iteration after the {counted['after_warmup']} warm-up ones)"
    return (f"over all {everything['iterations']} iterations; after the {counted['after_warmup']} warm-up "
            f"iterations, as hybrid simulate counts: {counted['transmissions']} rows, hit rate "
            f"{counted['hit_rate']:.1%} ({everything['hit_rate']:.1%} over all)")


def format_checkpoints(summary: dict) -> str:
    """Resumed from, checkpoints written, mid-run evaluations and an early stop, one line each ('' if none)."""
    lines = []
    if summary["start_step"]:
        lines.append(f"  resumed at iteration {summary['start_step']} "
                     f"({summary['checkpoint_rows']['restored']} cached rows read back on worker 0)")
    for entry in summary["evaluations"]:
        where = f"{entry['split']} " if "split" in entry else ""
        epoch = f" (epoch {entry['epoch']:g})" if "epoch" in entry else ""
        lines.append(f"  evaluation after iteration {entry['step']}{epoch}: {where}AUC {entry['auc']:.4f}, "
                     f"log loss {entry['logloss']:.4f}")
    for entry in summary["checkpoints"]:
        lines.append(f"  checkpoint after iteration {entry['step']}: {entry['path']} ({entry['seconds']:.1f} s)")
    if summary["stopped_by"]:
        last = summary["start_step"] + summary["iterations"] - 1
        if summary["checkpoints"]:
            lines.append(f"  stopped by {summary['stopped_by']} after iteration {last}; continue with --resume "
                         f"(from {summary['checkpoints'][-1]['path']})")
        else:
            lines.append(f"  stopped by {summary['stopped_by']} after iteration {last}, without a checkpoint "
                         f"(mode {summary['mode']} is not checkpointed)")
    return "\n".join(lines)


def format_breakdown(summary: dict) -> str:
    """Milliseconds per iteration by stage, and each rank's start-up time and peak memory."""
    stages = ", ".join(f"{k} {v:.2f}" for k, v in summary["iteration_ms"].items())
    ranks = "; ".join(f"{r['role']} {r['rank']}: start-up {r['startup_s']:.1f} s, peak {r['peak_rss_mb']:.0f} MB"
                      for r in summary["ranks"] or [])
    compute = summary.get("compute")
    workers = f"\n  workers on {compute['device']}; MLP gradients: {compute['allreduce']}" if compute else ""
    launch = f"\n  {format_launch(summary['launch'])}" if summary.get("launch") else ""
    return f"  ms/iteration: {stages}\n  ranks: {ranks} (PS shard {summary['ps_shard_mb']:.0f} MB){workers}{launch}"


def format_launch(launch: dict) -> str:
    """One line: the launcher, the host's ranks, cores and threads, and whether MPI yields, with who decided."""
    via = f" via {launch['via']}" if launch.get("via") else ""
    measured = launch["measured"]
    counted = ""
    if (measured["ranks_on_host"], measured["cores"]) != (launch["ranks_on_host"], launch["cores"]):
        counted = (f" (once MPI ran: {measured['ranks_on_host']} ranks on {measured['cores']} cores, "
                   f"{'they fit' if measured['fits'] else 'they do not fit'})")
    return (f"launched by {launch['launcher']}{via} on {launch['mpi']}: {launch['ranks_on_host']} ranks on "
            f"{launch['cores']} cores{counted}, {launch['compute_threads']} compute + 1 waiting thread each; "
            f"MPI {'yields' if launch['yields'] else 'spins'} while idle ({launch['decided_by']})")


def compare_summaries(summaries: list[dict]) -> str:
    """Per config, each run against the first: throughput ratio, transmissions cut, hit rate, test AUC.

    Rows and hit rate are those after the warm-up, as ``hybrid simulate``
    counts them (older summaries: every iteration's).
    """
    width = max([9, *(len(s.get("label", s["mode"])) + 1 for s in summaries)])
    lines = [f"{'config':<12}{'mode':<{width}}{'samples/s':>10}{'speed':>7}{'rows moved':>12}{'cut':>8}{'hit':>7}"
             f"{'test AUC':>10}"]
    first: dict = {}
    for s in summaries:
        base = first.setdefault(s["config"], s)
        rows, base_rows = counted_rows(s), counted_rows(base)
        auc = (s["evaluation"] or {}).get("auc", float("nan"))
        lines.append(f"{s['config']:<12}{s.get('label', s['mode']):<{width}}{s['throughput']:>10.0f}"
                     f"{s['throughput'] / base['throughput']:>6.2f}x{rows:>12}"
                     f"{(1 - rows / base_rows if base_rows else 0.0):>8.1%}{s['hit_rate']:>7.1%}{auc:>10.4f}")
    lines.append("rows moved and hit rate: after each run's scheduler.warmup_iterations, as hybrid simulate counts")
    return "\n".join(lines)


def counted_rows(summary: dict) -> int:
    """The transmissions after the warm-up, as ``hybrid simulate`` counts them (older summaries: all of them)."""
    counted = summary.get("counted")
    return counted["transmissions"] if counted and counted["iterations"] else summary["transmissions"]["rows"]


def other_ms(training_seconds: float, iterations: int, stage_ms: dict) -> float:
    """An iteration's time outside its stages (the summary's ``other``): the training time per iteration less
    the stages' milliseconds (``stage_ms``, any ``other`` in it left out); 0 without iterations."""
    if iterations <= 0 or training_seconds <= 0:
        return 0.0
    return max(0.0, 1000 * training_seconds / iterations - sum(v for k, v in stage_ms.items() if k != "other"))
