"""What a run would take on a cluster this machine is not (``hybrid project``, issue 55): a time model of
one iteration (``time_model``), its inputs from the simulator's counts and this machine's micro-benchmarks.

May import every package except ``hybrid.cli``.
"""
