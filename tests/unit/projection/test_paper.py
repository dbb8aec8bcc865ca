"""The paper's testbed through the model: its speed-ups and table from projected rows, every parameter sourced."""
from hybrid.projection.paper import PAPER, SOURCES, TESTBED, WORKLOADS, _speedups, format_table


def _row(mode, ms):
    return {"mode": mode, "iteration_ms": ms, "bound": "pull", "stages": {}, "threads_needed": 1, "ps_nic_gbps": 1.0}


def test_herald_over_het_and_vanilla_are_ratios_of_iteration_times():
    speedups = _speedups([_row("het", 30.0), _row("herald", 20.0), _row("vanilla", 36.0)])
    assert (speedups["herald_over_het"], speedups["herald_over_vanilla"]) == (1.5, 1.8)
    case = {"workload": "W1", "cluster": "testbed", **speedups, "row_cost_factor_for_paper": 3.5,
            "herald_over_het_cap": 2.4, "herald_rows_cut_vs_vanilla": 0.55}
    table = format_table({"paper": PAPER, "cases": [case]})
    assert "1.50" in table and "1.80" in table and "2.11x" in table
    assert "3.5x dearer" in table and "reaches 2.40x" in table and "55% fewer" in table


def test_every_testbed_setting_has_a_source_and_every_workload_a_cache_that_holds_its_batch():
    assert {"workers", "network", "latency", "batch", "cache", "baseline", "gpu"} <= set(SOURCES)
    assert "model.embedding_dim=512" in TESTBED and "train.batch_per_worker=256" in TESTBED
    from hybrid.data.synthetic import PROFILES
    from hybrid.config import load_config

    for item in WORKLOADS:
        like = load_config(item.config).data.synthetic.like
        rows = sum(t.scaled(item.scale) for t in PROFILES[like].tables)
        assert 0.1 * rows >= 256 * len(PROFILES[like].tables), item.name  # the start-up cache check
