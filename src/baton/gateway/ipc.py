"""The wire between ``baton serve --workers N``'s relay workers and its control process:
ZMQ (a DEALER per relay, one ROUTER in control, over ``ipc://``) carrying msgpack lists.

Relay -> control:

- ``["hi", slot, generation, pid, flows]``: a relay (re)connected, or control restarted; ``flows``
  lists the requests it carries (``flow_record``), so a new control can book them again;
- ``["ops", [[op, req_id, *args], ...]]``: a request's steps, in order (``relay_control``);
  a batch goes out on the event loop's next turn, decode progress (``tk``) at most every
  ``report_interval_s``;
- among the steps, ``["call", call_id, verb, req_id, *args]``: a step that needs an answer
  (placement, a held prefill let go, a decode or prefill instance chosen again, whether a
  request is at fault); answered with ``["ret", call_id, ok, value]``;
- ``["metrics", call_id, samples]``: the answer to a ``pull`` (``call_id`` -1: sent
  unasked every ``COUNTS_S``, so a relay that dies takes at most that much with it);
- ``["hb"]``: alive, when nothing else went out for ``HEARTBEAT_S``.

Control -> relay: ``["snap", epoch, t0, hold_enabled, needs_keys, instances, specs, names]`` every
``SNAPSHOT_S`` (what a relay's deadlines and health checks read), ``["ret", ...]``,
``["migrate", req_id, target]``, ``["pull", call_id]`` and ``["hello?"]`` (control took the
relay for gone and released its requests: it says hello again, and they are booked anew).

Control sends what it has for a relay in one turn of its event loop as ``["many", [...]]``
(a ZMQ send costs tens of microseconds of CPU: one per turn, not one per message).

The supervisor (``gateway.workers``) tells control ``["dead", identity]`` when a relay exits.
"""

from __future__ import annotations

from typing import Any

from baton.gateway.upstream import UpstreamError
from baton.protocol.errors import ApiError

RELAYED_FOR = "X-Baton-Relayed-For"  # a relay names the client of a request it passes to control
HEARTBEAT_S = 0.2         # a relay with nothing to say says so this often
SNAPSHOT_S = 0.05         # control's view of health, roles and load goes to every relay this often
CONTROL_SILENT_S = 1.0    # a relay takes control for gone after this long without a snapshot
COUNTS_S = 1.0           # a relay sends its counts to control this often (and when /metrics asks)
RELAY_SILENT_S = 3.0      # control takes a relay for gone after this long without a word (the
                          # supervisor's notice of an exit comes first; this catches a hung one)


def pack(message: list) -> bytes:
    import msgpack
    return msgpack.packb(message, use_bin_type=True)


def unpack(frame: bytes) -> Any:
    import msgpack
    return msgpack.unpackb(frame, raw=False, strict_map_key=False)


def check_available() -> None:
    """pyzmq and msgpack are there (the ``workers`` extra), or a clear error."""
    from baton.core.errors import ConfigError
    try:
        import msgpack  # noqa: F401
        import zmq  # noqa: F401
    except ImportError as err:
        raise ConfigError(f"workers > 1 needs pyzmq and msgpack (dependencies of baton; reinstall it): {err}") from None


def error_fields(err: ApiError) -> list:
    return [err.status, err.message, err.err_type, err.param, err.code, err.retry_after_s]


def api_error(fields: list) -> ApiError:
    return ApiError(*fields)


def upstream_fields(err: BaseException) -> list:
    """What control's health and outlier accounting read of a failed leg."""
    if not isinstance(err, UpstreamError):
        return [str(err), False, None, False, False, False]
    return [str(err), err.connect, err.status, err.malformed, err.timed_out, True]


def upstream_error(fields: list) -> BaseException:
    message, connect, status, malformed, timed_out, upstream = fields
    if not upstream:
        return ConnectionError(message)
    return UpstreamError(message, connect=connect, status=status, malformed=malformed, timed_out=timed_out)
