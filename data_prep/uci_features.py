"""The 561 UCI HAR/HAPT window features (features_info.txt), in the order of the release's features.txt.

Input: per window, the five 3-axis time signals (body and gravity acceleration, their jerks' body parts, gyro and its
jerk), shaped (windows, 3, samples). Time-domain statistics come first (3-axis signals, then magnitudes), then the
FFT-domain ones (3-axis, then magnitudes), then the angles. Names follow features.txt but with the axis index
where the release repeats "-1" (its entropy, skewness and kurtosis names), so every name is unique.
"""
import numpy as np

from . import stats

AXES = ("1", "2", "3")
TIME_3AXIS = ("tBodyAcc", "tGravityAcc", "tBodyAccJerk", "tBodyGyro", "tBodyGyroJerk")
TIME_MAGNITUDES = ("tBodyAccMag", "tGravityAccMag", "tBodyAccJerkMag", "tBodyGyroMag", "tBodyGyroJerkMag")
FFT_3AXIS = ("fBodyAcc", "fBodyAccJerk", "fBodyGyro")  # FFT of tBodyAcc, tBodyAccJerk, tBodyGyro
FFT_MAGNITUDES = ("fBodyAccMag", "fBodyAccJerkMag", "fBodyGyroMag", "fBodyGyroJerkMag")
UCI_WINDOW = 128  # the release's windows (2.56 s at 50 Hz); any length of at least MIN_WINDOW works
MIN_WINDOW = 16  # the narrowest bandsEnergy band must hold a bin
AR_ORDER = 4


def bands(bins: int) -> list[tuple[int, int]]:
    """bandsEnergy intervals, 1-based inclusive bin numbers, as fractions of the half spectrum's `bins`: eighths,
    quarters, and the first two thirds of it in two bands, the UCI release's 1-8, ..., 1-24, 25-48 at 64 bins."""
    def cut(fraction):
        return round(fraction * bins)
    eighths = [(cut(i / 8) + 1, cut((i + 1) / 8)) for i in range(8)]
    quarters = [(cut(i / 4) + 1, cut((i + 1) / 4)) for i in range(4)]
    return eighths + quarters + [(1, cut(3 / 8)), (cut(3 / 8) + 1, cut(6 / 8))]


class _Columns:
    """Feature names and (windows, k) value blocks collected in output order."""

    def __init__(self):
        self.names, self.blocks = [], []

    def add(self, names, values):
        values = np.asarray(values, dtype=np.float64)
        values = values.reshape(values.shape[0], -1)
        if values.shape[1] != len(names):
            raise AssertionError(f"{len(names)} names for {values.shape[1]} values ({names[0]}...)")
        self.names += list(names)
        self.blocks.append(values)

    def table(self):
        return np.concatenate(self.blocks, 1)


def _suffixed(signal, stat, count):
    return [f"{signal}-{stat}-{i + 1}" for i in range(count)]


def _shared_statistics(cols, signal, x):
    """mean … entropy: the statistics every signal gets, time or FFT domain; x is (windows, axes, values)."""
    n = x.shape[1]
    for stat, values in (("Mean", x.mean(-1)), ("STD", stats.std(x)), ("Mad", stats.mad(x)),
                         ("Max", x.max(-1)), ("Min", x.min(-1))):
        cols.add(_suffixed(signal, stat, n), values)
    cols.add(_suffixed(signal, "SMA", 1), stats.signal_magnitude_area(x))
    for stat, values in (("Energy", stats.energy(x)), ("IQR", stats.iqr(x)), ("Entropy", stats.entropy(x))):
        cols.add(_suffixed(signal, stat, n), values)


def _time_domain(cols, signal, x):
    _shared_statistics(cols, signal, x)
    cols.add(_suffixed(signal, "ARCoeff", AR_ORDER * x.shape[1]), stats.ar_burg(x, AR_ORDER))
    if x.shape[1] == 3:
        cols.add(_suffixed(signal, "Correlation", 3), stats.axis_correlations(x))


