"""``hybrid preprocess`` in parts: one store whatever the part size and the processes, resumable, exact with bad lines.

The reference is a plain Python reading of the same lines (count each
categorical value, order by count then value), so an error that every
process count shares still fails here.
"""
import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from hybrid._ext.text_columns import KINDS, StringDictionary, check_column, log1p_ints
from hybrid.cli import main
from hybrid.data.criteo_text import write_criteo_text
from hybrid.data.formats import CRITEO, FormatError, _HEX, _INT, _UINT, line_at, split_ranges, string_buffers, text_array
from hybrid.data.preprocess import FIRST_VALUE_ID, MISSING_ID, RARE_ID, preprocess, read_vocabulary, work_dir
from hybrid.data.store import BatchStore
from hybrid.data.task_pool import TaskPool

LINES = 4000


@pytest.fixture(scope="module")
def criteo_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("criteo") / "day_0"
    write_criteo_text(path, lines=LINES, scale=0.002, seed=3)
    return path


def _reference_ids(lines: list[str], min_count: int) -> np.ndarray:
    """Each categorical value's id as the docs define it, from the text alone."""
    fields = [line.split("\t") for line in lines]
    ids = np.zeros((len(fields), 26), dtype=np.int32)
    for t in range(26):
        column = [f[14 + t] for f in fields]
        counts = collections.Counter(v for v in column if v)
        vocabulary = sorted((v for v, c in counts.items() if c >= min_count), key=lambda v: (-counts[v], v))
        index = {v: FIRST_VALUE_ID + k for k, v in enumerate(vocabulary)}
        ids[:, t] = [MISSING_ID if not v else index.get(v, RARE_ID) for v in column]
    return ids


def _store(path):
    store = BatchStore(path)
    return store, np.asarray(store.sparse()), np.load(Path(path) / "dense.npy"), np.asarray(store.labels())


@pytest.mark.parametrize("processes, part_bytes", [(1, None), (1, 20_000), (2, 20_000), (3, 7_000)])
def test_the_store_is_the_texts_whatever_the_parts_and_processes(criteo_file, tmp_path, processes, part_bytes):
    facts = {}
    with TaskPool(processes) as pool:
        meta = preprocess([criteo_file], tmp_path / "s", format_name="criteo", min_count=2, pool=pool,
                          part_bytes=part_bytes, facts=facts)
    lines = criteo_file.read_text().splitlines()
    store, sparse, dense, labels = _store(tmp_path / "s")
    assert facts["parts"] == (1 if part_bytes is None else pytest.approx(criteo_file.stat().st_size / part_bytes, abs=1))
    np.testing.assert_array_equal(sparse, _reference_ids(lines, min_count=2))
    np.testing.assert_array_equal(labels, [float(line.split("\t")[0]) for line in lines])
    expected_dense = [[np.float32(np.log1p(max(float(x), 0.0))) if x else 0.0 for x in line.split("\t")[1:14]]
                      for line in lines]
    np.testing.assert_array_equal(dense, np.asarray(expected_dense, dtype=np.float32))
    assert meta["fingerprint"] == store.fingerprint
    assert not work_dir(tmp_path / "s").exists()
    if processes == 1 and part_bytes is None:
        return
    with TaskPool(1) as pool:  # and byte for byte the one-part, one-process store
        single = preprocess([criteo_file], tmp_path / "one", format_name="criteo", min_count=2, pool=pool)
    assert single["fingerprint"] == meta["fingerprint"]
    for table in ("C1", "C3", "C26"):
        assert read_vocabulary(tmp_path / "s", table) == read_vocabulary(tmp_path / "one", table)


def test_several_files_keep_their_order_across_parts(criteo_file, tmp_path):
    lines = criteo_file.read_text().splitlines(keepends=True)
    (tmp_path / "day_0").write_text("".join(lines[:1500]))
    (tmp_path / "day_1").write_text("".join(lines[1500:]))
    with TaskPool(2) as pool:
        meta = preprocess([tmp_path / "day_0", tmp_path / "day_1"], tmp_path / "split", format_name="criteo",
                          pool=pool, part_bytes=50_000)
    whole = preprocess([criteo_file], tmp_path / "whole", format_name="criteo")
    assert meta["fingerprint"] == whole["fingerprint"]


