"""``launch/gpu_check.sh``: the plan fits a GPU host's command, and a stage that fails or overruns costs only itself.

The whole check runs here as ``--rehearse`` in ``launch/test.sh``; these
tests pin the runner's rules with stages made up for them.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybrid.bench import gpu_check
from hybrid.bench.gpu_check import Context, Stage, StageFailed

SCRIPT = Path(__file__).resolve().parents[3] / "launch" / "gpu_check.sh"


def test_the_plan_fits_in_nine_minutes_and_names_every_stage():
    result = subprocess.run(["bash", str(SCRIPT), "--plan"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    marks = [int(line.split()[3]) for line in lines[2:]]
    assert [line.split()[0] for line in lines[2:]] == ["setup", "train", "exactness", "e2e", "horovod", "cores"]
    assert marks == sorted(marks) and marks[-1] == sum(s.budget_s for s in gpu_check.STAGES) <= 540


def _context(tmp_path: Path) -> Context:
    ctx = Context(out=tmp_path / "out", work=tmp_path / "work", venv=Path(sys.prefix), wheels=tmp_path / "wheels",
                  rehearse=True)
    ctx.out.mkdir()
    ctx.work.mkdir()
    ctx.env = {"PATH": os.environ["PATH"]}
    return ctx


@pytest.mark.job
def test_a_stage_that_fails_or_overruns_costs_only_itself(tmp_path):
    def fine(ctx, result):
        result["figure"] = 1
        return ["fine"]

    def fails(ctx, result):
        ctx.run(["bash", "-c", "echo progress; echo why it failed >&2; exit 3"])
        return ["never"]

    def crashes(ctx, result):
        raise KeyError("a surprise of the host")

    def overruns(ctx, result):
        result["before"] = "kept"
        ctx.run(["bash", "-c", f"echo $$ > {ctx.work / 'pid'}; exec sleep 60"])
        return ["never"]

    def after(ctx, result):
        before = json.loads((ctx.out / "summary.json").read_text())  # written after every stage
        return [" ".join(r["status"] for r in before["stages"])]

    stages = (Stage("fine", 2, "", fine), Stage("fails", 2, "", fails), Stage("crashes", 2, "", crashes),
              Stage("overruns", 1, "", overruns), Stage("after", 5, "", after))
    ctx = _context(tmp_path)
    began = time.monotonic()
    records = gpu_check.run_stages(ctx, stages)
    assert time.monotonic() - began < 12  # the sleep was stopped at its stage's mark (7 s), not waited out
    assert [r["status"] for r in records] == ["ran", "failed", "failed", "out of time", "ran"]
    assert records[1]["error"].endswith("exit 3: bash -c echo progress; echo why it failed >&2; exit 3\nwhy it failed")
    assert records[2]["error"] == "KeyError: 'a surprise of the host'"
    assert records[3]["result"] == {"before": "kept"}
    assert records[4]["headline"] == ["ran failed failed out of time not run"]
    pid = int((ctx.work / "pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    summary = json.loads((ctx.out / "summary.json").read_text())
    assert [r["status"] for r in summary["stages"]] == [r["status"] for r in records]
    assert summary["stages"][0]["result"] == {"figure": 1}
    text = (ctx.out / "summary.txt").read_text()
    assert "overruns   out of time" in text and "! exit 3" in text
    files = sorted(p.name for p in ctx.out.iterdir())
    assert files == ["after.log", "crashes.log", "fails.log", "fine.log", "overruns.log", "summary.json",
                     "summary.txt"]
    assert "progress\nwhy it failed\n" in (ctx.out / "fails.log").read_text()


def test_a_stage_may_use_what_earlier_stages_left_but_ends_by_its_mark(tmp_path):
    def quick(ctx, result):
        return []

    def waits(ctx, result):
        result["left"] = round(ctx.left())
        return []

    ctx = _context(tmp_path)
    records = gpu_check.run_stages(ctx, (Stage("quick", 30, "", quick), Stage("waits", 10, "", waits)))
    assert 38 <= records[1]["result"]["left"] <= 40


def test_the_background_build_is_paused_while_a_quiet_stage_measures(tmp_path):
    def state(ctx, wanted: str) -> str:
        """The build's state once it is ``wanted`` (signals arrive a moment after they are sent), or after 5 s."""
        for _ in range(100):
            now = Path(f"/proc/{ctx.horovod_build.pid}/stat").read_text().split(") ")[1][0]
            if now == wanted:
                break
            time.sleep(0.05)
        return now

    def measures(ctx, result):
        return [state(ctx, "T")]

    def after(ctx, result):
        return [state(ctx, "S")]

    ctx = _context(tmp_path)
    ctx.horovod_build = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        records = gpu_check.run_stages(ctx, (Stage("measures", 5, "", measures, quiet=True),
                                             Stage("after", 5, "", after)))
    finally:
        ctx.horovod_build.kill()
    assert records[0]["headline"] == ["T"] and records[1]["headline"] == ["S"]
    assert ctx.horovod_build_paused > 0


