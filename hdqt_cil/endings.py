"""How a command ends on an outcome the user acts on: one line and an exit status, no traceback (a refused value
or file, a diverged run, Ctrl-C, SIGTERM); `run.py`'s single runs and a sweep's checks before its jobs end alike."""
import os
import sys

from .run_folder import RunInUse
from .trainer.monitor import Diverged

# What a user's input can be refused with: the message names the bad value or file and what is allowed (a run
# folder that holds another config's or other data's run: FileExistsError, saying what to set; one that another
# process is writing: RunInUse).
REFUSALS = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, PermissionError, RunInUse)


class Terminated(BaseException):
    """SIGTERM (`timeout`, `docker stop`, a scheduler that does not requeue) ends a run as Ctrl-C does: recorded in
    its folder, resumable. A BaseException, as KeyboardInterrupt, so that no `except Exception` swallows it."""


def terminate(signum, frame):
    """The single run's SIGTERM handler."""
    raise Terminated()


def end_single_run(error: BaseException) -> None:
    """A refused value or file, a diverged run (`on_divergence=stop`), Ctrl-C or SIGTERM ends the process with one
    message and no traceback (exit 2, 1, 130, 143): each is an outcome the user acts on, not a fault in the code;
    anything else, and everything under HYDRA_FULL_ERROR=1, returns so that the caller re-raises it."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        return
    for ending, name, code in ((KeyboardInterrupt, "interrupted", 130), (Terminated, "terminated (SIGTERM)", 143)):
        if isinstance(error, ending):
            print(f"{name}: the run folder records it; the same command resumes from its last checkpoint",
                  file=sys.stderr)
            sys.exit(code)
    if isinstance(error, Diverged):
        print(f"stopped: {error}; the run folder records it (status 'diverged')", file=sys.stderr)
        sys.exit(1)
    if isinstance(error, REFUSALS):
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
