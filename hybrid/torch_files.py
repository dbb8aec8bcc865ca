"""Reading torch files (a checkpoint's ``dense.pt``, exports, cost models) without ever running their code.

``torch.load(weights_only=True)`` refuses a pickle that would call
anything, but its message advises loading again with
``weights_only=False``, which would run the file's code: that text is not
passed on.
"""
from __future__ import annotations

import torch


def load(path, *, what: str, remedy: str, **options):
    """``torch.load(path, weights_only=True, **options)``; ValueError naming ``what`` the file should be and
    ``remedy`` for any file torch cannot read that way (FileNotFoundError passes through)."""
    try:
        return torch.load(path, weights_only=True, **options)
    except FileNotFoundError:
        raise
    except Exception as exc:  # torch raises several types for files that are not its own
        raise ValueError(f"{path} is not {what} (torch.load: {type(exc).__name__}); {remedy}") from None
