"""Learning curves: the train loss per interval and every evaluation of a run, and their plot (``hybrid plot``).

A training summary (``hybrid train --summary-json``) holds ``curves``:
``train_loss`` (the mean loss of the global batches of each interval,
against the iteration that ends it and the epochs done by then) and
``evaluations`` (every evaluation: iteration, epoch, split, AUC, log loss).
Intervals end every ``train.eval_every`` iterations (without it, after
each tenth of an epoch, counted from the epoch's start), at each epoch's
end and at the run's last iteration, so a loss point sits under each
evaluation.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np


def interval_ends(first: int, last: int, eval_every: int, per_epoch: int) -> list[int]:
    """Iterations ``first .. last`` that end an interval: each ``eval_every``-th (else each tenth of an
    epoch), each epoch's last, and ``last``."""
    steps = np.arange(first, last + 1)
    if eval_every:
        due = (steps + 1) % eval_every == 0
    else:
        due = (steps % per_epoch + 1) % math.ceil(per_epoch / 10) == 0
    return steps[due | ((steps + 1) % per_epoch == 0) | (steps == last)].tolist()


def train_loss_points(steps: Sequence[int], loss_sums: np.ndarray, samples: Sequence[int], *, eval_every: int,
                      per_epoch: int) -> list[dict]:
    """{"step", "epoch", "loss"} per interval of the iterations ``steps`` (in order, consecutive).

    ``loss_sums[i]``: iteration ``steps[i]``'s summed sample loss over every
    worker; ``samples[i]``: its global batch size.
    """
    if not len(steps):
        return []
    sums, counts = np.asarray(loss_sums, dtype=np.float64), np.asarray(samples, dtype=np.float64)
    points, begin = [], 0
    for end in interval_ends(steps[0], steps[-1], eval_every, per_epoch):
        stop = end - steps[0] + 1
        loss = sums[begin:stop].sum() / counts[begin:stop].sum()
        points.append({"step": end, "epoch": round((end + 1) / per_epoch, 4), "loss": round(float(loss), 6)})
        begin = stop
    return points


def plot(summaries: Sequence[dict], labels: Sequence[str], out: Path) -> Path:
    """:func:`draw` the summaries into the PNG ``out``; returns ``out``."""
    import matplotlib.pyplot as plt

    figure = draw(summaries, labels)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=120)
    plt.close(figure)
    return out


def draw(summaries: Sequence[dict], labels: Sequence[str]):
    """Train loss and AUC against iterations for each summary: one figure, two panels.

    Solid lines: validation AUC (or the test split's mid-run AUC when the
    run had no validation split); a star: the final test AUC of the model
    the run kept, at that model's iteration.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (loss_axis, auc_axis) = plt.subplots(1, 2, figsize=(11, 4.2))
    for summary, label in zip(summaries, labels):
        curves = summary.get("curves") or {}
        losses = curves.get("train_loss") or []
        line, = loss_axis.plot([p["step"] + 1 for p in losses], [p["loss"] for p in losses], label=label)
        evaluations = curves.get("evaluations") or []
        final = summary.get("iterations", 0) + summary.get("start_step", 0)
        heldout = [e for e in evaluations if e["split"] == "validation"] or \
            [e for e in evaluations if e["split"] == "test" and e["step"] + 1 < final]
        auc_axis.plot([e["step"] + 1 for e in heldout], [e["auc"] for e in heldout], color=line.get_color(),
                      label=f"{label} ({heldout[0]['split'] if heldout else 'no'} mid-run)")
        kept = summary.get("evaluation")
        if kept:
            best = summary.get("best")
            at = (best["step"] if best else final - 1) + 1
            auc_axis.plot([at], [kept["auc"]], marker="*", markersize=11, linestyle="none", color=line.get_color(),
                          label=f"{label}: test {kept['auc']:.4f}")
    loss_axis.set(xlabel="iteration", ylabel="train loss (mean over the interval)", title="train loss")
    auc_axis.set(xlabel="iteration", ylabel="AUC", title="held-out AUC (star: test, on the kept model)")
    for axis in (loss_axis, auc_axis):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    return figure
