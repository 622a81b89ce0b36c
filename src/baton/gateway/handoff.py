"""Request bodies for each leg of a request.

- NixlConnector (vLLM): the prefill leg is the body with ``max_tokens=1``, no stream,
  no ``min_tokens`` and ``kv_transfer_params.do_remote_decode``; the decode leg is the
  original body plus the ``kv_transfer_params`` the prefill returned (with
  ExampleConnector it returns none and the decode instance finds the KV by prompt).
- SGLang: both legs carry ``bootstrap_host``/``bootstrap_port``/``bootstrap_room`` and
  are sent at once.
- Continuation (migration and recovery without native KV migration): a completions
  request whose prompt is the prompt token ids plus the tokens generated so far, with
  ``max_tokens`` and ``min_tokens`` reduced by what was generated.
"""

from __future__ import annotations

from typing import Any

from baton.protocol.requests import CHAT, TRANSPORT_FIELDS, ParsedRequest

# Sampling fields a continuation keeps (a chat request continues as a completions request).
_CONTINUE_KEYS = ("model", "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids",
                  "ignore_eos", "presence_penalty", "frequency_penalty", "repetition_penalty",
                  "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output",
                  "logit_bias", "bad_words", "allowed_token_ids", "user", "priority")


def _clean(body: dict[str, Any]) -> dict[str, Any]:
    """A body without any KV-transport field (the server already drops the client's; this
    keeps every leg safe even if a body reached here another way)."""
    return {k: v for k, v in body.items() if k not in TRANSPORT_FIELDS}


def _streamed(body: dict[str, Any], with_ids: bool) -> dict[str, Any]:
    """The decode side always streams, so the gateway sees every token as it is made."""
    out = dict(_clean(body), stream=True, stream_options={"include_usage": True})
    if with_ids:
        out["return_token_ids"] = True
    return out


def prefill_body(parsed: ParsedRequest) -> dict[str, Any]:
    body = {k: v for k, v in _clean(parsed.body).items() if k not in ("min_tokens", "stream_options")}
    body.update(max_tokens=1, stream=False, kv_transfer_params={
        "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
        "remote_block_ids": None, "remote_host": None, "remote_port": None})
    if parsed.kind == CHAT and "max_completion_tokens" in body:
        body["max_completion_tokens"] = 1
    return body


def decode_body(parsed: ParsedRequest, transfer_params: dict[str, Any] | None, with_ids: bool) -> dict[str, Any]:
    body = _streamed(parsed.body, with_ids)
    if transfer_params:
        body["kv_transfer_params"] = transfer_params
    return body


def relayed_decode_body(parsed: ParsedRequest, transfer_params: dict[str, Any] | None) -> dict[str, Any]:
    """A decode leg whose answer goes to the client as the engine writes it (``baton
    sidecar``): the client's own body (streamed or not) plus the prefill's transfer params."""
    body = _clean(parsed.body)
    if transfer_params:
        body["kv_transfer_params"] = transfer_params
    return body


def colocated_body(parsed: ParsedRequest, with_ids: bool) -> dict[str, Any]:
    return _streamed(parsed.body, with_ids)


def sglang_bodies(parsed: ParsedRequest, host: str, port: int | None, room: int,
                  with_ids: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """(prefill body, decode body) with the same bootstrap fields."""
    boot = {"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": room}
    prefill = dict(_clean(parsed.body), stream=False, **boot)
    prefill.pop("stream_options", None)
    return prefill, dict(_streamed(parsed.body, with_ids), **boot)


def continuation_body(parsed: ParsedRequest, prompt_ids: list[int], generated_ids: list[int],
                      with_ids: bool = True, default_max_tokens: int = 16,
                      context_tokens: int | None = None) -> dict[str, Any]:
    """A completions body that continues a request after ``generated_ids``. The output
    budget carries over: the client's ``max_tokens``, else the engine default the
    original request ran under, minus what was made. vLLM's completions default is 16
    (``default_max_tokens``; it reads an explicit null as 16 too); its chat default is
    the rest of the context, which the target's ``max_model_len`` (``context_tokens``)
    gives when the engine reported it (else the completions default applies)."""
    body = {k: parsed.body[k] for k in _CONTINUE_KEYS if k in parsed.body}
    body["prompt"] = list(prompt_ids) + list(generated_ids)
    done = len(generated_ids)
    if parsed.max_tokens is None and parsed.kind == CHAT and context_tokens is not None:
        body["max_tokens"] = max(context_tokens - len(body["prompt"]), 1)
    else:
        budget = parsed.max_tokens if parsed.max_tokens is not None else default_max_tokens
        body["max_tokens"] = max(budget - done, 1)
    min_tokens = parsed.body.get("min_tokens")
    if isinstance(min_tokens, int) and min_tokens > done:
        body["min_tokens"] = min_tokens - done
    return _streamed(body, with_ids)
