"""The command line: synth from flags or a config, honest 'not implemented', errors."""
import json
import subprocess
import sys

import pytest

from hybrid.cli import main
from hybrid.data.store import BatchStore


def test_synth_from_flags(tmp_path, capsys):
    assert main(["synth", "--like", "criteo-kaggle", "--rows", "2000", "--scale", "0.001",
                 "--out", str(tmp_path / "s")]) == 0
    assert BatchStore(tmp_path / "s").n_samples == 2000
    assert "fingerprint" in capsys.readouterr().out


def test_synth_from_config_keeps_an_existing_store(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(f"data:\n  path: {tmp_path / 'store'}\n  synthetic: {{like: avazu, rows: 1500}}\n")
    assert main(["synth", "--config", str(config)]) == 0
    fingerprint = BatchStore(tmp_path / "store").fingerprint
    assert main(["synth", "--config", str(config), "data.synthetic.seed=5"]) == 0
    assert "keeping it" in capsys.readouterr().err
    assert BatchStore(tmp_path / "store").fingerprint == fingerprint
    assert main(["synth", "--config", str(config), "data.synthetic.seed=5", "--force"]) == 0
    assert BatchStore(tmp_path / "store").fingerprint != fingerprint


def test_synth_without_output_is_an_error(capsys):
    assert main(["synth", "--like", "avazu"]) == 1
    assert "--out" in capsys.readouterr().err


def test_synth_with_a_real_data_config_says_so(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("data: {path: data/criteo-kaggle}\n")
    assert main(["synth", "--config", str(config)]) == 1
    assert "hybrid preprocess" in capsys.readouterr().err


def test_ps_bench_outside_mpi_says_how_to_run_it():
    """In a process of its own: it starts MPI, and an MPI singleton cannot launch mpirun (bench train tests)."""
    result = subprocess.run([sys.executable, "-m", "hybrid", "bench", "ps"], capture_output=True, text=True)
    assert result.returncode == 1
    assert "launch/mpirun.sh -n 2 python -m hybrid bench ps" in result.stderr


def test_stats_json(tmp_path, capsys):
    main(["synth", "--like", "movielens-25m", "--rows", "3000", "--scale", "0.01", "--out", str(tmp_path / "s")])
    capsys.readouterr()
    assert main(["stats", str(tmp_path / "s"), "--json"]) == 0

    result = json.loads(capsys.readouterr().out)
    assert result["samples"] == 3000 and [t["name"] for t in result["tables"]] == ["user", "item"]


def test_python_dash_m_entry_point():
    out = subprocess.run([sys.executable, "-m", "hybrid", "--help"], capture_output=True, text=True, check=True)
    for command in ("synth", "preprocess", "simulate", "train", "bench", "stats"):
        assert command in out.stdout


def test_compare_puts_modes_side_by_side_against_the_first_per_config(tmp_path, capsys):
    def summary(config, mode, throughput, rows, auc):
        return {"config": config, "mode": mode, "throughput": throughput, "hit_rate": 0.5,
                "transmissions": {"rows": rows}, "evaluation": {"auc": auc}}

    files = []
    for i, s in enumerate([summary("a", "vanilla", 100.0, 1000, 0.7), summary("a", "herald", 150.0, 400, 0.7),
                           summary("b", "vanilla", 50.0, 10, 0.6)]):
        files.append(tmp_path / f"{i}.json")
        files[-1].write_text(json.dumps(s))
    assert main(["compare", *map(str, files)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].split() == ["a", "herald", "150", "1.50x", "400", "60.0%", "50.0%", "0.7000"]
    assert lines[3].split()[3:6] == ["1.00x", "10", "0.0%"]
    assert main(["compare", str(tmp_path / "missing.json")]) == 1
    assert "not a training summary" in capsys.readouterr().err
    labelled = tmp_path / "labelled.json"
    labelled.write_text(json.dumps({**summary("a", "herald", 150.0, 300, 0.7), "label": "herald+cost+confident"}))
    assert main(["compare", str(files[0]), str(labelled)]) == 0
    assert capsys.readouterr().out.splitlines()[2].split()[:2] == ["a", "herald+cost+confident"]


def test_a_run_is_labelled_by_its_mode_and_the_allocation_settings_that_differ_from_the_paper():
    from hybrid.config import load_config
    from hybrid.modes import run_label

    assert run_label(load_config(None, ["scheduler.mode=herald"])) == "herald"
    assert run_label(load_config(None, ["scheduler.mode=herald", "scheduler.scoring=cost", "scheduler.order=confident",
                                        "scheduler.swap_rounds=2", "scheduler.sync=p2p"])) == \
        "herald+cost+confident+swap2+p2p"
    # blocks place other samples elsewhere (docs/design.md section 4, "Blocks"): their runs are told apart too
    assert run_label(load_config(None, ["scheduler.mode=herald", "scheduler.scoring=cost", "scheduler.order=confident",
                                        "scheduler.blocks=16"])) == "herald+cost+confident+blocks16x32"
    assert run_label(load_config(None, ["scheduler.mode=vanilla", "scheduler.order=confident"])) == "vanilla"


def test_sigterm_while_writing_a_store_leaves_nothing_behind(tmp_path):
    """A time limit or `kill` mid-write: exit 130, a message, no hidden temporary store, no store."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "big"
    process = subprocess.Popen([sys.executable, "-m", "hybrid", "synth", "--like", "criteo-kaggle", "--rows",
                                "3000000", "--scale", "0.001", "--out", str(out)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".big.tmp-*")):
        assert process.poll() is None and time.monotonic() < deadline, "the writer never started"
        time.sleep(0.05)
    time.sleep(0.5)  # mid-write
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "interrupted (SIGTERM); no partial store was left behind" in err
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_in_any_command_is_one_line_and_exit_130(monkeypatch, capsys):
    from hybrid.cli import simulate

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(simulate, "cmd_simulate", interrupted)
    assert main(["simulate", "--config", "configs/w1-smoke.yaml"]) == 130
    assert capsys.readouterr().err == "hybrid simulate: interrupted (Ctrl-C)\n"


def test_the_cli_and_the_scheduler_do_not_start_mpi_on_import():
    """A process that imported MPI is an MPI singleton: an mpirun it starts (bench train) fails at once."""
    code = ("import sys, hybrid.cli, hybrid.scheduling.scheduler, hybrid.training.simulator, hybrid.bench.train_bench, "
            "hybrid.scheduling.fae_calibration, hybrid.training.summary_text; assert 'mpi4py.MPI' not in sys.modules, 'mpi4py.MPI was imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _simulation_config(tmp_path, rows):
    config = tmp_path / "c.yaml"
    config.write_text(f"data:\n  path: {tmp_path / 'store'}\n  synthetic: {{like: criteo-kaggle, rows: {rows}, "
                      f"scale: 0.001}}\ncluster: {{workers: 2}}\ntrain: {{batch_per_worker: 16}}\n"
                      f"fae: {{budget_mb: 0.1, small_table_kb: 0}}\n")
    assert main(["synth", "--config", str(config)]) == 0
    return config


def test_simulate_json_is_the_only_output_on_stdout_and_counts_every_mode(tmp_path, capsys):
    config = _simulation_config(tmp_path, 3000)
    capsys.readouterr()
    assert main(["simulate", "--config", str(config), "--json", "--modes",
                 "vanilla,herald,herald+scheduler.sync=p2p,het+scheduler.staleness=10,fae"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)  # nothing but the JSON
    assert set(result) == {"vanilla", "herald", "herald+scheduler.sync=p2p", "het+scheduler.staleness=10", "fae"}
    assert result["het+scheduler.staleness=10"]["version_checks"] > 0 and result["fae"]["allreduced"] > 0
    assert "pulls" in err  # the table went to stderr


def test_a_simulation_within_the_warm_up_says_so(tmp_path, capsys):
    config = _simulation_config(tmp_path, 200)  # 180 training samples: 5 global batches of 32
    assert main(["simulate", "--config", str(config)]) == 1
    assert "all within scheduler.warmup_iterations=10" in capsys.readouterr().err


def test_the_process_entry_ends_like_main_with_what_torch_loaded_frozen(monkeypatch, capsys):
    """``hybrid`` and ``python -m hybrid`` run ``process_main``: main's status and output, then every object
    left alive frozen, so the interpreter's exit does not collect them (docs/testing.md: 0.4 s per job)."""
    import gc

    import torch  # noqa: F401  (what a worker rank has loaded when it exits)

    from hybrid.cli import process_main

    monkeypatch.setattr(sys, "argv", ["hybrid", "config", "no-such-config.yaml"])
    gc.unfreeze()
    try:
        assert process_main() == 1
        assert gc.get_freeze_count() > 100_000
    finally:
        gc.unfreeze()
    assert "no-such-config.yaml" in capsys.readouterr().err
    console = subprocess.run([sys.executable, "-c", "from importlib.metadata import entry_points; "
                              "print(entry_points(group='console_scripts')['hybrid'].value)"],
                             capture_output=True, text=True)
    assert console.stdout.strip() == "hybrid.cli:process_main", console.stdout + console.stderr


@pytest.mark.parametrize("ranks,said", [([3], "rank 3"), ([0, 1, 2, 3], "ranks 0-3"), ([2, 0, 3], "ranks 0, 2-3"),
                                        ([0, 1, 3, 5, 6, 7], "ranks 0-1, 3, 5-7")])
def test_the_ranks_that_refused_a_run_are_named_as_ranges(ranks, said):
    """How ``hybrid train`` names the ranks that raised one error at start-up (docs/training.md)."""
    from hybrid.cli.train import rank_ranges

    assert rank_ranges(ranks) == said
