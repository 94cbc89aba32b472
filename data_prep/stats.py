"""Per-window statistics, vectorised over windows: every function reduces the last axis (a window's samples).

Arrays are (..., samples); a 3-axis signal is (..., 3, samples). One call covers all windows of a recording,
which is what keeps the extraction of ~10^4 windows to seconds. Degenerate windows (constant signals) give 0
where a ratio would be 0/0, so no feature is ever NaN.
"""
import numpy as np


def safe_divide(num, den):
    """num / den, 0 where den is 0 (a constant window has no shape, correlation or entropy)."""
    num, den = np.broadcast_arrays(np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64))
    return np.divide(num, den, out=np.zeros(num.shape), where=den != 0)


def std(x):
    """Sample standard deviation (N - 1), MATLAB's `std`, in which both reference feature sets were written."""
    return x.std(-1, ddof=1)


def mad(x):
    """Median absolute deviation from the median."""
    return np.median(np.abs(x - np.median(x, -1, keepdims=True)), -1)


def iqr(x):
    q75, q25 = np.percentile(x, [75, 25], axis=-1)
    return q75 - q25


def energy(x):
    """Sum of squares divided by the number of values."""
    return np.mean(np.square(x), -1)


def signal_magnitude_area(x):
    """Mean over samples of the summed absolute values over axes: (..., axes, samples) → (...)."""
    return np.abs(x).sum(-2).mean(-1)


def entropy(x):
    """Shannon entropy (bits) of the window's power distribution p_i = x_i² / Σ x²: low for a burst, high for spread."""
    power = np.square(x)
    p = safe_divide(power, power.sum(-1, keepdims=True))
    return -np.sum(p * np.log2(np.where(p > 0, p, 1.0)), -1)


def standardized_moment(x, order: int):
    """E[((x - μ) / σ)^order] with the population σ: order 3 is the skewness, 4 the (non-excess) kurtosis."""
    centred = x - x.mean(-1, keepdims=True)
    return safe_divide(np.mean(centred ** order, -1), x.std(-1) ** order)


def axis_correlations(x):
    """Pearson correlations of axis pairs (x,y), (x,z), (y,z): (..., 3, samples) → (..., 3)."""
    centred = x - x.mean(-1, keepdims=True)
    norms = np.sqrt(np.sum(centred ** 2, -1))
    pairs = [(0, 1), (0, 2), (1, 2)]
    return np.stack([safe_divide(np.sum(centred[..., i, :] * centred[..., j, :], -1), norms[..., i] * norms[..., j])
                     for i, j in pairs], -1)


def ar_burg(x, order: int):
    """Burg estimate of the AR polynomial 1 + a_1 z⁻¹ + … + a_p z⁻ᵖ; returns (a_1..a_p), as MATLAB's `arburg`.

    The reflection coefficient of each stage minimises the summed forward and backward prediction error power.
    """
    forward, backward = x[..., 1:].astype(np.float64), x[..., :-1].astype(np.float64)
    coeffs = np.zeros(x.shape[:-1] + (order + 1,))
    coeffs[..., 0] = 1.0
    for m in range(order):
        k = safe_divide(-2.0 * np.sum(forward * backward, -1),
                   np.sum(forward ** 2, -1) + np.sum(backward ** 2, -1))[..., None]
        head = coeffs[..., : m + 2].copy()
        coeffs[..., : m + 2] = head + k * head[..., ::-1]
        forward, backward = (forward + k * backward)[..., 1:], (backward + k * forward)[..., :-1]
    return coeffs[..., 1:]


def mean_crossings(x):
    """How often the signal crosses its own mean (sign changes of x - mean between consecutive samples)."""
    centred = x - x.mean(-1, keepdims=True)
    return np.sum(centred[..., 1:] * centred[..., :-1] < 0, -1).astype(np.float64)


def mode(x):
    """Most frequent value; the smallest of equally frequent values (MATLAB's `mode`)."""
    values = np.sort(x, -1)
    n = values.shape[-1]
    index = np.broadcast_to(np.arange(n), values.shape)
    starts_run = np.concatenate([np.ones(values.shape[:-1] + (1,), bool), values[..., 1:] != values[..., :-1]], -1)
    ends_run = np.concatenate([values[..., 1:] != values[..., :-1], np.ones(values.shape[:-1] + (1,), bool)], -1)
    run_start = np.maximum.accumulate(np.where(starts_run, index, 0), -1)
    run_end = np.flip(np.minimum.accumulate(np.flip(np.where(ends_run, index, n), -1), -1), -1)
    return np.take_along_axis(values, np.argmax(run_end - run_start, -1)[..., None], -1)[..., 0]


def magnitude(x):
    """Euclidean norm over the axes: (..., 3, samples) → (..., samples)."""
    return np.sqrt(np.sum(np.square(x), -2))


def weighted_moments(weights, positions):
    """Mean, std, skewness and excess kurtosis of `positions` weighted by `weights` (e.g. a spectrum's shape)."""
    total = weights.sum(-1)
    centre = safe_divide(np.sum(weights * positions, -1), total)
    offset = positions - centre[..., None]
    spread = np.sqrt(safe_divide(np.sum(weights * offset ** 2, -1), total))
    z = safe_divide(offset, spread[..., None])
    skew = safe_divide(np.sum(weights * z ** 3, -1), total)
    kurt = np.where(spread > 0, safe_divide(np.sum(weights * z ** 4, -1), total) - 3.0, 0.0)
    return centre, spread, skew, kurt
