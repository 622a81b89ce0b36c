"""Output-length and remaining-length estimators behind one interface."""

from collections.abc import Callable

from baton.core.errors import ConfigError
from baton.predict.base import LengthEstimator, NoPrediction, OracleLength
from baton.predict.survival import SurvivalTable

# Estimators by name; each builder takes the estimator's keyword parameters.
ESTIMATORS: dict[str, Callable[..., LengthEstimator]] = {
    "oracle": OracleLength, "none": NoPrediction, "survival": SurvivalTable,
}


def build_estimator(name: str, **params) -> LengthEstimator:
    """An estimator by name (``oracle``, ``none``, ``survival``)."""
    if name not in ESTIMATORS:
        raise ConfigError(f"estimator: unknown {name!r}; known: {', '.join(sorted(ESTIMATORS))}")
    return ESTIMATORS[name](**params)


__all__ = ["ESTIMATORS", "LengthEstimator", "NoPrediction", "OracleLength", "SurvivalTable",
           "build_estimator"]
