"""Mistakes a user makes, swept across the entry points: each ends in seconds, with one line that says what
to do, no traceback, exit status 1, and nothing left behind that a later command would take as good.

One case per row: the command, the message it must print. Commands run as a user runs them (``hybrid ...``
in a subprocess) from the repository, on small stores made here and damaged on purpose.
"""
import contextlib
import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import mpi_jobs
from hybrid.data.synthetic import synthesize

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "configs" / "w1-smoke.yaml")
TINY = ["model.embedding_dim=4", "train.batch_per_worker=16", "cache.ratio=0.5"]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A good store and copies of it, each damaged one way."""
    root = tmp_path_factory.mktemp("stores")
    synthesize(root / "good", like="criteo-kaggle", rows=1000, scale=0.0005, seed=1)
    for name in ("bad-id", "nan-label", "two-label", "inf-dense", "edited-meta", "truncated"):
        shutil.copytree(root / "good", root / name)
    _damage(root / "bad-id" / "sparse.npy", lambda a: a.__setitem__((11, 3), 10 ** 6))
    _damage(root / "nan-label" / "labels.npy", lambda a: a.__setitem__(5, np.nan))
    _damage(root / "two-label" / "labels.npy", lambda a: a.__setitem__(7, 2))
    _damage(root / "inf-dense" / "dense.npy", lambda a: a.__setitem__((9, 2), np.inf))
    meta = root / "edited-meta" / "meta.json"
    meta.write_text(meta.read_text().replace('"n_samples": 1000', '"n_samples": 999'))
    data = (root / "truncated" / "dense.npy").read_bytes()
    (root / "truncated" / "dense.npy").write_bytes(data[:len(data) // 2])
    (root / "empty").mkdir()
    return root


def _damage(path: Path, change) -> None:
    array = np.load(path, mmap_mode="r+")
    change(array)
    array.flush()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Raw input files of the public formats, each wrong one way."""
    root = tmp_path_factory.mktemp("inputs")
    line = "\t".join(["1"] + [str(i) for i in range(13)] + ["%08x" % i for i in range(26)])
    (root / "binary.txt").write_bytes(bytes(range(256)) * 16)
    (root / "empty.txt").write_bytes(b"")
    (root / "short.txt").write_text("1\t2\t3\n")
    (root / "huge-field.txt").write_text("\t".join(["1"] + ["1"] * 13 + ["x" * 1_000_000] + ["a"] * 25) + "\n")
    (root / "crlf-no-final-newline.txt").write_bytes(((line + "\r\n") * 5 + line).encode())
    (root / "movielens-text.data").write_text("1\t2\t5\t100\n3\tabc\t4\t101\n")
    (root / "movielens-header.data").write_text("user_id\titem_id\trating\ttimestamp\n1\t2\t5\t100\n")
    (root / "evil.yaml").write_text(f'name: x\nseed: !!python/object/apply:os.system ["touch {root}/pwned"]\n')
    (root / "broken.yaml").write_text("name: [unclosed\n")
    (root / "typo.yaml").write_text("train:\n  embeding_lr: 3\n")
    (root / "not-a-model.pt").write_bytes(b"garbage")
    return root


# Commands whose refusal is checked in this process, through the console script's own function: the
# status ``main`` returns is the process's exit status (hybrid/__main__.py). A process each would cost
# about a second of start-up per case. Commands that write stores (they take SIGTERM), or that start
# MPI, or whose refusal depends on the process (mpirun, signals) run as real processes;
# test_a_refusal_in_a_real_process_is_the_same_as_here checks that both ways agree.
IN_PROCESS = {("config",), ("simulate",), ("fae",), ("compare",), ("plot",), ("plan-shards",), ("evaluate",),
              ("bench", "report"), ("shard-costs", "train")}


def _run(*args: str, timeout: float = 60, here: bool = True) -> tuple[int, float, str]:
    """``hybrid ARGS`` as a user runs it: (exit status, seconds, stdout + stderr)."""
    if here and (args[:1] in IN_PROCESS or args[:2] in IN_PROCESS):
        return _run_here(args)
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "hybrid", *args], cwd=ROOT, capture_output=True, text=True,
                            timeout=timeout, env=dict(os.environ))
    return result.returncode, time.monotonic() - start, result.stdout + result.stderr


