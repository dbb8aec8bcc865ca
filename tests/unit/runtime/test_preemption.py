"""Stop requests: the first signal is noted (and forwarded), a second interrupts, codes name signal and rank."""
import os
import signal

import pytest

from hybrid.runtime.preemption import StopRequest, describe


@pytest.fixture
def stop():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    yield StopRequest().install()
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_the_first_signal_is_noted_and_forwarded_once_a_second_interrupts(stop):
    told = []
    stop.forward(told.append)
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop.signal == "SIGTERM" and told == [signal.SIGTERM]
    with pytest.raises(KeyboardInterrupt, match="SIGINT after SIGTERM"):
        os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the dropped interrupt, as intended
def test_a_second_signal_lost_in_a_finalizer_interrupts_where_the_loop_next_looks(stop):
    import gc
    import weakref

    class Held:
        pass

    def second_signal(_):
        os.kill(os.getpid(), signal.SIGINT)  # its handler runs in this callback, whose exception Python drops

    stop.raise_if_interrupted()  # nothing yet
    os.kill(os.getpid(), signal.SIGTERM)
    held = Held()
    ref = weakref.ref(held, second_signal)  # noqa: F841 (the callback runs when held goes)
    del held
    gc.collect()
    assert stop.interrupted == "SIGINT after SIGTERM"
    with pytest.raises(KeyboardInterrupt, match="SIGINT after SIGTERM"):
        stop.raise_if_interrupted()


def test_a_signal_before_forwarding_is_forwarded_when_it_starts(stop):
    os.kill(os.getpid(), signal.SIGUSR1)
    told = []
    stop.forward(told.append)
    assert told == [signal.SIGUSR1]


def test_the_largest_code_names_the_largest_signal_and_of_its_ranks_the_lowest():
    requests = {}
    for rank, signum in [(3, signal.SIGUSR1), (1, signal.SIGTERM), (2, signal.SIGTERM)]:
        requests[rank] = StopRequest()
        requests[rank].signum = signum
    codes = [r.code(rank) for rank, r in requests.items()] + [StopRequest().code(0)]
    assert StopRequest().code(5) == 0
    assert describe(max(codes)) == "SIGTERM on rank 1"
    assert describe(requests[3].code(3)) == "SIGUSR1 on rank 3"
    assert max(codes) < 2**31  # an int32 allreduce carries it
