"""``mpirun -n N hybrid preprocess``: the ranks share the parts and write one store, the same at 1, 2 and 3 ranks.

The world is split into groups of 1, 2 and 3 ranks (and the rest); each
group preprocesses the same file into a store of its own, and every store's
fingerprint is the one a single process writes. Then a bad line: every rank
of the group raises the same error naming it, and nothing is left behind.
"""
from pathlib import Path

import pytest
from mpi4py import MPI

from hybrid.data.criteo_text import write_criteo_text
from hybrid.data.formats import FormatError
from hybrid.data.preprocess import preprocess, work_dir
from hybrid.data.task_pool import MpiTaskPool


def _groups(world):
    """Ranks 0 | 1 2 | 3 4 5 | the rest: the group of this rank, and its size."""
    color = 0 if world.rank == 0 else 1 if world.rank < 3 else 2 if world.rank < 6 else 3
    return world.Split(color, world.rank), color


@pytest.mark.shape
@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
def test_every_rank_count_writes_the_one_process_store(tmp_path_factory):
    world = MPI.COMM_WORLD
    root = Path(world.bcast(str(tmp_path_factory.mktemp("preprocess")) if world.rank == 0 else None))
    if world.rank == 0:
        write_criteo_text(root / "day_0", lines=3000, scale=0.002, seed=5)
        single = preprocess([root / "day_0"], root / "single", format_name="criteo", min_count=2)["fingerprint"]
    else:
        single = None
    single = world.bcast(single)
    group, color = _groups(world)
    try:
        out = root / f"store-{color}"
        meta = preprocess([root / "day_0"], out, format_name="criteo", min_count=2, pool=MpiTaskPool(group),
                          part_bytes=40_000)
        assert meta["fingerprint"] == single, f"{group.size} ranks wrote another store"
        assert not work_dir(out).exists()
    finally:
        group.Free()
    assert len(set(world.allgather(meta["fingerprint"]))) == 1


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
def test_a_bad_line_is_named_on_every_rank_and_leaves_nothing(tmp_path_factory):
    world = MPI.COMM_WORLD
    root = Path(world.bcast(str(tmp_path_factory.mktemp("bad")) if world.rank == 0 else None))
    good = "\t".join(["1"] + ["3"] * 13 + ["a1b2c3d4"] * 26)
    if world.rank == 0:
        lines = [good] * 2000
        lines[1700] = good.replace("a1b2c3d4", "zz-top", 1)
        (root / "day_0").write_text("\n".join(lines) + "\n")
    world.Barrier()
    with pytest.raises(FormatError, match="day_0:1701: column C1: invalid value 'zz-top'"):
        preprocess([root / "day_0"], root / "out", format_name="criteo", pool=MpiTaskPool(world), part_bytes=8_000)
    world.Barrier()
    assert sorted(p.name for p in root.iterdir()) == ["day_0"]