def test_a_header_is_read_once_and_text_columns_stay_text_across_parts(tmp_path):
    """Avazu: its header line heads the first part only; its columns are free text (a regex checks none)."""
    header = ("id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,app_category,"
              "device_id,device_ip,device_model,device_type,device_conn_type,C14,C15,C16,C17,C18,C19,C20,C21")
    rng = np.random.default_rng(1)
    rows = [",".join([str(k), str(k % 2)] + [f"v{rng.integers(0, 40)}\u00e9" for _ in range(22)]) for k in range(2000)]
    (tmp_path / "train.csv").write_text(header + "\n" + "\n".join(rows) + "\n")
    with TaskPool(3) as pool:
        meta = preprocess([tmp_path / "train.csv"], tmp_path / "s", format_name="avazu", pool=pool, part_bytes=9000)
    assert meta["n_samples"] == 2000
    assert meta["fingerprint"] == preprocess([tmp_path / "train.csv"], tmp_path / "one",
                                             format_name="avazu")["fingerprint"]
    site = read_vocabulary(tmp_path / "s", "site_id")
    assert [site[i] for i in BatchStore(tmp_path / "s").sparse()[:, 3]] == [r.split(",")[5] for r in rows]


def test_time_order_spans_parts_and_processes(tmp_path):
    """MovieLens rows sorted by timestamp (ties in file order) whichever part and process read them."""
    rng = np.random.default_rng(0)
    times = rng.integers(1000, 1100, size=3000)  # many ties
    lines = [f"{u}\t{i}\t{r}\t{t}" for u, i, r, t in zip(rng.integers(1, 200, 3000), rng.integers(1, 300, 3000),
                                                       rng.integers(1, 6, 3000), times)]
    (tmp_path / "u.data").write_text("\n".join(lines) + "\n")
    with TaskPool(2) as pool:
        meta = preprocess([tmp_path / "u.data"], tmp_path / "s", format_name="movielens", pool=pool,
                          part_bytes=2000)
    assert meta["fingerprint"] == preprocess([tmp_path / "u.data"], tmp_path / "one",
                                             format_name="movielens")["fingerprint"]
    users = read_vocabulary(tmp_path / "s", "user")
    order = np.argsort(times, kind="stable")
    stored = [users[i] for i in BatchStore(tmp_path / "s").sparse()[:, 0]]
    assert stored == [lines[k].split("\t")[0] for k in order]


def _interrupt_after(parts_done: int):
    """A scan that is interrupted (as by Ctrl-C) when it reaches part ``parts_done``."""
    from hybrid.data import preprocess as module

    scan = module.scan_part

    def scan_part(job):
        if job[0].index == parts_done:
            raise KeyboardInterrupt
        return scan(job)
    return scan_part


def test_an_interrupted_run_resumes_from_its_finished_parts(criteo_file, tmp_path, monkeypatch):
    out = tmp_path / "s"
    monkeypatch.setattr("hybrid.data.preprocess.scan_part", _interrupt_after(3))
    with pytest.raises(KeyboardInterrupt):
        preprocess([criteo_file], out, format_name="criteo", part_bytes=40_000)
    assert not out.exists() and len(list(work_dir(out).glob("part-*"))) == 3
    monkeypatch.undo()
    facts = {}
    meta = preprocess([criteo_file], out, format_name="criteo", part_bytes=40_000, facts=facts)
    assert facts["resumed_parts"] == 3 and facts["parts"] > 3
    assert meta["fingerprint"] == preprocess([criteo_file], tmp_path / "once", format_name="criteo")["fingerprint"]
    assert not work_dir(out).exists()


def test_a_changed_input_is_scanned_again(criteo_file, tmp_path, monkeypatch):
    data = tmp_path / "day_0"
    data.write_bytes(criteo_file.read_bytes())
    monkeypatch.setattr("hybrid.data.preprocess.scan_part", _interrupt_after(2))
    with pytest.raises(KeyboardInterrupt):
        preprocess([data], tmp_path / "s", format_name="criteo", part_bytes=40_000)
    monkeypatch.undo()
    text = data.read_text()
    data.write_text(("1" if text[0] == "0" else "0") + text[1:])  # same size and lines, another label and time
    facts = {}
    meta = preprocess([data], tmp_path / "s", format_name="criteo", part_bytes=40_000, facts=facts)
    assert facts["resumed_parts"] == 0
    assert meta["fingerprint"] == preprocess([data], tmp_path / "fresh", format_name="criteo")["fingerprint"]


