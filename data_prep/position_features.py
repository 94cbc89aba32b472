"""The 27 features per sensor of Wang et al.'s cross-position activity recognition (DSADS: 405, PAMAP2: 243).

Reference: J. Wang, Y. Chen, L. Hu, X. Peng, P. S. Yu, "Stratified Transfer Learning for Cross-domain Activity
Recognition", PerCom 2018; their MATLAB extraction (GitHub jindongwang/activityrecognition, code/matlab/core:
FeatureExtraction2.m, ShapeAndAmpFeatures2.m, MeanCrossingRate.m) defines the list, reimplemented here vectorised.
Each 3-axis sensor is reduced to its magnitude first (27 features per sensor, 81 per body position).

For a window x of N samples, X = |FFT(x)| (N points, two-sided) and P = X[1..floor(N/2)] (one-sided, no DC,
indexed m = 1..M), the features are, in order:

- 1-7 time domain: mean, std (N - 1), min, max, mode (most frequent value, the smallest on ties), range
  (max - min), mean_crossings (sign changes of x - mean between consecutive samples);
- 8 dc = X[0] = |sum of x|;
- 9-13 peak1..peak5: the five largest X over bins 1..N-1, ascending (stable on ties);
- 14-18 peak_bin1..peak_bin5: their FFT bins (frequency = bin * fs / N; a bin above N/2 is the mirror of N - bin:
  the reference searches the two-sided spectrum, so a dominant frequency appears twice); the reference stores
  1-based MATLAB indices, i.e. bin + 1, a shift that the [-1, 1] scaling removes;
- 19 energy: mean of X² over bins 1..N-1;
- 20-23 shape_mean, shape_std, shape_skew, shape_kurt: moments of the bin index m weighted by P (kurtosis - 3);
- 24-27 amp_mean, amp_std, amp_skew, amp_kurt: moments of the values P (population std, kurtosis - 3).

Degenerate windows (a constant signal) give 0 where the reference would divide by zero.
"""
import numpy as np

from . import stats

NAMES = ("mean", "std", "min", "max", "mode", "range", "mean_crossings", "dc",
         *(f"peak{i}" for i in range(1, 6)), *(f"peak_bin{i}" for i in range(1, 6)), "energy",
         "shape_mean", "shape_std", "shape_skew", "shape_kurt", "amp_mean", "amp_std", "amp_skew", "amp_kurt")
N_PEAKS = 5


def sensor_features(x: np.ndarray) -> np.ndarray:
    """The 27 features of every window of a 1-D signal: (..., samples) → (..., 27)."""
    n = x.shape[-1]
    spectrum = np.abs(np.fft.fft(x, axis=-1))
    two_sided = spectrum[..., 1:]
    order = np.argsort(two_sided, axis=-1, kind="stable")[..., -N_PEAKS:]
    one_sided = spectrum[..., 1: n // 2 + 1]
    shape = stats.weighted_moments(one_sided, np.arange(1, one_sided.shape[-1] + 1))
    amp_std = one_sided.std(-1)
    amp_kurt = np.where(amp_std > 0, stats.standardized_moment(one_sided, 4) - 3.0, 0.0)
    columns = [x.mean(-1), stats.std(x), x.min(-1), x.max(-1), stats.mode(x), np.ptp(x, -1), stats.mean_crossings(x),
               spectrum[..., 0], *np.moveaxis(np.take_along_axis(two_sided, order, -1), -1, 0),
               *np.moveaxis(order + 1.0, -1, 0), np.mean(two_sided ** 2, -1),
               *shape, one_sided.mean(-1), amp_std, stats.standardized_moment(one_sided, 3), amp_kurt]
    return np.stack(columns, -1)


def position_table(signals: np.ndarray, positions, sensors):
    """Features of (windows, positions, sensors, 3 axes, samples) signals: (windows, positions·sensors·27) and names
    `{position}_{sensor}_{feature}`, position-major as in the reference files."""
    table = sensor_features(stats.magnitude(signals))  # (windows, positions, sensors, 27)
    names = [f"{p}_{s}_{f}" for p in positions for s in sensors for f in NAMES]
    return table.reshape(len(table), len(names)), names