def test_the_full_check_returns_at_most_eight_files():
    """A GPU host returns 8 files from its output directory: a log per stage and the two summaries."""
    assert len(gpu_check.STAGES) + 2 <= 8


@pytest.mark.parametrize("line,expected", [
    ("2 passed, 30 skipped, 197 deselected in 5.10s", {"passed": 2, "skipped": 30, "deselected": 197}),
    ("1 failed, 3 passed, 1 error in 9.0s", {"failed": 1, "passed": 3, "errors": 1}),
    ("36 passed in 80.2s", {"passed": 36}),
])
def test_pytest_counts_read_the_last_summary_line(line, expected):
    counts = gpu_check.pytest_counts(f"..s.\nsome output\n{line}\n")
    assert counts == {**dict.fromkeys(("passed", "failed", "skipped", "errors", "deselected"), 0), **expected}


def test_pytest_counts_refuse_output_without_a_result():
    with pytest.raises(StageFailed):
        gpu_check.pytest_counts("ImportError while loading conftest\n")


def test_the_e2e_line_gives_herald_against_vanilla_and_het():
    report = {m: {"samples_per_s": v} for m, v in (("vanilla", 1000.0), ("herald", 1500.0), ("het", 1200.0))}
    assert gpu_check.e2e_line("1gbit", report) == (
        "links 1gbit: samples/s vanilla 1000, herald 1500, het 1200; herald/vanilla 1.50x, het/vanilla 1.20x, "
        "herald/het 1.25x")


def test_the_stand_in_nvidia_smi_lists_one_gpu_and_answers_queries(tmp_path):
    gpu_check.stand_in_nvidia_smi(tmp_path)
    listing = subprocess.run([str(tmp_path / "nvidia-smi"), "-L"], capture_output=True, text=True).stdout
    query = subprocess.run([str(tmp_path / "nvidia-smi"), "--query-gpu=name,memory.total,compute_cap",
                            "--format=csv,noheader"], capture_output=True, text=True).stdout
    assert listing.startswith("GPU 0: ") and len(listing.splitlines()) == 1
    assert query.strip() == "stand-in, stand-in, stand-in"


def test_where_emulated_hosts_fail_the_e2e_cases_train_on_one_host(tmp_path, monkeypatch):
    """The e2e stage's other path: the first link setting fails, so each mode trains once on this host."""
    ctx = _context(tmp_path)
    calls = []

    def run(argv, **kwargs):
        calls.append(argv)
        if argv[3:5] == ["bench", "e2e"]:
            raise StageFailed("exit 1: hybrid bench e2e\nhybrid bench e2e: cannot run here: emulated hosts need tc")
        summary = Path(argv[argv.index("--summary-json") + 1])
        rate = 2000.0 if "scheduler.mode=herald" in argv else 1000.0
        summary.write_text(json.dumps({"throughput": rate, "iterations": 10, "iteration_ms": {"pull": 1.0},
                                       "evaluation": {"auc": 0.7}, "transmissions": {"rows": 50}}))
        return ""

    monkeypatch.setattr(ctx, "run", run)
    result: dict = {}
    lines = gpu_check.stage_e2e(ctx, result)
    assert lines == ["emulated hosts failed: hybrid bench e2e: cannot run here: emulated hosts need tc",
                     "links none (one host, no emulated links): samples/s vanilla 1000, herald 2000; "
                     "herald/vanilla 2.00x"]
    assert result["one_host"]["herald"] == {"samples_per_s": 2000.0, "iteration_ms": {"pull": 1.0}, "auc": 0.7,
                                            "rows_per_iteration": 5.0}
    trained = [argv for argv in calls if argv[:2] == ["bash", "launch/train.sh"]]
    assert len(trained) == 2 and all("model.embedding_dim=512" in argv and "train.device=cpu" in argv
                                     for argv in trained)