@pytest.mark.parametrize("stop", ["SIGKILL to the command", "SIGTERM to every process"])
def test_a_stopped_cli_run_resumes(criteo_file, tmp_path, stop):
    """Stopped in the middle of the scan: killed (no handler runs), or terminated as a preemption terminates
    every process of a job (the workers die quietly, the command reports once); the rerun takes up the
    parts on disk."""
    big = tmp_path / "day_0"
    with open(big, "wb") as f:
        for _ in range(12):
            f.write(criteo_file.read_bytes())
    out = tmp_path / "s"
    command = [sys.executable, "-m", "hybrid", "preprocess", "--format", "criteo", "--processes", "2",
               "--part-mb", "0.05", "--out", str(out), str(big)]
    run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    deadline = time.monotonic() + 60
    while len(list(work_dir(out).glob("part-*"))) < 3 and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    if stop.startswith("SIGKILL"):
        run.send_signal(signal.SIGKILL)
    else:
        os.killpg(run.pid, signal.SIGTERM)
    stderr = run.communicate(timeout=60)[1]
    finished = len(list(work_dir(out).glob("part-*")))
    assert finished >= 3 and not out.exists(), "the run ended before it could be stopped mid-scan"
    if stop.startswith("SIGTERM"):
        assert run.returncode == 130 and "Traceback" not in stderr, stderr
        assert stderr.count("interrupted (SIGTERM)") == 1 and "the parts it finished stay" in stderr
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"resumed: {finished} of " in done.stderr
    assert BatchStore(out).fingerprint == preprocess([big], tmp_path / "once", format_name="criteo")["fingerprint"]


CRITEO_OK = "\t".join(["1"] + ["3"] * 13 + ["a1b2c3d4"] * 26)


def _file_with_bad_lines(tmp_path):
    """300 good lines and four bad ones (wrong column count, bad value, empty line, bad label), spread over parts."""
    lines = [CRITEO_OK.replace("a1b2c3d4", f"{i:08x}", 1) for i in range(300)]
    bad = {40: "1\t2\t3", 120: CRITEO_OK.replace("\t3\t", "\tthree\t", 1), 200: "", 260: "7" + CRITEO_OK[1:]}
    for at, line in sorted(bad.items()):
        lines.insert(at, line)
    path = tmp_path / "day_0"
    path.write_text("\n".join(lines) + "\n")
    return path, [at + 1 for at in sorted(bad)]


@pytest.mark.parametrize("part_bytes", [None, 3000])
def test_bad_lines_are_named_or_skipped_and_counted(tmp_path, part_bytes):
    path, bad_lines = _file_with_bad_lines(tmp_path)
    with pytest.raises(FormatError, match=f"day_0:{bad_lines[0]}: expected 40 columns, found 3"):
        preprocess([path], tmp_path / "s", format_name="criteo", part_bytes=part_bytes)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["day_0"]
    facts = {}
    with TaskPool(2) as pool:
        meta = preprocess([path], tmp_path / "s", format_name="criteo", part_bytes=part_bytes, skip_bad_lines=True,
                          pool=pool, facts=facts)
    assert [line for _, line in facts["skipped"]] == bad_lines
    assert meta["n_samples"] == 300 and meta["source"]["skipped_lines"] == 4
    first_column = read_vocabulary(tmp_path / "s", "C1")
    assert sorted(first_column[i] for i in BatchStore(tmp_path / "s").sparse()[:, 0]) == [f"{i:08x}" for i in range(300)]


def test_empty_columns_and_parts_with_nothing_left_are_fine(tmp_path):
    """A table whose values are all missing, and parts whose every line is bad (skipped)."""
    good = "\t".join(["0"] + [""] * 13 + ["a1b2c3d4"] * 25 + [""])
    lines = [good] * 100 + ["1\t2"] * 300 + [good] * 100
    (tmp_path / "day_0").write_text("\n".join(lines) + "\n")
    facts = {}
    with TaskPool(2) as pool:
        meta = preprocess([tmp_path / "day_0"], tmp_path / "s", format_name="criteo", part_bytes=500,
                          skip_bad_lines=True, pool=pool, facts=facts)
    assert facts["parts"] > 10 and len(facts["skipped"]) == 300 and meta["n_samples"] == 200
    store, sparse, dense, _ = _store(tmp_path / "s")
    assert store.cardinalities[-1] == FIRST_VALUE_ID and (sparse[:, -1] == MISSING_ID).all()
    assert (sparse[:, 0] == FIRST_VALUE_ID).all() and (dense == 0).all()


def test_a_bad_value_deep_in_a_later_part_is_named_by_its_line(tmp_path):
    lines = [CRITEO_OK] * 999 + [CRITEO_OK.replace("a1b2c3d4", "nothex!", 1)]
    (tmp_path / "day_0").write_text("\n".join(lines) + "\n")
    with pytest.raises(FormatError, match="day_0:1000: column C1: invalid value 'nothex!'"):
        with TaskPool(2) as pool:
            preprocess([tmp_path / "day_0"], tmp_path / "out", format_name="criteo", part_bytes=10_000, pool=pool)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["day_0"]


