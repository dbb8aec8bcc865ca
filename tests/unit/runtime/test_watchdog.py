"""The watchdog reports a rank that stops finishing iterations, and stays quiet while it beats."""
import time

from hybrid.runtime.watchdog import Watchdog


def test_no_beat_for_longer_than_the_limit_is_reported_with_what_the_rank_was_doing():
    reports = []
    with Watchdog(0.3, lambda: "in stage allreduce of iteration 7", on_stuck=reports.append):
        time.sleep(1.0)
    assert len(reports) == 1
    assert "no iteration finished for" in reports[0] and "in stage allreduce of iteration 7" in reports[0]


def test_a_beating_rank_is_never_reported_and_zero_turns_it_off():
    reports = []
    with Watchdog(0.4, lambda: "", on_stuck=reports.append) as watchdog:
        for _ in range(10):
            time.sleep(0.1)
            watchdog.beat()
    with Watchdog(0, lambda: "", on_stuck=reports.append):
        time.sleep(0.2)
    assert reports == []
