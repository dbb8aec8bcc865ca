"""``hybrid fetch movielens-100k`` without the network: a fake RecBole wheel in the cache dir.

The fake wheel is a zip holding a few ratings at the real member path; the
expected row count and sha256 are those of the fake file. A pip that fails
like an unreachable PyPI stands in for the real one, so no test can download.
"""
import functools
import hashlib
import json
import sys
import zipfile

import pytest

from hybrid.cli import main
from hybrid.data import fetch
from hybrid.data.fetch import WHEEL_MEMBER, FetchError, default_cache_dir, fetch_movielens_100k
from hybrid.data.formats import FormatError
from hybrid.data.preprocess import read_vocabulary
from hybrid.data.store import BatchStore, StoreError

HEADER = "user_id:token\titem_id:token\trating:float\ttimestamp:float"
# user, item, rating, timestamp: not in time order, two ties at t=100 (file order: users 2 then 3)
RATINGS = [("1", "10", "5", "300"), ("2", "10", "3", "100"), ("1", "11", "4", "200"), ("3", "12", "2", "100"),
           ("2", "11", "4.5", "400")]
TEXT = HEADER + "\n" + "".join("\t".join(r) + "\n" for r in RATINGS)
WHEEL_NAME = "recbole-1.2.1-py3-none-any.whl"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """pip fails as it would without PyPI: a test that tries to download sees an error."""
    monkeypatch.setattr(fetch, "PIP", [sys.executable, "-c", "import sys; sys.exit('ERROR: network is unreachable')"])


def _wheel(cache, text=TEXT, member=WHEEL_MEMBER):
    cache.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(cache / WHEEL_NAME, "w") as archive:
        archive.writestr(member, text)
        archive.writestr("recbole/__init__.py", "")
    return cache / WHEEL_NAME


def _sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


def _fetch(tmp_path, rows=len(RATINGS), **kwargs):
    return fetch_movielens_100k(tmp_path / "store", cache_dir=tmp_path / "cache", expected_rows=rows,
                                expected_sha256=_sha(TEXT), **kwargs)


def _users(store_dir):
    vocab = read_vocabulary(store_dir, "user_id")
    return [vocab[i] for i in BatchStore(store_dir).sparse()[:, 0]]


def test_extracts_the_ratings_and_makes_a_time_ordered_store(tmp_path):
    _wheel(tmp_path / "cache")
    stages = []
    meta = _fetch(tmp_path, progress=lambda stage, n, total=None: stages.append(stage))
    assert meta["n_samples"] == 5 and meta["table_names"] == ["user_id", "item_id"]
    assert meta["cardinalities"] == [2 + 3, 2 + 3]
    extracted = tmp_path / "cache" / f"ml-100k-{_sha(TEXT)[:12]}.inter"
    assert extracted.read_text() == TEXT
    assert meta["source"]["files"] == [str(extracted.resolve())] and meta["source"]["time_ordered"]
    assert _users(tmp_path / "store") == ["2", "3", "1", "1", "2"]  # t = 100, 100, 200, 300, 400
    assert list(BatchStore(tmp_path / "store").labels()) == [0.0, 0.0, 1.0, 1.0, 1.0]  # rating >= 4
    assert "download" not in stages and {"extract", "scan", "vocabulary", "write"} <= set(stages)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted([extracted.name, WHEEL_NAME])


def test_an_existing_store_from_the_same_file_is_kept_without_the_cache(tmp_path):
    _wheel(tmp_path / "cache")
    first = _fetch(tmp_path)
    for path in (tmp_path / "cache").iterdir():
        path.unlink()  # a second fetch must not need the wheel, the ratings or the network
    stages = []
    assert _fetch(tmp_path, progress=lambda stage, n, total=None: stages.append(stage)) == first
    assert stages == ["keep"]
    with pytest.raises(FetchError, match="could not download"):
        _fetch(tmp_path, force=True)  # --force rebuilds, so it needs the data again
    assert BatchStore(tmp_path / "store").fingerprint == first["fingerprint"]  # and kept the old store


def test_cached_ratings_are_reused_and_a_damaged_copy_is_extracted_again(tmp_path):
    wheel = _wheel(tmp_path / "cache")
    first = _fetch(tmp_path)
    extracted = tmp_path / "cache" / f"ml-100k-{_sha(TEXT)[:12]}.inter"
    extracted.write_text(TEXT.replace("300", "301"))
    assert _fetch(tmp_path, force=True)["fingerprint"] == first["fingerprint"]
    assert extracted.read_text() == TEXT
    wheel.unlink()
    assert _fetch(tmp_path, force=True)["fingerprint"] == first["fingerprint"]