def test_cli_options_are_checked_and_the_run_is_reported(criteo_file, tmp_path, capsys):
    assert main(["preprocess", "--format", "criteo", "--processes", "0", "--out", str(tmp_path / "s"),
                 str(criteo_file)]) != 0
    assert "--processes must be >= 1" in capsys.readouterr().err
    assert main(["preprocess", "--format", "criteo", "--processes", "2", "--part-mb", "0.1", "--out",
                 str(tmp_path / "s"), str(criteo_file)]) == 0
    captured = capsys.readouterr()
    assert f"preprocessed {LINES} lines in " in captured.err and "on 2 processes" in captured.err
    assert f"wrote {tmp_path / 's'}: {LINES} samples" in captured.out


@settings(max_examples=60, deadline=None)
@given(text=st.lists(st.text(alphabet="ab\t\n", max_size=12), min_size=1, max_size=30).map("".join),
       part_bytes=st.integers(1, 40))
def test_ranges_cover_the_file_and_start_at_lines(tmp_path_factory, text, part_bytes):
    path = tmp_path_factory.mktemp("ranges") / "f"
    path.write_bytes(text.encode())
    ranges = split_ranges(path, CRITEO, part_bytes)
    data = path.read_bytes()
    if ranges == [(0, -1)]:
        assert len(data) <= part_bytes
        return
    assert ranges[0][0] == 0 and ranges[-1][1] == len(data)
    for (_, end), (start, _) in zip(ranges, ranges[1:]):
        assert end == start and data[start - 1:start] == b"\n"
        assert line_at(path, start) == data[:start].count(b"\n") + 1


PATTERNS = {"hex": _HEX, "uint": _UINT, "int": _INT, "bit": r"^[01]$"}


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.text(alphabet="01-9aFg ", max_size=4), min_size=1, max_size=20),
       kind=st.sampled_from(sorted(PATTERNS)), allow_empty=st.booleans())
@example(values=["", "00"], kind="bit", allow_empty=False)  # 2 bytes for 2 values, yet neither is a bit
def test_the_check_kernels_accept_exactly_their_patterns(values, kind, allow_empty):
    import re

    column = text_array(values, pytest.importorskip("pyarrow").binary())
    ok = np.empty(len(values), dtype=np.uint8)
    first = check_column(*string_buffers(column), KINDS[kind], allow_empty, ok)
    expected = [bool(re.search(PATTERNS[kind], v)) or (allow_empty and v == "") for v in values]
    assert ok.view(bool).tolist() == expected
    assert first == (expected.index(False) if False in expected else -1)


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.one_of(st.just(""), st.integers(-10**6, 10**12).map(str)), min_size=1, max_size=30))
def test_log1p_ints_is_numpys(values):
    out = np.empty(len(values), dtype=np.float32)
    log1p_ints(*string_buffers(text_array(values)), out)
    expected = np.asarray([np.log1p(max(float(v), 0.0)) if v else 0.0 for v in values], dtype=np.float32)
    np.testing.assert_array_equal(out, expected)


@settings(max_examples=100, deadline=None)
@given(parts=st.lists(st.lists(st.text(alphabet="abc\u00e9", max_size=10), max_size=40), min_size=1, max_size=4))
def test_dictionaries_number_first_seen_and_merge_with_counts(parts):
    merged, expected_counts = StringDictionary(), collections.Counter()
    for values in parts:
        part = StringDictionary()
        ids = np.empty(len(values), dtype=np.int32)
        part.encode(*string_buffers(text_array(values)), ids)
        first_seen = list(dict.fromkeys(values))
        assert ids.tolist() == [first_seen.index(v) for v in values]
        offsets, data, counts = part.arrays()
        into = np.empty(part.size, dtype=np.int32)
        merged.add(offsets, data, counts, into)
        expected_counts.update(values)
    offsets, data, counts = merged.arrays()
    found = {bytes(data[offsets[k]:offsets[k + 1]]).decode(): int(counts[k]) for k in range(merged.size)}
    assert found == dict(expected_counts)
    assert list(found) == list(dict.fromkeys(v for values in parts for v in values))


def test_the_run_never_imports_pandas(criteo_file, tmp_path):
    """pyarrow imports pandas for ``pa.array`` and ``to_numpy``: a fifth of a second in every worker."""
    code = ("import sys\nfrom hybrid.data.preprocess import preprocess\n"
            f"preprocess([{str(criteo_file)!r}], {str(tmp_path / 's')!r}, format_name='criteo', part_bytes=50_000)\n"
            "print('pandas' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