def _run_here(args: tuple) -> tuple[int, float, str]:
    """``hybrid ARGS`` through ``hybrid.cli.main`` in this process, from the repository as a user runs it; an
    exception that escapes it fails the test with its traceback, as it would print one."""
    from hybrid.cli import main

    output, start, cwd = io.StringIO(), time.monotonic(), os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            try:
                status = main(list(args))
            except SystemExit as stop:  # argparse's usage errors; SystemExit("message"), printed as Python does
                status = stop.code if isinstance(stop.code, int) else 1
                if isinstance(stop.code, str):
                    print(stop.code, file=output)
    finally:
        os.chdir(cwd)
    return status, time.monotonic() - start, output.getvalue()


def _assert_refused(args: tuple, message: str) -> None:
    status, seconds, output = _run(*args)
    assert status == 1, f"exit {status}: {output[-2000:]}"
    assert message in output, output[-2000:]
    assert "Traceback" not in output, output[-3000:]
    assert len(output) < 4000, f"{len(output)} characters of output"  # a message, not a dump
    assert seconds < 30


CONFIGS = {
    "unknown key": (("config", SMOKE, "train.lrr=0.1"), "override train.lrr: Key 'lrr' not in 'TrainConfig'"),
    "wrong type": (("config", SMOKE, "train.batch_per_worker=abc"), "could not be converted to Integer"),
    "negative lr": (("config", SMOKE, "train.embedding_lr=-1"), "train.embedding_lr: must be > 0, got -1.0"),
    "NaN lr": (("config", SMOKE, "train.dense_lr=nan"), "train.dense_lr: must be a finite number"),
    "inf lr": (("config", SMOKE, "train.embedding_lr=inf"), "train.embedding_lr: must be a finite number"),
    "cache ratio 0": (("config", SMOKE, "cache.ratio=0"), "cache.ratio: must be in (0, 1], got 0.0"),
    "cache ratio 1.5": (("config", SMOKE, "cache.ratio=1.5"), "cache.ratio: must be in (0, 1], got 1.5"),
    "unknown model": (("config", SMOKE, "model.name=bert"), "Invalid value 'bert', expected one of"),
    "unknown mode": (("config", SMOKE, "scheduler.mode=fast"),
                     "scheduler.mode=fast is not a mode; the modes are vanilla, laia, plan, herald, het, fae"),
    "embedding_dim 0": (("config", SMOKE, "model.embedding_dim=0"), "model.embedding_dim: must be >= 1, got 0"),
    "no such config": (("config", "configs/nothing.yaml"), "config file configs/nothing.yaml does not exist"),
    "override without =": (("config", SMOKE, "train.embedding_lr"), "is not of the form key=value"),
}


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_a_bad_config_is_refused_naming_the_key(case):
    _assert_refused(*CONFIGS[case])


def test_a_setting_the_mode_does_not_take_is_refused_naming_the_mode_that_does(stores):
    _assert_refused(("simulate", "--config", SMOKE, f"data.path={stores / 'good'}", *TINY, "scheduler.staleness=3"),
                    "scheduler.staleness=3 applies to mode het only; use scheduler.staleness=0 with mode vanilla")


@pytest.mark.parametrize("name,message", [
    ("evil.yaml", "not a valid config: line 2: could not determine a constructor for the tag"),
    ("broken.yaml", "not a valid config: line 2: did not find expected ',' or ']'"),
    ("typo.yaml", "train.embeding_lr: Key 'embeding_lr' not in 'TrainConfig'. Did you mean one of: 'embedding_lr'"),
])
def test_a_yaml_that_is_broken_or_would_run_code_is_refused_and_runs_nothing(inputs, name, message):
    _assert_refused(("config", str(inputs / name)), message)
    assert not (inputs / "pwned").exists()


STORES = {
    "bad-id": "sample 11 has id 1000000 in table C4, outside [0,",
    "edited-meta": "was changed after the store was written",
    "truncated": "dense.npy: cannot be read (mmap length is greater than file size); the file is missing or truncated",
    "empty": "is not a store (no meta.json); create one with 'hybrid synth' or 'hybrid preprocess'",
    "missing": "is not a store (no meta.json)",
}


@pytest.mark.parametrize("command", ["simulate", "fae"])
@pytest.mark.parametrize("store", sorted(STORES))
def test_a_damaged_or_missing_store_is_refused_by_every_command_that_reads_it(stores, command, store):
    args = ("simulate", "--config", SMOKE) if command == "simulate" else ("fae", SMOKE)
    _assert_refused((*args, f"data.path={stores / store}", *TINY), STORES[store])


def test_values_training_would_choke_on_are_named_with_their_sample(stores):
    from hybrid.data.store import BatchStore, StoreError

    BatchStore(stores / "good").check_values()
    for store, message in (("nan-label", "sample 5 has a label that is not 0 or 1"),
                           ("two-label", "sample 7 has a label that is not 0 or 1"),
                           ("inf-dense", "sample 9 has a dense feature that is not finite")):
        with pytest.raises(StoreError, match=message):
            BatchStore(stores / store).check_values()


