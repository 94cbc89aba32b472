"""Cutting labelled stretches of a recording into fixed-length, overlapping windows."""
import numpy as np


def sliding_windows(starts, lengths, window: int, step: int):
    """First rows of every `window`-sample window, `step` apart, inside each stretch [start, start + length), and the
    index of its stretch. A stretch of n samples gives floor((n - window) / step) + 1 windows, none if n < window;
    windows never cross a stretch's end."""
    starts, lengths = np.asarray(starts, np.int64), np.asarray(lengths, np.int64)
    count = np.where(lengths >= window, (lengths - window) // step + 1, 0)
    stretch = np.repeat(np.arange(len(starts)), count)
    within = np.arange(len(stretch)) - np.repeat(np.cumsum(count) - count, count)
    return starts[stretch] + within * step, stretch


def constant_runs(labels):
    """(starts, lengths, values) of the maximal runs of equal consecutive labels."""
    labels = np.asarray(labels)
    if len(labels) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), labels
    starts = np.flatnonzero(np.concatenate([[True], labels[1:] != labels[:-1]]))
    lengths = np.diff(np.append(starts, len(labels)))
    return starts, lengths, labels[starts]
