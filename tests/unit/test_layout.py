"""The package layering of ``hybrid/__init__.py``: no module imports from a package below its own.

Every ``import hybrid...`` and ``from hybrid... import`` is read from the
source (function-level imports included), so a lazy import cannot hide an
upward dependency.
"""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "hybrid"
# lowest first: a unit may import itself and any unit before it
ORDER = ["_ext", "counter_hash", "data", "config", "torch_files", "models", "embedding_optimizer", "lr_schedule",
         "wire_format", "exported",
         "scheduling", "runtime", "sharding", "modes",
         "training", "bench", "projection", "cli", "__main__"]


def _unit(module: str) -> str:
    """``hybrid.scheduling.plans`` -> ``scheduling``; ``hybrid`` itself -> ``hybrid``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, hybrid module) of every import in ``path``, relative imports resolved."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if base == "hybrid":  # from hybrid import X: X is the unit
                found += [(node.lineno, f"hybrid.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, base))
    return [(line, name) for line, name in found if name == "hybrid" or name.startswith("hybrid.")]


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_from_a_package_below_its_own(path):
    unit = _unit(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
    assert unit in ORDER, f"{path}: unit {unit!r} has no place in the layering; add it to ORDER and hybrid/__init__.py"
    upward = [f"line {line}: {name}" for line, name in _imports(path)
              if _unit(name) not in ORDER or ORDER.index(_unit(name)) > ORDER.index(unit)]
    assert not upward, f"{path.relative_to(PACKAGE.parent)} ({unit}) imports from above it: {upward}"


def test_every_package_says_what_it_may_import():
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "import" in doc.lower(), f"{init.relative_to(PACKAGE.parent)}: its docstring does not say what it may import"


# what only a mode may name: each registered mode, and the mechanisms modes keep to themselves
MECHANISMS = {"p2p", "peer", "peers", "hot", "stale", "replica", "replicas", "sync", "Sync", "SyncMode"}
# a mode's name that is also the loop's own word: it executes the scheduler's plans (hybrid.scheduling.plans)
VOCABULARY = {"plan"}


def mode_words() -> set:
    """Every registered mode's name (``hybrid.modes.MODES``: one a test registers counts too) but the loop's own
    words, and ``MECHANISMS``."""
    from hybrid import modes

    return ({mode.value for mode in modes.MODES} - VOCABULARY) | MECHANISMS


def test_the_training_loop_names_no_mode():
    """Modes are plug-ins: the loop's code (not its docs) names no mode, no mode's state, no mode module."""
    loop = PACKAGE / "training" / "loop.py"
    tree = ast.parse(loop.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    words = mode_words()
    named = sorted(n for n in names if words & set(n.split("_")) or n in words)
    assert not named, f"{loop.relative_to(PACKAGE.parent)} names mode-specific things: {named}"
    modules = [name for _, name in _imports(loop) if name.startswith("hybrid.modes.")]
    assert not modules, f"the loop imports mode modules directly: {modules}; take the mode from hybrid.modes.get"
