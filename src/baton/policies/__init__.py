"""Scheduling policies: pure, synchronous stages composed into a scheduler."""

from baton.policies.base import PolicyContext, Scheduler, Stage
from baton.policies.catalog import POLICIES, STAGE_TYPES, build_scheduler, scheduler_for, stage_types

__all__ = ["POLICIES", "PolicyContext", "STAGE_TYPES", "Scheduler", "Stage", "build_scheduler", "scheduler_for",
           "stage_types"]
