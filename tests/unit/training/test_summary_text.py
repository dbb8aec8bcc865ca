"""The summary's first line says when rows and gradients travel in 16 bits (docs/design.md section 14)."""
from hybrid.training.summary_text import format_summary


def _summary(wire: str) -> dict:
    return {"config": "ml100k", "label": "herald", "mode": "herald", "workers": 3, "ps": 1, "iterations": 234,
            "throughput": 9000.0, "train_loss": 0.5, "hit_rate": 0.6, "epochs": 1.0, "wire_precision": wire,
            "evaluation": {"auc": 0.71, "logloss": 0.61, "samples": 10000},
            "transmissions": {"rows": 3, "pull_rows": 2, "push_rows": 1, "p2p_rows": 0,
                              "pull_bytes": 2 * 2**20, "push_bytes": 2**20, "p2p_bytes": 0}}


def test_a_16_bit_wire_is_named_with_the_rows_bytes_and_fp32_says_nothing():
    assert "; rows and gradients in bf16 on the wire (3.0 MB of rows)" in format_summary(_summary("bf16"))
    assert "on the wire" not in format_summary(_summary("fp32"))
