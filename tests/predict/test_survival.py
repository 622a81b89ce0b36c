"""The online survival table against distributions whose survival function is known."""

import numpy as np
import pytest

from baton.core.errors import ConfigError
from baton.experiments.calibration import empirical_conditional, survival_calibration
from baton.predict.survival import SurvivalTable


def learned(samples, delta=16, alpha=0.999, max_tokens=20_000):
    table = SurvivalTable(delta, alpha, max_tokens)
    for x in samples:
        table.update(float(x))
    return table


def test_uniform_lengths():
    rng = np.random.default_rng(0)
    table = learned(rng.uniform(0, 2000, 20_000))
    xs = np.array([0, 100, 500, 1000, 1500, 1990])
    assert table.survival(xs) == pytest.approx(1 - xs / 2000, abs=0.04)
    # E[L - g | L > g] = (2000 - g) / 2 for a uniform on [0, 2000]
    assert table.expected_remaining(np.array([0.0, 1000.0])) == pytest.approx([1000, 500], rel=0.06)


def test_exponential_is_memoryless():
    rng = np.random.default_rng(1)
    table = learned(rng.exponential(400, 20_000))
    assert table.conditional(1000, 1400) == pytest.approx(np.exp(-1), abs=0.05)
    assert table.conditional(0, 400) == pytest.approx(np.exp(-1), abs=0.05)
    assert table.expected_remaining(np.array([0.0, 800.0])) == pytest.approx([400, 400], rel=0.1)


def test_first_completion_sets_the_indicator_and_ema_weights_recent_ones():
    table = SurvivalTable(delta_tokens=10, alpha=0.5, max_tokens=100)
    table.update(35)
    assert table.survival(np.array([0, 30, 40, 90])) == pytest.approx([1, 1, 0, 0])
    table.update(95)  # running mean while n < 1/(1-alpha)
    assert table.survival(40) == pytest.approx(0.5)
    table.update(95)  # now EMA with alpha: 0.5*0.5 + 0.5*1
    assert table.survival(40) == pytest.approx(0.75)


def test_tracks_a_shift_in_the_distribution():
    table = learned([100] * 2000 + [1000] * 2000, alpha=0.99)
    assert table.survival(500) == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize("kwargs", [{"alpha": 1.0}, {"alpha": 0.0}, {"delta_tokens": 0}])
def test_bad_parameters(kwargs):
    with pytest.raises(ConfigError):
        SurvivalTable(**kwargs)


def test_empirical_conditional():
    p, n = empirical_conditional(np.array([10, 20, 30, 40]), np.array([15.0]), np.array([35.0]))
    assert p[0] == pytest.approx(1 / 3) and n[0] == 3


def test_calibration_error_small_on_stationary_and_large_on_shifted_workloads():
    rng = np.random.default_rng(2)
    good = survival_calibration(rng.lognormal(6, 0.8, 8000), delta_tokens=32, alpha=0.999)
    assert good["mae"] < 0.035 and good["grid_cells"] > 100
    shifted = np.concatenate([rng.lognormal(5, 0.5, 4000), rng.lognormal(7, 0.5, 4000)])
    bad = survival_calibration(shifted, delta_tokens=32, alpha=0.999)
    assert bad["mae"] > 3 * good["mae"]
