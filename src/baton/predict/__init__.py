"""Output-length and remaining-length estimators behind one interface."""

from baton.predict.base import LengthEstimator, NoPrediction, OracleLength

__all__ = ["LengthEstimator", "NoPrediction", "OracleLength"]
