"""A scheduler's pre-emption signal is never lost.

Under `hydra/launcher=slurm` (submitit) a SIGUSR2 or SIGTERM runs a handler that checkpoints, requeues the job and
ends the process by raising SystemExit wherever the main thread happens to be. Raised inside a garbage-collector
callback or a finaliser, that exception is printed and dropped: the job trains on past its pre-emption and is
killed without having requeued cleanly. (jax, which avalanche's optional QP solvers import, runs a callback at every
collection.) Wrapped here, a signal that lands in such a frame is sent again a moment later, until it lands where
an exception propagates; the handler itself runs once.
"""
import gc
import signal
import threading
from types import FrameType

ENDING_SIGNALS = (signal.SIGUSR2, signal.SIGTERM)
REDELIVER_AFTER_S = 0.1


def _swallows_exceptions(frame: FrameType | None) -> bool:
    """Whether `frame` runs inside a garbage-collector callback or a finaliser, where Python drops exceptions."""
    callbacks = {getattr(callback, "__code__", None) for callback in gc.callbacks}
    while frame is not None:
        if frame.f_code in callbacks or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


class Redelivered:
    """A signal handler that runs `handler` only where its exception can end the process."""

    def __init__(self, handler):
        self.handler = handler

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if not _swallows_exceptions(frame):
            self.handler(signum, frame)
            return
        resend = threading.Timer(REDELIVER_AFTER_S, signal.pthread_kill, (threading.main_thread().ident, signum))
        resend.daemon = True
        resend.start()


def keep_ending_signals(signums=ENDING_SIGNALS) -> None:
    """Wrap the Python handlers installed for `signums` (a scheduler's); default and ignored ones stay as they are."""
    for signum in signums:
        handler = signal.getsignal(signum)
        if callable(handler) and not isinstance(handler, Redelivered):
            signal.signal(signum, Redelivered(handler))
