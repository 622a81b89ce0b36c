"""Discrete-event simulator of a PD-disaggregated serving cluster."""

from baton.sim.cluster import ClusterSpec, cluster_from_dict
from baton.engine_model.work import EngineConfig
from baton.sim.recorder import SimResult
from baton.sim.runner import simulate
from baton.sim.simulator import SimulationError, Simulator

__all__ = ["ClusterSpec", "EngineConfig", "SimResult", "SimulationError", "Simulator",
           "cluster_from_dict", "simulate"]
