"""Output-length and remaining-length estimators behind one interface."""

from collections.abc import Callable

from baton.core.errors import ConfigError
from baton.predict.base import LengthEstimator, NoPrediction, OracleLength
from baton.predict.learned import LearnedLength
from baton.predict.learned_error import LearnedErrorLength
from baton.predict.survival import SurvivalTable

# Estimators by name; each builder takes the estimator's keyword parameters.
ESTIMATORS: dict[str, Callable[..., LengthEstimator]] = {
    "oracle": OracleLength, "none": NoPrediction, "survival": SurvivalTable,
    "learned": LearnedLength, "learned-error": LearnedErrorLength,
}


def build_estimator(name: str, rng=None, **params) -> LengthEstimator:
    """An estimator by name (``oracle``, ``none``, ``survival``, ``learned``,
    ``learned-error``); ``rng`` goes to those that draw random numbers."""
    if name not in ESTIMATORS:
        raise ConfigError(f"estimator: unknown {name!r}; known: {', '.join(sorted(ESTIMATORS))}")
    builder = ESTIMATORS[name]
    if getattr(builder, "needs_rng", False):
        params["rng"] = rng
    try:
        return builder(**params)
    except TypeError as e:
        raise ConfigError(f"estimator {name!r}: {e}") from e


__all__ = ["ESTIMATORS", "LearnedErrorLength", "LearnedLength", "LengthEstimator", "NoPrediction", "OracleLength", "SurvivalTable",
           "build_estimator"]
