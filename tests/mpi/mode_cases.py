"""The cases a test runs for every mode, read from the registry (``hybrid.modes.MODES``), never listed by hand.

A case is ``MODE[+KEY=VALUE...]`` (``hybrid.bench.case_overrides``): each registered mode whose batches and schedule
follow the store alone (``TrainingMode.reference_order``: the simulator and the single-process reference repeat
them), and each of its ``variants``. A mode added to the registry is run by every test that takes its cases here.
"""
from hybrid import modes


def mode_cases(*, sixteen_bit_wire: bool = False) -> list[str]:
    """Every case of every mode the reference repeats; ``sixteen_bit_wire``: only modes that take a 16-bit wire."""
    chosen = [mode for mode in modes.MODES.values()
              if mode.reference_order and (mode.sixteen_bit_wire or not sixteen_bit_wire)]
    return [case for mode in chosen for case in (mode.name.value, *(f"{mode.name.value}+{v}" for v in mode.variants))]
