"""The per-window statistics and both feature sets on signals whose features are known in closed form."""
import numpy as np
import pytest

from data_prep import position_features, stats, uci_features


def _sine(n, cycles, amplitude, offset=0.0, phase=0.3):
    return offset + amplitude * np.sin(2 * np.pi * cycles * np.arange(n) / n + phase)


def test_statistics_of_a_sine():
    x = _sine(128, 4, 2.0)[None]
    assert x.mean(-1) == pytest.approx(0, abs=1e-12)
    assert stats.std(x)[0] == pytest.approx(2 / np.sqrt(2) * np.sqrt(128 / 127))
    assert stats.energy(x)[0] == pytest.approx(2.0)  # A² / 2
    assert stats.mean_crossings(x)[0] == 8  # two per cycle
    assert stats.entropy(np.ones((1, 64)))[0] == pytest.approx(6.0)  # flat power over 64 samples: log2(64) bits
    assert stats.entropy(np.eye(1, 64))[0] == 0


def test_correlations_mode_and_degenerate_windows():
    t = np.linspace(0, 1, 50)
    xyz = np.stack([t, -2 * t + 1, np.cos(7 * t)])[None]
    r = stats.axis_correlations(xyz)[0]
    assert r[0] == pytest.approx(-1) and abs(r[1]) < 1 and abs(r[2]) < 1
    assert stats.mode(np.array([[3.0, 1, 2, 2, 3, 5], [4, 4, 1, 1, 0, 9]])).tolist() == [2, 1]
    constant = np.full((1, 3, 32), 0.7)
    for value in (stats.axis_correlations(constant), stats.standardized_moment(constant, 3), stats.entropy(0 * constant),
                  stats.ar_burg(constant * 0, 4)):
        assert np.isfinite(value).all() and (value == 0).all()


def test_burg_recovers_an_ar2_process():
    rng = np.random.default_rng(0)
    x = np.zeros(20_000)
    noise = rng.normal(size=x.size)
    for t in range(2, x.size):
        x[t] = 1.5 * x[t - 1] - 0.7 * x[t - 2] + noise[t]
    a = stats.ar_burg(x[None], 4)[0]  # polynomial 1 + a1 z^-1 + ...: x_t = -a1 x_{t-1} - a2 x_{t-2}
    np.testing.assert_allclose(a, [-1.5, 0.7, 0, 0], atol=0.03)


def test_uci_features_of_a_sine_window():
    fs, n, amplitude = 50.0, 128, 0.5
    body = np.zeros((1, 3, n))
    body[0, 0] = _sine(n, 10, amplitude)  # exactly FFT bin 10 = 3.906 Hz
    gravity = np.zeros((1, 3, n))
    gravity[0, 2] = 1.0
    signals = {name: np.zeros((1, 3, n)) for name in uci_features.TIME_3AXIS}
    signals.update(tBodyAcc=body, tGravityAcc=gravity)
    X, names = uci_features.feature_table(signals, fs)
    row = dict(zip(names, X[0]))
    assert X.shape == (1, 561) and len(set(names)) == 561
    assert row["tBodyAcc-Mean-1"] == pytest.approx(0, abs=1e-12)
    assert row["tBodyAcc-STD-1"] == pytest.approx(amplitude / np.sqrt(2) * np.sqrt(n / (n - 1)))
    assert row["tBodyAcc-Energy-1"] == pytest.approx(amplitude ** 2 / 2)
    assert row["fBodyAcc-MaxInds-1"] == 10
    assert row["fBodyAcc-MeanFreq-1"] == pytest.approx(10 * fs / n)
    assert row["fBodyAcc-BandsEnergyOld-2"] > 0 and row["fBodyAcc-BandsEnergyOld-1"] == pytest.approx(0, abs=1e-20)
    assert row["tGravityAccMag-Mean-1"] == pytest.approx(1)
    assert row["tBodyAcc-Correlation-1"] == 0  # y is constant


def test_position_features_of_a_sine():
    n, fs, bin_, amplitude, offset = 125, 25.0, 10, 0.8, 3.0  # bin 10 of 125 samples at 25 Hz = 2 Hz
    x = _sine(n, bin_, amplitude, offset)[None]
    row = dict(zip(position_features.NAMES, position_features.sensor_features(x)[0]))
    assert len(position_features.NAMES) == 27
    assert row["mean"] == pytest.approx(offset)
    assert row["std"] == pytest.approx(amplitude / np.sqrt(2) * np.sqrt(n / (n - 1)))
    assert row["range"] == pytest.approx(row["max"] - row["min"]) and row["max"] <= offset + amplitude
    assert row["dc"] == pytest.approx(n * offset)
    assert row["energy"] == pytest.approx(n ** 2 * amplitude ** 2 / (2 * (n - 1)))  # Parseval, DC left out
    assert row["peak5"] == pytest.approx(n * amplitude / 2) and row["peak4"] == pytest.approx(row["peak5"])
    assert {row["peak_bin4"], row["peak_bin5"]} == {bin_, n - bin_}  # the peak and its mirror
    assert min(row["peak_bin5"], n - row["peak_bin5"]) * fs / n == pytest.approx(2.0)
    assert row["shape_mean"] == pytest.approx(bin_)
    assert row["mean_crossings"] == 2 * bin_ - 1  # with phase 0.3 the 20th crossing falls after the last sample


def test_position_table_layout():
    signals = np.random.default_rng(0).normal(size=(4, 5, 3, 3, 125))
    X, names = position_features.position_table(signals, ("T", "RA", "LA", "RL", "LL"), ("acc", "gyro", "mag"))
    assert X.shape == (4, 405) and names[0] == "T_acc_mean" and names[81] == "RA_acc_mean"
    alone = position_features.sensor_features(stats.magnitude(signals[:, 1, 2]))
    np.testing.assert_allclose(X[:, 81 + 2 * 27: 81 + 3 * 27], alone)
