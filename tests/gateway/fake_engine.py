"""A misbehaving engine for the gateway's chaos tests: a real aiohttp server on
127.0.0.1 that speaks the completions API like the emulator (the token at position p has
id p and text " p"), except where the request's ``user`` field asks it to misbehave:

- ``500-body``: HTTP 500 with an OpenAI error body (a request the engine refuses);
- ``list`` / ``str`` / ``num``: HTTP 200 whose JSON (or stream chunk) is not an object;
- ``err-str``: HTTP 400 whose ``error`` is a string;
- ``vllm-old``: HTTP 400 with older vLLM's error body, at the top level with an integer code;
- ``flaky-K``: HTTP 500 (an OpenAI error body) for the first K requests in this mode, then normal answers;
- ``no-done``: every token and a finish reason, then the stream ends without [DONE];
- ``hang-after-N``: N tokens, then silence (only for prompts of 8 tokens or fewer, so a
  continuation elsewhere runs normally);
- ``die-after-N``: N tokens, then the connection is dropped.
- ``finish-then-die`` / ``finish-then-hang``: every token and the finish reason, then the
  connection is dropped, or goes silent, before [DONE];
- ``tokens-then-die``: every token asked for but no finish reason, then the connection is
  dropped.
- ``huge-usage``: a normal answer whose ``usage.prompt_tokens`` says 10^10.
- ``trail-now`` / ``trail-later``: a JSON (prefill) answer whose ``kv_transfer_params``
  name the prompt (``remote_prompt``), followed by a duplicate of the whole HTTP response:
  in the same write as the body's last byte, or 50 ms later while the connection idles.
  A streamed (decode) leg in these modes continues ``kv_transfer_params.remote_prompt``
  when given, as a decode engine continues the KV it pulled: a stale answer read by
  another request shows as another client's text.
- ``long-line``: a stream whose first line never ends: 1 MiB writes of one JSON string,
  up to 256 MiB or until the client closes; the bytes written are recorded as ``sent``
  in ``/fake/requests``.
- ``500-plain``: HTTP 500 with a plain-text body (as an engine whose template crashed);
- ``event-after-N``: N tokens, then an error event in the stream (only for prompts of 8
  tokens or fewer, so a continuation elsewhere runs normally).

``POST /fake/mode`` with ``{"mode": "500-body"}`` applies a mode to every request that
names none (``""`` ends it); ``POST /fake/rename`` with ``{"model": "other"}`` makes the
engine serve another model name (``/v1/models`` says so, and a request naming any other
model gets vLLM's 404).

With ``logprobs`` set, each streamed choice carries a completions-style logprobs object.

``POST /fake/metrics-hang`` makes /metrics hang; ``POST /fake/metrics-values`` with
``{"kv_cache_usage_perc": "NaN"}`` (any metric, any text) sets what /metrics reports (0 by
default); ``GET /fake/requests`` lists the requests received (path, headers, body).

Run: ``python -m tests.gateway.fake_engine --port P``.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from aiohttp import web

MODEL = "baton-emulated"


class Fake:
    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.metrics_hang = False
        self.values = {n: "0" for n in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")}
        self.mode = ""          # every request's mode unless it names one
        self.flaky: dict[str, int] = {}  # requests seen per flaky-K mode
        self.model = MODEL
        self.renamed = False

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/v1/models", lambda _r: web.json_response({"object": "list",
                                                                        "data": [{"id": self.model}]}))
        app.router.add_get("/health", lambda _r: web.json_response({"ok": True}))
        app.router.add_get("/fake/requests", lambda _r: web.json_response(self.requests))
        app.router.add_post("/fake/metrics-hang", self.hang_metrics)
        app.router.add_post("/fake/metrics-values", self.set_values)
        app.router.add_post("/fake/mode", self.set_mode)
        app.router.add_post("/fake/rename", self.rename)
        return app

    async def hang_metrics(self, _request: web.Request) -> web.Response:
        self.metrics_hang = True
        return web.json_response({"ok": True})

    async def set_values(self, request: web.Request) -> web.Response:
        self.values.update({str(k): str(v) for k, v in (await request.json()).items()})
        return web.json_response(self.values)

    async def set_mode(self, request: web.Request) -> web.Response:
        self.mode = str((await request.json())["mode"])
        return web.json_response({"mode": self.mode})

    async def rename(self, request: web.Request) -> web.Response:
        self.model, self.renamed = str((await request.json())["model"]), True
        return web.json_response({"model": self.model})

    async def metrics(self, _request: web.Request) -> web.Response:
        if self.metrics_hang:
            await asyncio.sleep(3600)
        text = "".join(f"vllm:{n}{{model_name=\"{MODEL}\"}} {v}\n" for n, v in self.values.items())
        return web.Response(text=text)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append({"headers": dict(request.headers), "body": body})
        prompt = body["prompt"] if isinstance(body["prompt"], list) else body["prompt"].split()
        mode, n = str(body.get("user") or self.mode), int(body.get("max_tokens") or 16)
        if self.renamed and body.get("model") != self.model:
            return web.json_response({"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                                "type": "NotFoundError", "code": 404}}, status=404)
        if mode == "500-plain":
            return web.Response(status=500, text="Internal Server Error")
        if mode == "500-body":
            return web.json_response({"error": {"message": "cannot encode", "type": "server_error"}}, status=500)
        if mode == "err-str":
            return web.json_response({"error": "bad request"}, status=400)
        if mode.startswith("flaky-"):
            self.flaky[mode] = self.flaky.get(mode, 0) + 1
            if self.flaky[mode] <= int(mode[6:]):
                return web.json_response({"error": {"message": "transient", "type": "server_error"}}, status=500)
        if mode == "vllm-old":
            return web.json_response({"object": "error", "message": "max_tokens is too large", "type":
                                      "BadRequestError", "param": None, "code": 400}, status=400)
        if mode.startswith("type-"):  # a 400 whose error type the engine made up
            return web.json_response({"error": {"message": "refused", "type": mode[5:]}}, status=400)
        if mode == "long-line" and body.get("stream"):
            return await self._long_line(request)
        if mode == "flood" and body.get("stream"):
            return await self._flood(request, prompt, n)
        if mode.startswith("trail-"):
            if not body.get("stream"):
                return await self._trailing(request, prompt, n, delayed=mode == "trail-later")
            prompt = (body.get("kv_transfer_params") or {}).get("remote_prompt", prompt)
        shape = {"list": [1, 2], "str": "x", "num": 7}.get(mode)
        if not body.get("stream"):
            if shape is not None:
                return web.json_response(shape)
            answer = self._answer(prompt, n)
            if mode == "huge-usage":
                answer["usage"]["prompt_tokens"] = 10**10
            return web.json_response(answer)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if shape is not None:
            await resp.write(b"data: " + json.dumps(shape).encode() + b"\n\n")
            return resp
        limit = int(mode.rsplit("-", 1)[1]) if mode.startswith(("hang-after-", "die-after-", "event-after-")) \
            else None
        for i in range(n):
            if limit is not None and i == limit and mode.startswith("event") and len(prompt) <= 8:
                await resp.write(b'data: {"error": {"message": "engine error", "type": "server_error"}}\n\n')
                return resp
            if limit is not None and i == limit:
                if mode.startswith("hang") and len(prompt) <= 8:
                    await asyncio.sleep(3600)
                if mode.startswith("die"):
                    request.transport.close()
                    return resp
            pos = len(prompt) + i
            choice = {"index": 0, "text": f" {pos}", "token_ids": [pos],
                      "finish_reason": "length" if i == n - 1 and mode != "tokens-then-die" else None}
            if body.get("logprobs"):
                choice["logprobs"] = {"tokens": [f" {pos}"], "token_logprobs": [-pos / 100]}
            chunk = {"id": "x", "object": "text_completion", "model": MODEL, "choices": [choice]}
            if i == 0 and isinstance(body["prompt"], list):
                chunk["prompt_token_ids"] = body["prompt"]
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await asyncio.sleep(0.005)
        if mode in ("finish-then-die", "tokens-then-die"):
            request.transport.close()
            return resp
        if mode == "finish-then-hang":
            await asyncio.sleep(3600)
        if mode != "no-done":
            await resp.write(b"data: [DONE]\n\n")
        return resp

    async def _flood(self, request: web.Request, prompt: list, n: int) -> web.StreamResponse:
        """``n`` tokens of 4 KiB of text each, as fast as the connection takes them."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(n):
            pos = len(prompt) + i
            choice = {"index": 0, "text": " x" * 2048, "token_ids": [pos], "finish_reason": None}
            await resp.write(b"data: " + json.dumps({"id": "x", "object": "text_completion", "model": MODEL,
                                                     "choices": [choice]}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def _long_line(self, request: web.Request) -> web.StreamResponse:
        record = self.requests[-1]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        record["sent"] = 0
        chunk = b"a" * (1 << 20)
        await resp.write(b'data: {"pad": "')
        while record["sent"] < 256 << 20 and not request.transport.is_closing():
            await resp.write(chunk)
            record["sent"] += len(chunk)
        return resp

    async def _trailing(self, request: web.Request, prompt: list, n: int, delayed: bool) -> web.StreamResponse:
        """A complete answer, then a duplicate of the whole response: bytes an engine
        should never write. The body's last byte goes out with the duplicate (or alone,
        the duplicate following 50 ms later), after the head and the rest of the body."""
        answer = dict(self._answer(prompt, n), kv_transfer_params={"remote_prompt": prompt})
        data = json.dumps(answer).encode()
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.content_length = len(data)
        await resp.prepare(request)
        await resp.write(data[:-1])
        await asyncio.sleep(0.01)  # the client has parsed the head: the end comes in another read
        duplicate = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
            len(data), data)
        transport = request.transport
        transport.write(data[-1:] if delayed else data[-1:] + duplicate)
        if delayed:  # the handler returns: the connection idles at the client when this lands
            asyncio.get_running_loop().call_later(0.05, lambda: transport.is_closing() or transport.write(duplicate))
        return resp

    @staticmethod
    def _answer(prompt: list, n: int) -> dict:
        text = "".join(f" {len(prompt) + i}" for i in range(n))
        return {"id": "x", "object": "text_completion", "model": MODEL,
                "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": n}}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args()
    web.run_app(Fake().app(), host="127.0.0.1", port=args.port, print=None, access_log=None,
                shutdown_timeout=0.2)


if __name__ == "__main__":
    main()
