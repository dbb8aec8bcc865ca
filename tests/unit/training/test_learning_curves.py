"""Learning curves: interval means of the train loss, and the plot of several runs."""
import json
import subprocess
import sys

import numpy as np

from hybrid.training.learning_curves import draw, interval_ends, train_loss_points


def test_intervals_end_every_tenth_of_an_epoch_at_each_epochs_end_and_at_the_last_iteration():
    assert interval_ends(0, 44, 0, per_epoch=20) == [1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
                                                     33, 35, 37, 39, 41, 43, 44]
    assert interval_ends(0, 49, 0, per_epoch=25)[:4] == [2, 5, 8, 11]  # ceil(25 / 10) = 3 within the epoch
    assert interval_ends(0, 49, 0, per_epoch=25)[8:11] == [24, 27, 30]  # the count starts again each epoch
    assert interval_ends(5, 30, 10, per_epoch=12) == [9, 11, 19, 23, 29, 30]  # eval_every: where evaluations are


def test_each_point_is_the_mean_sample_loss_of_its_interval():
    steps = list(range(3, 9))
    sums, samples = np.array([10.0, 20, 30, 40, 50, 60]), [10] * 6
    points = train_loss_points(steps, sums, samples, eval_every=3, per_epoch=100)
    assert points == [{"step": 5, "epoch": 0.06, "loss": 2.0}, {"step": 8, "epoch": 0.09, "loss": 5.0}]
    assert train_loss_points([], np.zeros(0), [], eval_every=0, per_epoch=5) == []


def _summary(auc, best_step=None):
    curves = {"train_loss": [{"step": 9, "epoch": 1.0, "loss": 0.6}, {"step": 19, "epoch": 2.0, "loss": 0.5}],
              "evaluations": [{"step": 9, "epoch": 1.0, "split": "validation", "auc": auc, "logloss": 0.6},
                              {"step": 19, "epoch": 2.0, "split": "validation", "auc": auc + 0.01, "logloss": 0.6},
                              {"step": 19, "epoch": 2.0, "split": "test", "auc": auc, "logloss": 0.6}]}
    return {"config": "c", "mode": "herald", "transmissions": {"rows": 1}, "iterations": 20, "start_step": 0,
            "evaluation": {"auc": auc}, "best": {"step": best_step, "epoch": 1.0, "auc": auc} if best_step else None,
            "curves": curves}


def test_each_run_draws_its_loss_its_validation_auc_and_a_star_at_the_kept_models_test_auc():
    figure = draw([_summary(0.7), _summary(0.72, best_step=9)], ["one", "two"])
    loss_axis, auc_axis = figure.axes
    assert [(list(line.get_xdata()), list(line.get_ydata())) for line in loss_axis.lines] == \
        [([10, 20], [0.6, 0.5])] * 2
    points = [(line.get_label(), list(line.get_xdata()), list(line.get_ydata())) for line in auc_axis.lines]
    assert points == [("one (validation mid-run)", [10, 20], [0.7, 0.71]), ("one: test 0.7000", [20], [0.7]),
                      ("two (validation mid-run)", [10, 20], [0.72, 0.73]), ("two: test 0.7200", [10], [0.72])]


def test_hybrid_plot_draws_several_runs_into_one_png_and_refuses_a_summary_without_curves(tmp_path):
    paths = []
    for i, summary in enumerate([_summary(0.7), _summary(0.72, best_step=9)]):
        paths.append(tmp_path / f"s{i}.json")
        paths[-1].write_text(json.dumps(summary))
    out = tmp_path / "curves.png"
    done = subprocess.run([sys.executable, "-m", "hybrid", "plot", *map(str, paths), "--out", str(out),
                           "--labels", "one,two"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    old = tmp_path / "old.json"
    old.write_text(json.dumps({**_summary(0.7), "curves": None}))
    refused = subprocess.run([sys.executable, "-m", "hybrid", "plot", str(old), "--out", str(tmp_path / "x.png")],
                             capture_output=True, text=True)
    assert refused.returncode == 1 and "no learning curves" in refused.stderr and not (tmp_path / "x.png").exists()
    wrong = subprocess.run([sys.executable, "-m", "hybrid", "plot", *map(str, paths), "--labels", "one"],
                           capture_output=True, text=True)
    assert wrong.returncode == 1 and "--labels names 1 runs, 2 summaries" in wrong.stderr
