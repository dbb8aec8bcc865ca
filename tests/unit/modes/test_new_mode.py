"""A new mode is one module (docs/modes.md, "How to add a mode"): written to a temporary directory, imported, it
registers itself, and ``hybrid simulate``, the config and the layout test take it with no other file edited."""
import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest

from hybrid import modes
from hybrid.cli import main
from hybrid.config import Mode

MODULE = '''
"""Round robin: sample i of iteration t to worker (i + t) mod n, vanilla's synchronization."""
import dataclasses

import numpy as np

from hybrid.modes import register
from hybrid.modes.vanilla import Vanilla
from hybrid.scheduling.allocation import AllocationPolicy
from hybrid.scheduling.policy import Allocation, SchedulePolicy, Sync


class RoundRobinAllocation(AllocationPolicy):
    """Balanced (the default largest share), so the start-up cache check holds for it."""

    def allocate(self, rows, iteration, upcoming=None):
        return ((np.arange(len(rows)) + iteration) % self.n_workers).astype(np.int32)


@dataclasses.dataclass(frozen=True)
class RoundRobinPolicy(SchedulePolicy):
    def allocation_class(self, config):
        return RoundRobinAllocation

    def allocation_policy(self, config, state, cardinalities):
        return RoundRobinAllocation(config.cluster.workers)


@register
class RoundRobin(Vanilla):
    name = "round_robin"
    schedule = RoundRobinPolicy(Allocation.balanced, Sync.full_set)
'''


def _module(path: Path):
    """The Python module at ``path``, imported under its file's name."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def round_robin(tmp_path):
    """The module above, imported from a temporary directory; unregistered afterwards."""
    path = tmp_path / "round_robin_mode.py"
    path.write_text(textwrap.dedent(MODULE))
    yield _module(path).RoundRobin
    modes.MODES.pop("round_robin")
    sys.modules.pop(path.stem)


def test_a_mode_in_one_module_registers_simulates_and_keeps_the_layout(round_robin, criteo_like, capsys):
    assert modes.get("round_robin") is round_robin and round_robin.name is Mode("round_robin")
    assert main(["simulate", "--config", "configs/w1-smoke.yaml", f"data.path={criteo_like}", "--workers", "4",
                 "--iterations", "30", "--modes", "vanilla,round_robin", "--json"]) == 0
    counts = json.loads(capsys.readouterr().out)
    assert counts["round_robin"]["iterations"] == counts["vanilla"]["iterations"] == 20
    assert counts["round_robin"]["transmissions"] != counts["vanilla"]["transmissions"]  # its own allocation
    assert counts["round_robin"]["by_kind"]["full_set_push"] > 0  # vanilla's synchronization
    assert main(["config", "configs/w1-smoke.yaml", "scheduler.mode=round_robin"]) == 0
    layout = _module(Path(__file__).parents[1] / "test_layout.py")
    assert "round_robin" in layout.mode_words()
    layout.test_the_training_loop_names_no_mode()  # the loop names no mode, this one included


def test_a_name_is_registered_once(round_robin):
    class Again(round_robin):
        pass

    with pytest.raises(ValueError, match="mode 'round_robin' is registered already"):
        modes.register(Again)


def test_the_docs_table_of_modes_is_the_registrys():
    """docs/modes.md lists the modes in one place, generated: a mode added or changed shows there or fails here."""
    page = (Path(__file__).parents[3] / "docs" / "modes.md").read_text()
    table = page[page.index(modes.TABLE_BEGIN) + len(modes.TABLE_BEGIN):page.index(modes.TABLE_END)].strip()
    assert table == modes.table(), ("docs/modes.md's table of modes is stale: run "
                                    "python -c \"from hybrid import modes; modes.write_table('docs/modes.md')\"")
