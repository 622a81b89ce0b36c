"""Model-name discovery against a real HTTP server on 127.0.0.1."""

import asyncio


def test_model_discovery_survives_malformed_answers():
    """An engine whose /v1/models is malformed keeps being probed and stays unnamed; a
    proper answer gives its name and context length."""
    from aiohttp import web

    from baton.gateway.models import ModelNames

    async def run():
        answers = iter([{"data": {"id": "x"}}, ["not", "an", "object"], {"data": [1]},
                        {"data": [{"id": "real", "max_model_len": 4096}]}, {"data": [{"id": "renamed"}]}])

        async def models(_request):
            return web.json_response(next(answers))
        app = web.Application()
        app.router.add_get("/v1/models", models)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        names = ModelNames(None)
        import aiohttp
        async with aiohttp.ClientSession() as session:
            got = [await names.discover(session, 0, f"http://127.0.0.1:{port}", {}, aiohttp.ClientTimeout(total=5))
                   for _ in range(5)]
        await runner.cleanup()
        assert got == [None, None, None, "real", "real"] and names.served() == ["real"]  # a name stays
        assert names.asked == {0} and names.context_tokens == {0: 4096}  # vLLM's max_model_len
    asyncio.run(run())
