"""``hybrid bench e2e``: emulated hosts clean up after themselves; reports say what the counters say."""
import json
import os
import subprocess
import sys

import pytest

from hybrid.bench import e2e_bench
from hybrid.bench.emulated_hosts import EmulatedHosts, EmulationUnavailable, LinkShape, check_available
from hybrid.cli import main
from hybrid.cli.bench import _bandwidth
from hybrid.runtime.link_counters import link_bytes
from hybrid.runtime.mpi_family import of_venv


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_without_root_it_says_why_it_cannot_run(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(EmulationUnavailable, match="need root"):
        check_available()
    assert main(["bench", "e2e", "--ps"]) == 1
    assert "cannot run here" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() != 0, reason="creating network namespaces needs root")
def test_namespaces_links_and_shaping_are_removed_even_when_the_block_fails():
    hosts = EmulatedHosts(2, LinkShape("100mbit"), net=250)
    with pytest.raises(RuntimeError, match="boom"):
        with hosts:
            assert hosts.namespace(0) in _namespaces() and hosts.namespace(1) in _namespaces()
            qdiscs = subprocess.run(["tc", "qdisc", "show", "dev", hosts.link(1)], capture_output=True, text=True)
            assert "tbf" in qdiscs.stdout
            line = "10.201.250.12:1" if of_venv().name == "mpich" else "10.201.250.12 slots=1"
            assert line in hosts.hostfile.read_text().splitlines()
            assert all(c["sent"] >= 0 for c in hosts.counters())
            raise RuntimeError("boom")
    assert hosts.tag + "ns" not in _namespaces()
    assert subprocess.run(["ip", "link", "show", hosts.bridge], capture_output=True).returncode != 0
    assert hosts.workdir is None


_RANK_SCRIPT = """
import json, os, numpy as np
from mpi4py import MPI
world = MPI.COMM_WORLD
address = os.popen("ip -4 -o addr show eth0").read().split()[3].split("/")[0]
total = world.allreduce(np.full(1 << 18, world.rank + 1.0))
seen = world.gather([address, int(total[0]), world.Split_type(MPI.COMM_TYPE_SHARED).size], root=0)
if world.rank == 0:
    print("ranks saw", json.dumps(seen), flush=True)
"""


@pytest.mark.job
@pytest.mark.skipif(os.geteuid() != 0, reason="creating network namespaces needs root")
def test_each_rank_runs_on_its_own_host_and_talks_over_the_links():
    """The venv's MPI (Open MPI's rsh agent or Hydra's ssh launcher) starts rank i in namespace i over TCP."""
    with EmulatedHosts(2, LinkShape(None), net=249) as hosts:
        before = hosts.counters()
        command = e2e_bench._mpirun(hosts, 2, [sys.executable, "-c", _RANK_SCRIPT], {})
        result = e2e_bench._run(command, {}, timeout=120)
        after = hosts.counters()
    assert result.returncode == 0, result.stdout + result.stderr
    seen = [json.loads(line[len("ranks saw "):]) for line in result.stdout.splitlines() if line.startswith("ranks saw ")]
    # each rank on its own host's address; the allreduce summed both; MPI sees one rank per host
    assert seen == [[["10.201.249.11", 3, 1], ["10.201.249.12", 3, 1]]]
    assert all(a["sent"] - b["sent"] > 1 << 20 for a, b in zip(after, before))  # 2 MB arrays crossed the links


def test_bandwidths_are_tc_rates_or_none():
    assert _bandwidth("1gbit") == "1gbit" and _bandwidth("100Mbit") == "100mbit" and _bandwidth("none") is None
    with pytest.raises(Exception, match="expected a rate"):
        _bandwidth("fast")


def test_link_counters_leave_out_loopback(tmp_path):
    dev = tmp_path / "dev"
    dev.write_text("Inter-|   Receive ...\n face |bytes ...\n"
                   "    lo: 500 5 0 0 0 0 0 0 500 5 0 0 0 0 0 0\n"
                   "  eth0: 1000 10 0 0 0 0 0 0 250 3 0 0 0 0 0 0\n")
    assert link_bytes(str(dev)) == {"sent": 250, "received": 1000}
    assert link_bytes(str(tmp_path / "missing")) == {"sent": 0, "received": 0}


def _summary(throughput, pull_rows, push_rows, sent):
    row_bytes = 512
    return {"throughput": throughput, "iterations": 10, "transport": "packed",
            "evaluation": {"auc": 0.7}, "iteration_ms": {"pull": 1.0},
            "transmissions": {"rows": pull_rows + push_rows, "pull_rows": pull_rows, "push_rows": push_rows,
                              "pull_bytes": pull_rows * row_bytes, "push_bytes": push_rows * row_bytes},
            "ranks": [{"role": "worker", "train_link_bytes": {"sent": s, "received": 0}} for s in sent]
            + [{"role": "ps", "train_link_bytes": {"sent": 0, "received": 0}}],
            "host_bytes": [{"sent": 1, "received": 1}],
            "counted": {"after_warmup": 2, "iterations": 8, "transmissions": 120, "hit_rate": 0.625}}


def test_a_case_splits_the_workers_bytes_into_embedding_and_the_rest_and_plots(tmp_path):
    runs = [_summary(100.0, 100, 50, [60_000, 40_000]), _summary(120.0, 100, 50, [60_000, 40_000])]
    report = e2e_bench.case_report(runs, "1gbit")
    bytes_ = report["bytes_per_iteration"]
    upstream = (50 * 512 + 8 * 150) // 10
    assert bytes_["embedding_payload"] == upstream + 100 * 512 // 10
    assert bytes_["allreduce_and_other"] == 10_000 - upstream
    assert report["samples_per_s"] == 110.0 and report["samples_per_s_runs"] == [100.0, 120.0]
    result = {"movielens-100k": {"vanilla": {**report, "speedup_vs_vanilla": 1.0},
                                 "herald": {**report, "speedup_vs_vanilla": 1.5}}}
    table = e2e_bench.format_table(result)
    assert "movielens-100k  herald" in table
    # rows and bytes: measured over all 10 iterations; the hit rate: after the warm-up, as simulate counts
    assert report["rows_moved"] == 150 and report["measured_over_iterations"] == 10
    assert report["counted"]["transmissions"] == 120
    assert "62.5%" in table and "after the 2 warm-up iterations" in table
    e2e_bench.plot(result, tmp_path / "e2e.png")
    assert (tmp_path / "e2e.png").stat().st_size > 10_000
    json.dumps(result)