def test_another_store_at_out_needs_force(tmp_path):
    _wheel(tmp_path / "cache")
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "meta.json").write_text(json.dumps({"source": {"kind": "synthetic"}}))
    with pytest.raises(StoreError, match="pass --force"):
        _fetch(tmp_path)
    assert _fetch(tmp_path, force=True)["n_samples"] == 5


@pytest.mark.parametrize("text, member, rows, message", [
    (TEXT, "recbole/dataset_example/ml-1m/ml-1m.inter", 5, "has no member " + WHEEL_MEMBER),
    (TEXT.replace("rating:float", "rating:token"), WHEEL_MEMBER, 5,
     WHEEL_MEMBER + ":1: expected the header 'user_id:token\\titem_id:token\\trating:float"),
    (TEXT, WHEEL_MEMBER, 100_000, "expected 100000 ratings, found 5"),
    (TEXT.replace("300", "301"), WHEEL_MEMBER, 5, "sha256"),
])
def test_a_wrong_wheel_is_a_clear_error_and_writes_nothing(tmp_path, text, member, rows, message):
    _wheel(tmp_path / "cache", text, member)
    with pytest.raises(FetchError) as info:
        _fetch(tmp_path, rows=rows)
    assert message in str(info.value)
    assert not (tmp_path / "store").exists()
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [WHEEL_NAME]


def test_a_failed_download_says_what_ran_and_what_to_do(tmp_path):
    with pytest.raises(FetchError) as info:
        _fetch(tmp_path)
    message = str(info.value)
    for part in ("could not download recbole==1.2.1", "download --no-deps --only-binary=:all: recbole==1.2.1",
                 "network is unreachable", "reaches PyPI", f"put it into {tmp_path / 'cache'}"):
        assert part in message
    assert list((tmp_path / "cache").iterdir()) == [] and not (tmp_path / "store").exists()


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("HYBRID_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("HYBRID_CACHE_DIR")
    assert default_cache_dir().parts[-3:] == (".cache", "hybrid", "datasets")


def test_cli_fetch_writes_then_keeps(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(fetch.DATASETS, "movielens-100k",
                        functools.partial(fetch_movielens_100k, expected_rows=5, expected_sha256=_sha(TEXT)))
    args = ["fetch", "movielens-100k", "--out", str(tmp_path / "store"), "--cache-dir", str(tmp_path / "cache")]
    assert main(args) == 1  # empty cache, no network
    assert "hybrid fetch: error: could not download" in capsys.readouterr().err
    _wheel(tmp_path / "cache")
    assert main(args) == 0
    assert f"wrote {tmp_path / 'store'}: 5 samples, tables {{'user_id': 5, 'item_id': 5}}, fingerprint" \
        in capsys.readouterr().out
    assert main(args) == 0
    assert f"{tmp_path / 'store'}: store exists, keeping it" in capsys.readouterr().err


def test_inter_files_through_preprocess_movielens(tmp_path, capsys):
    (tmp_path / "ml.inter").write_text(TEXT)
    assert main(["preprocess", "--format", "movielens", "--out", str(tmp_path / "s"), str(tmp_path / "ml.inter")]) == 0
    assert "tables {'user_id': 5, 'item_id': 5}" in capsys.readouterr().out
    assert _users(tmp_path / "s") == ["2", "3", "1", "1", "2"]
    (tmp_path / "ratings").write_text(TEXT)  # recognised by the typed header alone
    assert main(["preprocess", "--format", "movielens", "--out", str(tmp_path / "t"), str(tmp_path / "ratings")]) == 0
    assert _users(tmp_path / "t") == _users(tmp_path / "s")
    (tmp_path / "bad.inter").write_text(TEXT + "4\tx9\t5\t500\n")
    with pytest.raises(FormatError, match=r"bad.inter:7: column item_id: invalid value 'x9'"):
        fetch.preprocess([tmp_path / "bad.inter"], tmp_path / "u", format_name="movielens")
    (tmp_path / "untyped.inter").write_text(TEXT.replace(":token", ""))
    with pytest.raises(FormatError, match=r"untyped.inter:1: expected the header 'user_id:token"):
        fetch.preprocess([tmp_path / "untyped.inter"], tmp_path / "u", format_name="movielens")