PREPROCESS = {
    "binary.txt": ("criteo", "not a text file (binary data in its first 4096 bytes)"),
    "empty.txt": ("criteo", "empty.txt: empty file"),
    "short.txt": ("criteo", "short.txt:1: expected 40 columns, found 3"),
    "huge-field.txt": ("criteo", "... (1000000 characters)"),
    "movielens-text.data": ("movielens", "movielens-text.data:2: column item: invalid value 'abc'"),
    "crlf-no-final-newline.txt": ("avazu", "expected the header 'id,click,hour,"),
    "movielens-header.data": ("movielens", "movielens-header.data:1: column user: invalid value 'user_id' (a header "
                                           "line? movielens files have none: remove it"),
}


@pytest.mark.parametrize("name", sorted(PREPROCESS))
def test_a_bad_input_file_is_refused_with_its_line_and_leaves_no_store(inputs, tmp_path, name):
    fmt, message = PREPROCESS[name]
    _assert_refused(("preprocess", "--format", fmt, "--out", str(tmp_path / "store"), str(inputs / name)), message)
    assert not (tmp_path / "store").exists()


def test_crlf_lines_and_a_last_line_without_newline_are_read(inputs, tmp_path):
    status, _, output = _run("preprocess", "--format", "criteo", "--out", str(tmp_path / "store"),
                             str(inputs / "crlf-no-final-newline.txt"))
    assert status == 0 and "6 samples" in output, output


@pytest.mark.parametrize("model,message", [
    ("not-a-model.pt", "is not a cost-model file (torch.load: UnpicklingError); make one with"),
    ("nothing.pt", "No such file or directory"),
])
def test_a_cost_model_that_is_not_one_is_refused_without_torchs_unsafe_advice(stores, inputs, tmp_path, model,
                                                                              message):
    _assert_refused(("plan-shards", SMOKE, f"data.path={stores / 'good'}", "--planner", "neuroshard",
                     "--cost-model", str(inputs / model), "--out", str(tmp_path / "plan.json")), message)
    assert not (tmp_path / "plan.json").exists()
    assert "weights_only" not in _run("plan-shards", SMOKE, f"data.path={stores / 'good'}", "--planner",
                                      "neuroshard", "--cost-model", str(inputs / model))[2]


ENTRY_POINTS = {
    "a store where none can be written": (("synth", "--like", "criteo-kaggle", "--rows", "10", "--out",
                                           "/proc/store"), "cannot create the store /proc/store: "),
    "a results directory with no results": (("bench", "report", "--out", "{tmp}/typo", "--readme", "{tmp}/page.md"),
                                            "typo: no suite results"),
    "cost data that is not": (("shard-costs", "train", "{inputs}/short.txt"), "short.txt: not sharding cost data"),
    "a bench that needs mpirun": (("bench", "ps"), "needs 2 ranks (a worker and a PS): launch/mpirun.sh -n 2"),
    "sharding costs without mpirun": (("shard-costs", "collect"), "needs 1 worker + at least 2 PS ranks"),
    "a summary that is not there": (("compare", "{tmp}/none.json"), "none.json: not a training summary"),
    "curves of a summary that is not there": (("plot", "{tmp}/none.json", "--out", "{tmp}/c.png"),
                                              "none.json: not a training summary"),
    "epochs and iterations both": (("simulate", "--config", SMOKE, "train.epochs=2", "train.iterations=5"),
                                   "set train.epochs or train.iterations, not both"),
    "a validation split that leaves nothing to train": (("simulate", "--config", SMOKE,
                                                         "data.validation_fraction=0.95"),
                                                        "data.validation_fraction: must be >= 0 and leave samples"),
}


@pytest.mark.parametrize("case", sorted(ENTRY_POINTS))
def test_the_other_entry_points_refuse_in_one_line_and_write_nothing(inputs, tmp_path, case):
    from hybrid.bench.results_report import BEGIN, END

    page = f"{BEGIN}\ntables\n{END}\n"
    (tmp_path / "page.md").write_text(page)
    args, message = ENTRY_POINTS[case]
    _assert_refused(tuple(a.format(tmp=tmp_path, inputs=inputs) for a in args), message)
    assert (tmp_path / "page.md").read_text() == page and sorted(p.name for p in tmp_path.iterdir()) == ["page.md"]


