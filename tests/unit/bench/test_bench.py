"""Benchmarks run end to end on tiny inputs and report what they claim to."""
import json
from pathlib import Path

import pytest

from hybrid.bench import (cache_size_bench, case_mode, case_overrides, quality_bench, result_files,
                          results_report, scale_bench, scheduler_bench, simulated)
from hybrid.cli import main
from hybrid.config import Mode, load_config
from hybrid.data.store import BatchStore
from hybrid.training.simulator import simulate_mode

TINY = """name: tiny
data:
  path: {store}
  synthetic: {{like: criteo-kaggle, rows: 3000, scale: 0.001, seed: 1}}
  test_fraction: 0.1
cluster: {{workers: 2, ps: 1}}
train: {{batch_per_worker: 16}}
cache: {{ratio: 0.1}}
scheduler: {{mode: herald, warmup_iterations: 2}}
"""


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory):
    """A workload config whose store (3,000 Criteo-like samples) the first suite that needs it makes."""
    root = tmp_path_factory.mktemp("tiny")
    path = root / "tiny.yaml"
    path.write_text(TINY.format(store=root / "store"))
    return path


def _is_png(path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _direct(config_path, overrides, case, iterations):
    """What ``hybrid.training.simulator.simulate_mode`` counts for one case, without the suites."""
    mode, extra = case_mode(case)
    config = load_config(config_path, [*overrides, *extra])
    store = BatchStore(config.data.path, split="train", test_fraction=config.data.test_fraction)
    return simulate_mode(config, store, mode, iterations)


def test_transmissions_suite_counts_what_the_simulator_counts(tiny_config, tmp_path, capsys):
    """JSON alone on stdout, the same document in results/, a PNG, and the simulator's own numbers."""
    cases = "vanilla,herald+scheduler.order=confident"
    assert main(["bench", "transmissions", "--workloads", str(tiny_config), "--modes", cases, "--iterations", "12",
                 "--out", str(tmp_path), "--json", "cluster.workers=2"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document == json.loads((tmp_path / "transmissions.json").read_text())
    assert _is_png(tmp_path / "transmissions.png")
    assert document["command"] == ("hybrid bench transmissions --workloads " + str(tiny_config) + " --modes "
                                   + cases + " --iterations 12 --out " + str(tmp_path) + " --json cluster.workers=2")
    assert set(document["machine"]) == {"platform", "cpu", "cpus", "python", "numpy"}
    counted = document["result"]["workloads"]["tiny"]["cases"]
    setting = ["cluster.workers=8", "cache.ratio=0.1", "cluster.workers=2"]
    vanilla = _direct(tiny_config, setting, "vanilla", 12)
    confident = _direct(tiny_config, setting, "herald+scheduler.order=confident", 12)
    got = counted["herald+scheduler.order=confident"]
    assert (got["pulls"], got["pushes"], got["iterations"]) == (confident.pulls, confident.pushes, 10)
    assert got["normalized"]["transmissions"] == round(confident.transmissions / vanilla.transmissions, 4) < 1


def test_cache_size_suite_normalizes_to_vanilla_at_each_ratio(tiny_config, tmp_path):
    kwargs = {"workloads": (str(tiny_config),), "ratios": (0.05, 0.2), "iterations": 12,
              "overrides": ["cluster.workers=2"]}
    document = result_files.run_suite(cache_size_bench, kwargs, out=tmp_path, command="test", say=lambda text: None)
    assert json.loads((tmp_path / "cache-size.json").read_text()) == document and _is_png(tmp_path / "cache-size.png")
    setting = ["cluster.workers=8", "cache.ratio=0.1", "cluster.workers=2", "cache.ratio=0.05"]
    herald, vanilla = (_direct(tiny_config, setting, case, 12) for case in ("herald", "vanilla"))
    got = document["result"]["workloads"]["tiny"]["0.05"]["cases"]["herald"]
    assert got["transmissions"] == herald.transmissions
    assert got["normalized"]["transmissions"] == round(herald.transmissions / vanilla.transmissions, 4)


def test_scale_suite_compares_adaptive_with_static_laia(tiny_config, tmp_path):
    kwargs = {"workers": (2, 4), "score_tables": (1,), "iterations": 10,
              "workload": simulated.Workload("tiny", str(tiny_config))}
    document = result_files.run_suite(scale_bench, kwargs, out=tmp_path, command="test", say=lambda text: None)
    assert _is_png(tmp_path / "scale.png") and "figure only" in scale_bench.markdown(document)
    point = document["result"]["points"][1]
    setting = ["cluster.workers=4", "cache.ratio=0.1"]
    static = _direct(tiny_config, setting, "herald", 10)
    adaptive = _direct(tiny_config, setting, scale_bench.adaptive_case(1), 10)
    assert (point["workers"], point["static_transmissions"]) == (4, static.transmissions)
    assert point["adaptive"]["1"] == {**point["adaptive"]["1"], "tables_scored": 1,
                                      "transmissions": adaptive.transmissions,
                                      "over_static": round(adaptive.transmissions / static.transmissions, 4)}


def test_bench_all_writes_every_suite_and_the_readme_section_once(tiny_config, tmp_path, capsys):
    """``hybrid bench all`` on tiny settings; the report touches only the marked section and is idempotent."""
    readme = tmp_path / "README.md"
    before, after = "# title\n\n## Results\n\n", "\n\n## Benchmarks\n\nkept as it is\n"
    readme.write_text(before + results_report.BEGIN + "\nold text\n" + results_report.END + after)
    out = tmp_path / "results"
    assert main(["bench", "all", "--workloads", str(tiny_config), "--workers", "2", "--score-tables", "1",
                 "--ratios", "0.1", "--iterations", "6", "--threads", "1", "--laia", "exact", "--scale", "0.001",
                 "--batch-per-worker", "8", "--repeats", "1", "--out", str(out), "--readme", str(readme), "--json",
                 "cluster.workers=2"]) == 0
    documents = json.loads(capsys.readouterr().out)
    assert list(documents) == [*results_report.SUITES, "report"] and documents["report"]["changed"]
    for name in results_report.SUITES:
        assert documents[name] == json.loads((out / f"{name}.json").read_text()) and _is_png(out / f"{name}.png")
    text = readme.read_text()
    assert text.startswith(before + results_report.BEGIN) and text.endswith(results_report.END + after)
    assert "old text" not in text and "](results/transmissions.png)" in text
    assert text.count("hybrid bench all --workloads") == len(results_report.SUITES)
    assert "| herald | " in text and "0.65 (0.46 / 0.83)" in text  # ours beside the paper's Table 2
    assert main(["bench", "report", "--out", str(out), "--readme", str(readme)]) == 0
    assert readme.read_text() == text


def test_report_refuses_a_readme_without_markers(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    assert main(["bench", "report", "--out", str(tmp_path), "--readme", str(readme)]) == 1
    assert "marker" in capsys.readouterr().err and readme.read_text() == "# no markers\n"


def test_report_refuses_a_directory_without_results_and_leaves_the_page(tmp_path, capsys):
    """A mistyped --out would otherwise replace every table on the page with "not run yet"."""
    readme = tmp_path / "results.md"
    page = f"# results\n{results_report.BEGIN}\nthe tables\n{results_report.END}\n"
    readme.write_text(page)
    assert main(["bench", "report", "--out", str(tmp_path / "typo"), "--readme", str(readme)]) == 1
    assert "typo: no suite results (transmissions.json" in capsys.readouterr().err and readme.read_text() == page


def _two_thread_share(two_threads_ms: float, one_thread_ms: float) -> float:
    """Amdahl's p, written out: t2 = t1 ((1 - p) + p / 2)."""
    return min(1.0, max(0.0, 2 * (1 - two_threads_ms / one_thread_ms)))


def test_scheduler_bench_reports_every_stage_as_medians(capsys, tmp_path):
    assert main(["bench", "scheduler", "--workers", "2", "--threads", "1,2", "--iterations", "3",
                 "--batch-per-worker", "8", "--scale", "0.001", "--repeats", "2", "--out", str(tmp_path),
                 "--json"]) == 0
    document = json.loads(capsys.readouterr().out)  # stdout is the JSON alone
    assert document == json.loads((tmp_path / "scheduler.json").read_text())
    assert document["repeats"].startswith("2 runs per case") and _is_png(tmp_path / "scheduler.png")
    rows = document["result"]["rows"]
    assert [(r["workers"], r["threads"], r["laia"]) for r in rows] == [
        (2, t, laia) for t in (1, 2) for laia in ("exact", "chunked", "cost")]
    for row in rows:
        stages = [row[f"{s}_ms"] for s in scheduler_bench.STAGES]
        assert all(ms > 0 for ms in stages) and len(row["total_runs_ms"]) == 2
        assert abs(row["total_ms"] - sum(stages)) < 1e-3
        # the speed-up is the median of per-repeat ratios to the one-thread case; one thread is 1.0 by definition
        one = next(r for r in rows if r["threads"] == 1 and r["laia"] == row["laia"])
        # (the JSON rounds the speed-up to 3 decimals, each repeat's total to the nanosecond)
        ratios = sorted(a / b for a, b in zip(one["total_runs_ms"], row["total_runs_ms"]))
        assert row["speedup_vs_1_thread"] == pytest.approx(sum(ratios) / 2, abs=1e-3)
        # memory per rank: every worker's slots (2 workers) at least 4 bytes each, the same at any thread count
        assert row["memory_mb"] > 0 and row["bytes_per_slot"] > 4 and row["memory_mb"] == one["memory_mb"]
        # by part: the state's arrays, and what the tracer saw besides them, adding up to the whole
        parts = row["memory_parts_mb"]
        assert {"holder sets", "caches", "row-to-slot tables", "events", "policy and the rest"} <= set(parts)
        assert sum(parts.values()) == pytest.approx(row["memory_mb"], abs=0.1) and parts["events"] > 0
        # the update's and the plan's parts add up to them (medians of two runs are their means)
        parts = row["parts_ms"]
        assert list(parts) == list(scheduler_bench.PARTS) and parts["train"] > 0 and parts["needs"] > 0
        assert parts["train"] + parts["update, the rest"] == pytest.approx(row["state_update_ms"], abs=1e-3)
        assert parts["needs"] + parts["pushes"] + parts["plan, the rest"] == pytest.approx(row["plan_ms"], abs=1e-3)
        # each stage's parallel share on 2 threads: Amdahl's p from the two rows' medians (rounded to 3 decimals)
        if row["threads"] == 1:
            assert "parallel_share" not in row and "parts_parallel_share" not in row
        else:
            for s in scheduler_bench.STAGES:  # the JSON's ms are rounded to 1e-4: p within what that allows
                low = _two_thread_share(row[f"{s}_ms"] + 5e-5, one[f"{s}_ms"] - 5e-5)
                high = _two_thread_share(row[f"{s}_ms"] - 5e-5, one[f"{s}_ms"] + 5e-5)
                assert low - 1e-3 <= row["parallel_share"][s] <= high + 1e-3
            for p in scheduler_bench.PARTS:  # and each part's, alike
                low = _two_thread_share(row["parts_ms"][p] + 5e-5, one["parts_ms"][p] - 5e-5)
                high = _two_thread_share(row["parts_ms"][p] - 5e-5, one["parts_ms"][p] + 5e-5)
                assert low - 1e-3 <= row["parts_parallel_share"][p] <= high + 1e-3


def test_preprocess_bench_times_the_floor_and_each_process_count_on_one_input(capsys, tmp_path):
    assert main(["bench", "preprocess", "--lines", "3000", "--processes", "1,2", "--repeats", "2",
                 "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document == json.loads((tmp_path / "preprocess.json").read_text())
    assert _is_png(tmp_path / "preprocess.png")
    rows = document["result"]["rows"]
    assert [(r["case"], r["processes"]) for r in rows] == [("floor", 0), ("ours", 1), ("ours", 2)]
    floor, one, two = rows
    for row in rows:
        assert row["lines"] == 3000 and len(row["seconds_runs"]) == 2 and row["peak_mb"] > 0
        ratios = sorted(r / f for r, f in zip(row["seconds_runs"], floor["seconds_runs"]))
        assert row["of_floor"] == pytest.approx(sum(ratios) / 2, abs=2e-3)
    assert one["of_one_process"] == 1.0 and two["same_store"] and one["same_store"]
    assert set(two["stages"]) == {"scan", "vocabulary", "write", "commit"}
    assert document["result"]["criteo_1tb_hours"] > 0
    assert (tmp_path / "data" / "criteo-3000.tsv").is_file() and not list((tmp_path / "data").glob("store-*"))


@pytest.mark.parametrize("cores, counts", [(1, (1,)), (2, (1, 2)), (12, (1, 2, 4, 8, 12)), (16, (1, 2, 4, 8, 16))])
def test_preprocess_bench_times_powers_of_two_up_to_the_cores(monkeypatch, cores, counts):
    from hybrid.bench import preprocess_bench

    monkeypatch.setattr("hybrid.data.task_pool.usable_cores", lambda: cores)
    assert preprocess_bench.process_counts() == counts


def test_quality_is_brute_force_over_policy_transmissions_after_the_warm_up():
    result = quality_bench.run(workers=(2, 3), iterations=8, warmup=2)
    assert [p["workers"] for p in result["points"]] == [2, 3]
    for point in result["points"]:
        assert point["iterations"] == 8 and point["warmup"] == 2
        for name in ("laia", "laia-confident", "random"):
            r = point[name]
            assert 0 < r["brute_force"] <= r["transmissions"]
            assert r["quality"] == round(r["brute_force"] / r["transmissions"], 4)
    assert result["points"][1] == {**quality_bench.measure(workers=3, iterations=8, warmup=2),
                                   "seconds": result["points"][1]["seconds"]}


@pytest.mark.job
def test_train_bench_runs_each_case_under_mpi_and_pairs_the_ratios(tmp_path):
    """A tiny workload, one size, two cases (one a mode with a setting): real runs, summaries, paired ratios."""
    from hybrid.bench import train_bench

    config = tmp_path / "tiny.yaml"
    config.write_text(f"""name: tiny
data:
  path: {tmp_path / 'tiny-store'}
  synthetic: {{like: criteo-kaggle, rows: 3000, scale: 0.001, seed: 1}}
model: {{name: dlrm, embedding_dim: 4, bottom_mlp: [8], top_mlp: [8]}}
cluster: {{workers: 2, ps: 1}}
train: {{batch_per_worker: 16}}
cache: {{ratio: 0.05}}
""")
    herald = "herald+train.deterministic=true"
    refused = "vanilla+cache.ratio=0.0001"  # a cache smaller than one iteration: refused at start-up
    result = train_bench.run(config_path=str(config), sizes=("smoke",), modes=("vanilla", herald, "plain", refused),
                             iterations=8, repeats=1, progress=lambda line: None)
    assert [(f["case"], f["error"].split(":")[0]) for f in result["failed"]] == \
        [(refused, "hybrid train")]  # said, and the other cases measured all the same
    assert "cache.ratio" in result["failed"][0]["error"] and "failed: hybrid train" in train_bench.format_table(result)
    cases = {case["mode"]: case for case in result["cases"]}
    assert set(cases) == {"vanilla", herald, "plain"} and result["ranks"] == 3
    for case in (cases["vanilla"], cases[herald]):
        assert case["samples_per_s"] > 0 and case["rows_moved"] > 0 and case["table_rows"] == 34169
        assert case["ps_shard_mb"] > 0 and case["worker_peak_rss_mb"] > 0
        assert case["outside_compute_ms"] == pytest.approx(sum(v for k, v in case["iteration_ms"].items()
                                                               if k != "compute"), abs=0.01)
    assert cases[herald]["rows_moved"] < cases["vanilla"]["rows_moved"]  # the herald schedule ran
    floor = cases["plain"]  # the one-process floor: the same global batches, all compute
    assert floor["samples_per_s"] > 0 and floor["outside_compute_ms"] == 0 and floor["iteration_ms"]["compute"] > 0
    assert floor["batch_per_worker"] == cases["vanilla"]["batch_per_worker"] == 16
    expected = cases[herald]["samples_per_s"] / cases["vanilla"]["samples_per_s"]
    assert result["ratios"][f"{herald}/vanilla smoke"] == round(expected, 3)
    assert set(result["ratios"]) == {f"{herald}/vanilla smoke", "plain/vanilla smoke"}
    assert f"{herald}/vanilla smoke" in train_bench.format_table(result)


def test_a_failed_runs_reason_is_its_error_line():
    from hybrid.bench.train_bench import failure_line

    output = ("training failed with exit 1, summary missing (bash launch/mpirun.sh ...):\n+ mpirun ...\n"
              "hybrid train: error on ranks 0-1 of 2 (vm): SchedulerError: cache.ratio=0.1 gives 3417 slots\n"
              "Primary job terminated normally, but 1 process returned")
    assert failure_line(output) == "hybrid train: error on ranks 0-1 of 2 (vm): SchedulerError: cache.ratio=0.1 " \
                                   "gives 3417 slots"
    assert failure_line("training failed with exit 1:\nSegmentation fault") == "Segmentation fault"


def test_a_case_is_a_mode_with_optional_settings():
    assert case_overrides("herald") == ["scheduler.mode=herald"]
    assert case_mode("het+scheduler.staleness=100") == (Mode.het, ["scheduler.staleness=100"])
    with pytest.raises(ValueError, match="not one of"):
        case_mode("fast")
    assert case_overrides("herald+train.deterministic=true+cache.ratio=0.2") == \
        ["scheduler.mode=herald", "train.deterministic=true", "cache.ratio=0.2"]
    for bad in ("", "+train.deterministic=true", "herald+deterministic"):
        with pytest.raises(ValueError, match="MODE"):
            case_overrides(bad)


def test_other_is_the_iteration_time_the_stages_leave_out_also_for_a_summary_without_it():
    from hybrid.bench.train_bench import other_ms_of as other_ms

    # 100 iterations in 1 s of training (1.5 s less 0.5 s paused): 10 ms per iteration, 9.25 of them in stages
    older = {"iterations": 100, "seconds": 1.5, "paused_seconds": 0.5,
             "iteration_ms": {"pull": 1.0, "compute": 8.0, "push": 0.25}}
    assert other_ms(older) == 0.75
    assert other_ms({**older, "iteration_ms": {**older["iteration_ms"], "other": 5.0}}) == 0.75  # its own left out
    assert other_ms({"throughput": 100.0, "iteration_ms": {"compute": 3.0}}) == 0.0  # the floor's: no iterations
    assert other_ms({**older, "iteration_ms": {"compute": 11.0}}) == 0.0  # never negative


def _row(size, mode, runs, batch=128, label="", **fields):
    return {"size": size, "mode": mode, "case": mode + label, "batch_per_worker": batch, "samples_per_s_runs": runs,
            **fields}


def test_train_bench_ratios_are_medians_of_paired_runs():
    from hybrid.bench.train_bench import ratios

    rows = [_row("smoke", "vanilla", [10.0, 20.0, 30.0]), _row("smoke", "herald", [12.0, 20.0, 60.0]),
            _row("full", "vanilla", [5.0, 20.0, 30.0]), _row("full", "herald", [6.0, 10.0, 30.0])]
    assert ratios(rows, ("smoke", "full"), ("vanilla", "herald")) == {
        "full/smoke vanilla": 1.0, "full/smoke herald": 0.5,
        "herald/vanilla smoke": 1.2, "herald/vanilla full": 1.0}


def test_train_bench_pairs_each_case_with_its_twin_in_the_other_checkout_per_batch_size():
    from hybrid.bench.train_bench import ratios

    rows = [_row("smoke", "plain", [10.0, 10.0], 64), _row("smoke", "herald", [5.0, 6.0], 64),
            _row("smoke", "plain", [10.0, 10.0], 64, "@beside"), _row("smoke", "herald", [4.0, 4.0], 64, "@beside"),
            _row("smoke", "plain", [20.0, 20.0], 128), _row("smoke", "herald", [10.0, 10.0], 128),
            _row("smoke", "plain", [20.0, 20.0], 128, "@beside"),
            _row("smoke", "herald", [10.0, 5.0], 128, "@beside")]
    assert ratios(rows, ("smoke",), ("plain", "herald")) == {
        "herald/plain smoke b64": 0.55, "herald@beside/plain@beside smoke b64": 0.4,
        "plain/plain@beside smoke b64": 1.0, "herald/herald@beside smoke b64": 1.375,
        "herald/plain smoke b128": 0.5, "herald@beside/plain@beside smoke b128": 0.375,
        "plain/plain@beside smoke b128": 1.0, "herald/herald@beside smoke b128": 1.5}


def test_train_bench_fits_each_stage_as_a_fixed_cost_plus_a_cost_per_sample_or_row():
    """Over batch sizes: ms = fixed + per-unit x, x = rows moved per iteration for pull and push, samples for
    the rest; exact for points on a line."""
    from hybrid.bench.train_bench import STAGES, fits

    def case(batch, rows_per_iteration):
        ms = {stage: 0.0 for stage in STAGES}
        ms.update(compute=0.5 + 0.02 * batch, pull=0.1 + 0.003 * rows_per_iteration, barrier=0.05)
        return _row("smoke", "herald", [1.0], batch, iteration_ms=ms, rows_per_iteration=rows_per_iteration,
                    outside_compute_ms=round(sum(v for k, v in ms.items() if k != "compute"), 6))

    fitted = fits([case(64, 20.0), case(128, 40.0), case(256, 80.0), _row("smoke", "plain", [1.0])])
    assert list(fitted) == ["herald smoke"]  # one batch size alone: nothing to fit
    stages = fitted["herald smoke"]
    assert stages["compute"] == {"fixed_ms": 0.5, "per_unit_us": 20.0, "unit": "sample"}
    assert stages["pull"] == {"fixed_ms": 0.1, "per_unit_us": 3.0, "unit": "row"}
    assert stages["barrier"] == {"fixed_ms": 0.05, "per_unit_us": 0.0, "unit": "sample"}
    assert stages["outside_compute"]["fixed_ms"] == 0.15


@pytest.fixture
def tiny_store(tiny_config):
    """The tiny config, its store made if no suite has made it yet."""
    from hybrid.data.synthetic import synthesize

    config = load_config(str(tiny_config), [])
    if not (Path(config.data.path) / "meta.json").is_file():
        synthesize(config.data.path, like="criteo-kaggle", rows=3000, scale=0.001, seed=1)
    return tiny_config


def test_the_plain_floor_trains_the_reference_model(tiny_store):
    """bench plain is the same model on the same batches as the single-process reference (float64, SGD,
    a warm-up and cosine schedule of the rates)."""
    import numpy as np

    from hybrid.bench.plain_torch import train_plain
    from hybrid.training.reference import train_reference

    config = load_config(str(tiny_store), ["model.precision=float64", "train.embedding_lr=0.5",
                                           "train.lr_schedule=cosine", "train.lr_warmup=3"])
    store = BatchStore(config.data.path, split="train", test_fraction=config.data.test_fraction)
    table, model, _, _ = train_plain(config, store, 12)
    expected_table, expected_model = train_reference(config, store, 12)
    assert np.abs(table - expected_table).max() < 1e-12
    for got, want in zip(model.parameters(), expected_model.parameters()):
        assert (got - want).abs().max().item() < 1e-12


def test_bench_plain_reports_each_thread_count(tiny_store, capsys):
    assert main(["bench", "plain", str(tiny_store), "--threads", "1,2", "--iterations", "8", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert [r["threads"] for r in results] == [1, 2]
    assert all(r["iterations"] == 3 and r["samples_per_s"] > 0 and r["global_batch"] == 32 for r in results)
