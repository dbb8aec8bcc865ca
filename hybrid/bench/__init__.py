"""Benchmarks (``hybrid bench NAME``): speed goals live here, never in unit tests.

May import every package except ``hybrid.cli``.
"""


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


def case_mode(case: str):
    """The mode of a case and its extra settings: ``herald+scheduler.order=confident`` -> (herald, [...]).

    The simulator takes the mode apart from the config, so the paper suites
    need the two split; a mode that does not exist fails here, naming the modes.
    """
    from hybrid import modes

    mode_override, *extra = case_overrides(case)
    name = mode_override.split("=", 1)[1]
    if name not in modes.MODES:
        raise ValueError(f"benchmark case {case!r}: mode {name!r} is not one of {', '.join(modes.MODES)}")
    return modes.get(name).name, extra
