"""``hybrid fetch``: real datasets "in the box", from PyPI.

Why PyPI: the machines this project runs on reach PyPI but often no other
site, so the GroupLens archives are out of reach. RecBole's wheel ships the
real MovieLens-100k ratings, with their timestamps, as an example dataset:
``recbole/dataset_example/ml-100k/ml-100k.inter`` (RecBole's atomic-file
layout: u.data's four tab-separated columns under a typed header
``user_id:token	item_id:token	rating:float	timestamp:float``). pip, the
ordinary client, downloads the wheel (``--no-deps``: nothing is installed);
we read that one zip member and preprocess it like any MovieLens file.

Everything is cached, and checked rather than trusted:

- the wheel, in the cache dir (``$HYBRID_CACHE_DIR``, else
  ``~/.cache/hybrid/datasets``), downloaded only when it is absent;
- the extracted ratings, beside it, named after their sha256 and checked
  (header, row count, sha256 recorded below) whenever they are used, so a
  changed or corrupt file is an error and not a silently different dataset;
- the store: a store at ``out`` made from that same file is kept as it is.
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable, Optional

from hybrid.data.formats import MOVIELENS_INTER
from hybrid.data.preprocess import preprocess
from hybrid.data.store import BatchStore, StoreError

WHEEL_REQUIREMENT = "recbole==1.2.1"
WHEEL_GLOB = "recbole-1.2.1-*.whl"
WHEEL_MEMBER = "recbole/dataset_example/ml-100k/ml-100k.inter"
ML100K_ROWS = 100_000
# sha256 of WHEEL_MEMBER in recbole-1.2.1-py3-none-any.whl (1,979,230 bytes; 100,000 ratings of
# 943 users on 1,682 items): the dataset is pinned, a different file is an error.
ML100K_SHA256 = "4edb74e2a81178c2ba9ff381495f754f996c4aea351b1272ca36b43da0935eff"
RATING_THRESHOLD = 4.0  # label = rating >= 4, as for the other MovieLens files
# How the wheel is fetched; a list so tests can substitute a command that fails without the network.
PIP = [sys.executable, "-m", "pip"]

Progress = Callable[..., None]  # progress(stage, n, total=None)


class FetchError(RuntimeError):
    """A dataset could not be downloaded, or is not the file it should be."""


def default_cache_dir() -> Path:
    """``$HYBRID_CACHE_DIR``, else ``~/.cache/hybrid/datasets``."""
    env = os.environ.get("HYBRID_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hybrid" / "datasets"


def fetch_movielens_100k(out: str | Path, cache_dir: str | Path | None = None, force: bool = False,
                         progress: Optional[Progress] = None, *, expected_rows: int = ML100K_ROWS,
                         expected_sha256: str = ML100K_SHA256) -> dict:
    """Make a store of the real MovieLens-100k at ``out``, in time order; returns its meta.

    A store at ``out`` already made from the same ratings file is kept (nothing is
    downloaded) unless ``force``; any other existing ``out`` needs ``force``.
    ``progress(stage, n, total=None)`` reports ``download`` (n=0, a download
    starts), ``extract`` (n ratings checked), ``keep`` (n samples in the kept
    store), then preprocessing's stages (:func:`hybrid.data.preprocess.preprocess`). ``expected_rows`` and
    ``expected_sha256`` pin the file (tests pass small fakes).
    """
    out = Path(out)
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    report = progress or (lambda stage, n, total=None: None)
    ratings = cache / f"ml-100k-{expected_sha256[:12]}.inter"

    if out.exists() and not force:
        meta = _store_made_from(out, ratings.name, expected_rows)
        if meta is None:
            raise StoreError(f"{out} already exists and is not a store made from {ratings.name}; "
                             f"pass --force to replace it")
        report("keep", meta["n_samples"])
        return meta

    if not _cached_ratings_ok(ratings, expected_rows, expected_sha256):
        wheel = _find_wheel(cache)
        if wheel is None:
            report("download", 0)
            wheel = _download_wheel(cache)
        _extract(wheel, ratings, expected_rows, expected_sha256)
    report("extract", expected_rows)
    return preprocess([ratings.resolve()], out, format_name="movielens", rating_threshold=RATING_THRESHOLD,
                      force=force, progress=progress)


def _store_made_from(out: Path, ratings_name: str, rows: int) -> Optional[dict]:
    """The meta of the store at ``out`` if its source is ``ratings_name`` preprocessed as here."""
    try:
        meta = json.loads((out / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    source = meta.get("source") or {}
    files = source.get("files") or []
    same = (source.get("kind") == "preprocessed" and source.get("format") == "movielens"
            and len(files) == 1 and Path(files[0]).name == ratings_name
            and source.get("min_count") == 1 and source.get("time_ordered") is True
            and source.get("rating_threshold") == RATING_THRESHOLD and meta.get("n_samples") == rows)
    if not same:
        return None
    return BatchStore(out).meta  # raises StoreError if the arrays do not match meta.json


def _cached_ratings_ok(path: Path, rows: int, sha256: str) -> bool:
    """Whether an earlier extraction is there and intact (otherwise it is extracted again)."""
    if not path.is_file():
        return False
    try:
        _check_ratings(path.read_bytes(), str(path), rows, sha256)
    except FetchError:
        return False
    return True


def _find_wheel(cache: Path) -> Optional[Path]:
    wheels = sorted(cache.glob(WHEEL_GLOB))
    return wheels[0] if wheels else None


def _download_wheel(cache: Path) -> Path:
    """pip-download the wheel into ``cache``: into a temporary directory first, then renamed,
    so an interrupted download never leaves a partial wheel that looks cached."""
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".download-", dir=cache))
    command = PIP + ["download", "--no-deps", "--only-binary=:all:", WHEEL_REQUIREMENT, "-d", str(staging)]
    try:
        result = subprocess.run(command, capture_output=True, text=True)
        wheel = _find_wheel(staging)
        if result.returncode != 0 or wheel is None:
            output = (result.stderr.strip() or result.stdout.strip()).splitlines()
            tail = "\n  ".join(output[-5:]) or "(no output)"
            by_hand = " ".join(["pip download --no-deps --only-binary=:all:", WHEEL_REQUIREMENT,
                                "-d", shlex.quote(str(cache))])
            raise FetchError(
                f"could not download {WHEEL_REQUIREMENT} from PyPI (exit status {result.returncode}); ran\n"
                f"  {shlex.join(command)}\nwhich said:\n  {tail}\n"
                f"Check that this machine reaches PyPI (network, proxy, pip's index settings), or download "
                f"the wheel by hand where PyPI is reachable ({by_hand}) and put it into {cache}.")
        target = cache / wheel.name
        os.replace(wheel, target)
        return target
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _extract(wheel: Path, target: Path, rows: int, sha256: str) -> None:
    """Check the ratings member of ``wheel`` and write it to ``target`` atomically (temp file + rename)."""
    label = f"{wheel}:{WHEEL_MEMBER}"
    try:
        with zipfile.ZipFile(wheel) as archive:
            try:
                data = archive.read(WHEEL_MEMBER)  # checks the member's CRC
            except KeyError:
                raise FetchError(f"{wheel} has no member {WHEEL_MEMBER}: it is not the {WHEEL_REQUIREMENT} "
                                 f"wheel; delete it and run again") from None
    except (zipfile.BadZipFile, OSError) as err:
        raise FetchError(f"{wheel}: not a readable wheel ({err}); delete it and run again") from None
    _check_ratings(data, label, rows, sha256)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _check_ratings(data: bytes, label: str, rows: int, sha256: str) -> None:
    """The header, the number of ratings, then the sha256: the first two say what is wrong."""
    lines = data.splitlines()
    expected = MOVIELENS_INTER.header_fields
    found = tuple(lines[0].decode("utf-8", errors="replace").split("\t")) if lines else ()
    if found != expected:
        raise FetchError(f"{label}:1: expected the header {chr(9).join(expected)!r}, "
                         f"found {chr(9).join(found)[:200]!r}")
    if len(lines) - 1 != rows:
        raise FetchError(f"{label}: expected {rows} ratings, found {len(lines) - 1}")
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise FetchError(f"{label}: sha256 {digest}, expected {sha256}: not the ratings file this "
                         f"project pins; delete it (and the wheel it came from) and run again")


DATASETS = {"movielens-100k": fetch_movielens_100k}