def _fft_domain(cols, signal, spectrum, freqs):
    """spectrum: |FFT| over the first half's bins, (windows, axes, bins) (64 for the UCI windows); freqs: the bins'
    frequencies in Hz.

    maxInds is the bin number of the largest non-DC magnitude (frequency = bin × fs / samples); meanFreq the
    magnitude-weighted mean frequency in Hz; skewness and kurtosis are those of the magnitudes as values.
    """
    n = spectrum.shape[1]
    _shared_statistics(cols, signal, spectrum)
    # The DC bin is left out: it always wins on magnitude signals (their mean is far from 0), which would make
    # maxInds constant there.
    cols.add(_suffixed(signal, "MaxInds", n), 1 + np.argmax(spectrum[..., 1:], -1))
    cols.add(_suffixed(signal, "MeanFreq", n), stats.safe_divide(np.sum(spectrum * freqs, -1), spectrum.sum(-1)))
    skew, kurt = stats.standardized_moment(spectrum, 3), stats.standardized_moment(spectrum, 4)
    cols.add([f"{signal}-{stat}-{i + 1}" for i in range(n) for stat in ("Skewness", "Kurtosis")],
             np.stack([skew, kurt], -1))
    if n == 3:
        power = np.square(spectrum)
        energies = np.stack([power[..., lo - 1: hi].mean(-1) for lo, hi in bands(spectrum.shape[-1])], -1)
        cols.add(_suffixed(signal, "BandsEnergyOld", 3 * energies.shape[-1]), energies)  # (windows, 3, 14)


def _angle(a, b):
    cos = stats.safe_divide(np.sum(a * b, -1), np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
    return np.arccos(np.clip(cos, -1.0, 1.0))


def feature_table(signals: dict, fs: float):
    """(windows, 561) features and their names from {name in TIME_3AXIS: (windows, 3, samples)} at `fs` Hz: the
    frequency features over the first half of each window's spectrum (samples // 2 bins; 64 for the UCI windows)."""
    n_samples = signals["tBodyAcc"].shape[-1]
    if n_samples < MIN_WINDOW:
        raise ValueError(f"windows of {n_samples} samples are too short for the UCI features; they need at least "
                         f"{MIN_WINDOW} (the release's: {UCI_WINDOW})")
    fft_bins = n_samples // 2
    cols = _Columns()
    for name in TIME_3AXIS:
        _time_domain(cols, name, signals[name])
    for name in TIME_3AXIS:
        _time_domain(cols, name + "Mag", stats.magnitude(signals[name])[:, None, :])
    freqs = np.arange(fft_bins) * fs / n_samples
    spectrum = {name: np.abs(np.fft.rfft(signals[name], axis=-1))[..., :fft_bins]
                for name in ("tBodyAcc", "tBodyAccJerk", "tBodyGyro")}
    for fname, tname in zip(FFT_3AXIS, ("tBodyAcc", "tBodyAccJerk", "tBodyGyro")):
        _fft_domain(cols, fname, spectrum[tname], freqs)
    for fname, tname in zip(FFT_MAGNITUDES, ("tBodyAcc", "tBodyAccJerk", "tBodyGyro", "tBodyGyroJerk")):
        mag_spectrum = np.abs(np.fft.rfft(stats.magnitude(signals[tname]), axis=-1))[:, None, :fft_bins]
        _fft_domain(cols, fname, mag_spectrum, freqs)
    gravity_mean = signals["tGravityAcc"].mean(-1)
    for name in ("tBodyAcc", "tBodyAccJerk", "tBodyGyro", "tBodyGyroJerk"):
        cols.add([f"{name}-AngleWRTGravity-1"], _angle(signals[name].mean(-1), gravity_mean))
    for i, axis in enumerate("XYZ"):
        cols.add([f"t{axis}AxisAcc-AngleWRTGravity-1"], _angle(np.eye(3)[i], gravity_mean))
    return cols.table(), cols.names


def feature_names() -> list:
    """The 561 names in output order (from one all-zero window: the layout does not depend on the data)."""
    return feature_table({name: np.zeros((1, 3, UCI_WINDOW)) for name in TIME_3AXIS}, fs=50.0)[1]


def release_name(name: str) -> str:
    """Our unique name spelled as in the release's features.txt (which writes every entropy as "-ropy-1",
    every skewness and kurtosis as "-1")."""
    signal, stat, _ = name.rsplit("-", 2)
    if stat == "Entropy":
        return f"{signal}-ropy-1"
    if stat in ("Skewness", "Kurtosis"):
        return f"{signal}-{stat}-1"
    return name
