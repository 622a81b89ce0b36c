"""Engines from an InferencePool's pods: the gateway (or ``baton epp``) watches the pods
that match the pool's selector through the Kubernetes API (``kubernetes_asyncio``) and
keeps its engines equal to the ready ones.

A pod is an engine while it has an IP, its ``Ready`` condition is true and it is not being
deleted: its name is the engine's name, ``http://<pod IP>:<port>`` its URL, its role the
``role_label`` (llm-d's ``llm-d.ai/role``: ``prefill``, ``decode``, ``both``; anything else
``default_role``). A pod that stops being ready, goes or changes IP leaves (its requests
finish where they are); one whose label changes changes role. The watch starts again from
a fresh list after any error or at its end (``watch_timeout_s``), after ``retry_s``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from baton.core.errors import ConfigError
from baton.gateway.config import EngineSpec
from baton.gateway.engine_types import DEFAULT_METRIC_NAMES
from baton.gateway.pool import ROLES, DiscoverySettings

log = logging.getLogger("baton.gateway")

def engine_for(pod: Any, s: DiscoverySettings) -> EngineSpec | None:
    """The engine a pod is, or None while it cannot serve (no IP, not ready, deleting)."""
    meta, status = pod.metadata, pod.status
    if meta is None or status is None or meta.deletion_timestamp is not None or not status.pod_ip:
        return None
    if not any(c.type == "Ready" and c.status == "True" for c in status.conditions or ()):
        return None
    role = ROLES.get((meta.labels or {}).get(s.role_label, ""), s.role)
    host = f"[{status.pod_ip}]" if ":" in status.pod_ip else status.pod_ip
    return EngineSpec(f"http://{host}:{s.port}", role, meta.name, s.engine_type,
                      metric_names=dict(DEFAULT_METRIC_NAMES[s.engine_type]),
                      sidecar=f"http://{host}:{s.sidecar_port}" if s.sidecar_port and role.decodes else None)


class PodDiscovery:
    """Keeps ``fleet``'s engines (``gateway.fleet.Fleet``) equal to the pool's ready pods.
    Only engines it added are ever removed by it (the config's own stay)."""

    def __init__(self, settings: DiscoverySettings, fleet) -> None:
        self.settings, self.fleet, self.cluster = settings, fleet, fleet.cluster
        self.mine: dict[str, int] = {}  # pod name -> instance id, for the pods it added
        self.changes = 0  # engines added, removed or re-roled (tests and logs)

    @staticmethod
    def check_available() -> None:
        try:
            import kubernetes_asyncio  # noqa: F401 (only whether it is there)
        except ImportError:
            raise ConfigError("discovery needs the Kubernetes client (pip install 'baton[k8s]')") from None

    async def run(self) -> None:
        """List, then watch, again and again (see the module docstring)."""
        from kubernetes_asyncio import client
        async with client.ApiClient(await self._configuration()) as api:
            pods = client.CoreV1Api(api)
            while True:
                try:
                    await self._list_and_watch(pods)
                except asyncio.CancelledError:
                    raise
                except Exception as err:  # noqa: BLE001 - the API may fail; engines stay as they were
                    log.warning("pod discovery: %s: %s; listing again in %.0f s", type(err).__name__, err,
                                self.settings.retry_s)
                await asyncio.sleep(self.settings.retry_s)

    async def _configuration(self):
        from kubernetes_asyncio import client, config
        cfg = client.Configuration()
        if self.settings.api:
            cfg.host = self.settings.api
            return cfg
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            await config.load_kube_config(client_configuration=cfg)
        return cfg

    async def _list_and_watch(self, pods) -> None:
        from kubernetes_asyncio import watch
        s = self.settings
        selector = ",".join(f"{k}={v}" for k, v in sorted(s.selector.items()))
        listed = await pods.list_namespaced_pod(s.namespace, label_selector=selector)
        await self.sync({p.metadata.name: p for p in listed.items})
        stream = watch.Watch().stream(pods.list_namespaced_pod, s.namespace, label_selector=selector,
                                      resource_version=listed.metadata.resource_version,
                                      timeout_seconds=s.watch_timeout_s)
        async with stream as events:
            async for event in events:
                pod = event["object"]
                await self.update(pod.metadata.name, None if event["type"] == "DELETED" else pod)

    async def sync(self, pods: dict[str, Any]) -> None:
        """Make the engines equal to ``pods`` (a fresh list)."""
        for name in [n for n in self.mine if n not in pods]:
            await self.update(name, None)
        for name, pod in pods.items():
            await self.update(name, pod)

    async def update(self, name: str, pod: Any) -> None:
        """Pod ``name`` is now ``pod`` (None: gone)."""
        spec = None if pod is None else engine_for(pod, self.settings)
        iid = self.mine.get(name)
        if iid is not None and (spec is None or self.cluster.engines[iid].spec.url != spec.url):
            self.fleet.remove(self.mine.pop(name))
            self.changes += 1
            iid = None
        if spec is None:
            return
        if iid is None:
            if self.cluster.find(name) is not None:
                log.warning("pod discovery: pod %s has the name of a configured engine; not added", name)
                return
            self.mine[name] = await self.fleet.add(spec)
            self.changes += 1
        elif self.cluster.instances[iid].role is not spec.role:
            self.fleet.set_role(iid, spec.role, "discovery")
            self.changes += 1
