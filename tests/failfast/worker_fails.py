"""Run under mpirun by tests/unit/training/test_mpi_failfast.py: a real ``hybrid train`` in which worker 1 alone fails.

``python worker_fails.py startup|mid-run|hang HYBRID-TRAIN-ARGS...``: worker 1
raises while its trainer starts (after the PS windows exist, before Horovod's
broadcast) or at iteration 5, or hangs at iteration 5. The message carries
the time, so the test can tell how long the job took to end after it.
"""
import sys
import time

from hybrid import cli
from hybrid.training import loop

WHEN = sys.argv[1]


def _fail(what: str):
    raise RuntimeError(f"deliberate failure on worker 1 {what} at t={time.time():.3f}")


def _dense_optimizer(self):
    if self.roles.worker == 1 and WHEN == "startup":
        _fail("at start-up")
    return original_dense_optimizer(self)


def _iteration(self, ready, *args, **kwargs):
    if self.roles.worker == 1 and ready.plan.step == 5:
        if WHEN == "mid-run":
            _fail("at iteration 5")
        if WHEN == "hang":  # the others wait for it in the allreduce: only the watchdog ends this
            print(f"worker 1 hangs at t={time.time():.3f}", file=sys.stderr, flush=True)
            time.sleep(3600)
    return original_iteration(self, ready, *args, **kwargs)


original_dense_optimizer, original_iteration = loop.HybridTrainer._dense_optimizer, loop.HybridTrainer._iteration
loop.HybridTrainer._dense_optimizer, loop.HybridTrainer._iteration = _dense_optimizer, _iteration
sys.exit(cli.main(sys.argv[2:]))
