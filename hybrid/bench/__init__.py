"""Benchmarks (``hybrid bench NAME``): speed goals live here, never in unit tests."""


def case_overrides(case: str) -> list[str]:
    """The ``hybrid train`` overrides of a benchmark case named ``MODE[+KEY=VALUE...]``.

    ``herald+train.deterministic=true`` compares a setting against plain
    ``herald`` in the same interleaved run, where a noisy machine slows both alike.
    """
    mode, *extra = case.split("+")
    bad = [item for item in extra if "=" not in item]
    if not mode or bad:
        raise ValueError(f"benchmark case {case!r}: expected MODE or MODE+KEY=VALUE[+KEY=VALUE...]")
    return [f"scheduler.mode={mode}", *extra]