@pytest.mark.parametrize("args,message", [
    ((), "usage: launch/train.sh"),
    (("configs/nothing.yaml",), "config file configs/nothing.yaml does not exist"),
    (("configs/w1-smoke.yaml", "train.lrr=1"), "override train.lrr: Key 'lrr' not in 'TrainConfig'"),
    (("--bogus", "configs/w1-smoke.yaml"), "launch/train.sh: unknown option --bogus (see --help)"),
    (("--workers-on", "a:1", "configs/w1-smoke.yaml"), "give both --workers-on and --ps-on"),
], ids=["no config", "missing config", "unknown key", "unknown option", "half a host layout"])
def test_the_launcher_refuses_before_starting_any_rank(args, message):
    start = time.monotonic()
    result = subprocess.run(["bash", "launch/train.sh", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode in (1, 2) and message in output, output
    assert "mpirun" not in output and "Traceback" not in output and time.monotonic() - start < 30, output


def test_evaluating_a_missing_model_is_one_line(stores, tmp_path):
    _assert_refused(("evaluate", str(tmp_path / "nothing.pt"), str(stores / "good")), "No such file or directory")


def _train(*args: str) -> tuple[int, float, str]:
    """``hybrid train`` on 2 ranks (1 worker + 1 PS, unless ``args`` say otherwise): (status, seconds, output)."""
    start = time.monotonic()
    command = [sys.executable, "-m", "hybrid", "train", SMOKE, "cluster.workers=1", "cluster.ps=1", *TINY,
               "train.iterations=5", "--no-progress", *args]
    result = subprocess.run(mpi_jobs.launcher(2) + command,
                            cwd=ROOT, capture_output=True, text=True, timeout=120, env=dict(os.environ))
    return result.returncode, time.monotonic() - start, result.stdout + result.stderr


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    root = tmp_path_factory.mktemp("plans")
    (root / "malformed.json").write_text('{"n_rows": 17311, "n_shards": 1, "segments": [')
    (root / "huge.json").write_text('{"n_rows": 1000000000000000000, "n_shards": 1, "segments": []}')
    (root / "gap.json").write_text('{"n_rows": 17311, "n_shards": 1, "segments": [{"shard": 0, "lo": 0, "hi": 100}]}')
    return root


@pytest.mark.job  # 2-rank mpirun jobs
@pytest.mark.parametrize("case,args,message", [
    ("a NaN label", ("data.path={stores}/nan-label",), "sample 5 has a label that is not 0 or 1"),
    ("an inf dense feature", ("data.path={stores}/inf-dense",), "sample 9 has a dense feature that is not finite"),
    ("a malformed shard plan", ("data.path={stores}/good", "cluster.shard_plan={plans}/malformed.json"),
     "malformed.json: not a shard plan"),
    ("a plan of 1e18 rows", ("data.path={stores}/good", "cluster.shard_plan={plans}/huge.json"),
     "plans 1000000000000000000 rows on 1 PS ranks; this run has"),
    ("a plan that leaves rows out", ("data.path={stores}/good", "cluster.shard_plan={plans}/gap.json"),
     "cluster.shard_plan:"),
    ("a config of more ranks than started", ("data.path={stores}/good", "cluster.workers=2"),
     "cluster.workers=2 + cluster.ps=1 = 3 ranks, but 2 were started; launch with -n 3"),
])
def test_training_refuses_bad_data_plans_and_rank_counts_on_every_rank_at_start_up(stores, plans, case, args,
                                                                                  message):
    status, seconds, output = _train(*(a.format(stores=stores, plans=plans) for a in args))
    assert status != 0 and message in output, output[-3000:]
    assert "Traceback" not in output and seconds < 60, output[-3000:]
    # the ranks agree on it: one line naming both, and no abort (hybrid.cli.train._refused_together)
    said = [line for line in output.splitlines() if line.startswith("hybrid train: error on")]
    assert len(said) == 1 and said[0].startswith("hybrid train: error on ranks 0-1 of 2 (") and message in said[0], \
        output[-3000:]
    assert "MPI_ABORT" not in output and "ORTE_ERROR_LOG" not in output and "ending every rank" not in output, \
        output[-3000:]


@pytest.mark.parametrize("args", [("config", SMOKE, "train.lrr=0.1"), ("config", "configs/nothing.yaml"),
                                  ("compare", "/nonexistent/none.json")], ids=["unknown key", "no file", "compare"])
def test_a_refusal_in_a_real_process_is_the_same_as_here(args):
    here, there = _run(*args), _run(*args, here=False)
    assert here[0] == there[0] == 1 and here[2] == there[2], (here, there)
