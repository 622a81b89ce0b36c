"""Experiments: configs, single runs with the data reports need, comparisons and rate sweeps."""

from baton.experiments.config import Experiment, WorkloadConfig, load_experiment, with_cluster
from baton.experiments.run import RunData, policy_label, run_experiment
from baton.experiments.sweep import SweepResult, max_sustainable_rate, run_sweep

__all__ = ["Experiment", "RunData", "SweepResult", "WorkloadConfig", "load_experiment",
           "max_sustainable_rate", "policy_label", "run_experiment", "run_sweep", "with_cluster"]
