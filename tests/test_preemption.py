"""A pre-emption handler's exception reaches the main program even when its signal lands in a garbage-collector
callback or a finaliser, where Python drops exceptions."""
import gc
import os
import signal
import time

import pytest

from hdqt_cil.sweep.preemption import Redelivered, keep_ending_signals


class Ended(Exception):
    pass


@pytest.fixture
def ending_handler():
    calls = []

    def handler(signum, frame):
        calls.append(signum)
        raise Ended

    previous = signal.signal(signal.SIGUSR2, handler)
    yield calls
    signal.signal(signal.SIGUSR2, previous)


def _signal_inside_a_gc_callback():
    sent = []

    def callback(phase, info):
        if phase == "start" and not sent:
            sent.append(phase)
            os.kill(os.getpid(), signal.SIGUSR2)
            sum(range(1000))  # bytecode after the kill: the handler runs here, inside the callback

    gc.callbacks.append(callback)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(callback)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_unwrapped_handler_raising_in_a_gc_callback_is_lost(ending_handler):
    _signal_inside_a_gc_callback()  # the exception is printed and dropped: the reason for the wrapper
    assert ending_handler == [signal.SIGUSR2]


def test_a_wrapped_handler_runs_once_where_its_exception_ends_the_program(ending_handler):
    keep_ending_signals((signal.SIGUSR2,))
    assert isinstance(signal.getsignal(signal.SIGUSR2), Redelivered)
    with pytest.raises(Ended):
        _signal_inside_a_gc_callback()
        assert ending_handler == []  # deferred, not run inside the callback
        time.sleep(5)  # the signal sent again ends this
    assert ending_handler == [signal.SIGUSR2]


def test_wrapping_twice_keeps_one_wrapper_and_leaves_default_handlers(ending_handler):
    keep_ending_signals((signal.SIGUSR2,))
    wrapped = signal.getsignal(signal.SIGUSR2)
    keep_ending_signals((signal.SIGUSR2,))
    assert signal.getsignal(signal.SIGUSR2) is wrapped
    previous = signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    try:
        keep_ending_signals((signal.SIGUSR1,))
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGUSR1, previous)
