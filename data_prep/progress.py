"""The data-preparation commands' progress bars."""
import sys

from tqdm import tqdm


def progress(iterable=None, **kwargs):
    """A tqdm bar on an interactive terminal; silent in logs, CI and pipes."""
    return tqdm(iterable, disable=not sys.stderr.isatty(), leave=False, **kwargs)
