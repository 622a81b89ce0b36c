"""Plain data shared by policies and runtimes: requests, instances, the view, decisions.

Nothing here does I/O, reads a clock or imports a runtime.
"""

from baton.core.decisions import (
    ArrivalPlan,
    ChangeRole,
    Decision,
    DecisionError,
    DecodeChoice,
    Deflect,
    Executor,
    Migrate,
    MigrationMode,
    Watch,
    dispatch,
)
from baton.core.errors import BatonError, ConfigError, WorkloadError
from baton.core.instance import InstanceState, Role
from baton.core.request import Phase, Request, RequestState
from baton.core.view import ClusterView

__all__ = [
    "ArrivalPlan", "BatonError", "ChangeRole", "ClusterView", "ConfigError", "Decision", "DecisionError",
    "DecodeChoice", "Deflect", "Executor", "InstanceState", "Migrate", "MigrationMode", "Phase", "Request", "RequestState", "Role",
    "Watch", "WorkloadError", "dispatch",
]
