"""Start an emulator from command-line options."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from baton.core.errors import ConfigError
from baton.engine_model.flags import add_engine_flags, engine_from_flags
from baton.perf import presets

DEFAULT_MAX_MODEL_LEN = 32768

if TYPE_CHECKING:  # the server (aiohttp) is imported when an emulator is built: the CLI parser needs only the args
    from baton.emulator.server import Emulator


def add_emulate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--model", default="baton-emulated", help="served model name")
    p.add_argument("--preset", default=presets.DEFAULT_PRESET, help="perf preset timing the iterations")
    p.add_argument("--kv-blocks", type=int, help="KV capacity in blocks (default: from the engine flags)")
    p.add_argument("--time-scale", type=float, default=1.0, help="multiply every iteration time (2 = slower)")
    add_engine_flags(p.add_argument_group("engine flags (as vLLM's; the same as baton simulate's)"))
    p.add_argument("--nic-gbps", type=float, default=100.0, help="KV transfer bandwidth, Gbit/s")
    p.add_argument("--disaggregation-mode", choices=["null", "prefill", "decode"], default="null",
                   help="role for SGLang bootstrap requests")
    p.add_argument("--kv-hold-timeout-s", type=float, default=30.0,
                   help="free a remote-decode prefill's KV if nobody pulls it in this time")
    p.add_argument("--kv-events-config", metavar="JSON",
                   help="vLLM's KV events config, e.g. '{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", "
                        "\"endpoint\": \"tcp://*:5557\"}' (needs pyzmq and msgpack)")
    p.add_argument("--tokenizer", metavar="PATH",
                   help="a local tokenizer.json (or its model folder): prompts count in its tokens, as the "
                        "served model's would (default: one token per whitespace-separated word)")
    p.add_argument("--hidden-states", metavar="ZMQ_ADDRESS",
                   help="publish synthetic hidden states of tagged requests here, as Baton's vLLM plugin does "
                        "(needs pyzmq)")
    p.add_argument("--hidden-states-every", type=int, default=16, help="tokens between hidden states")
    p.add_argument("--hidden-states-key-file", metavar="PATH",
                   help="publish as a ZMQ CURVE server with the secret key of this certificate "
                        "(zmq.auth.create_certificates' NAME.key_secret); the gateway pins its public key")
    p.add_argument("--hidden-states-client-key", action="append", default=[], metavar="Z85",
                   help="admit only gateways with this CURVE public key (repeatable; needs the key file)")


def build_emulator(args: argparse.Namespace) -> "Emulator":
    """An emulator from parsed options; ConfigError names a bad value."""
    from baton.emulator.hidden import secret_key_from_file
    from baton.emulator.server import Emulator, EmulatorConfig

    perf = presets.build(args.preset)
    engine = engine_from_flags(args)
    if args.time_scale <= 0 or args.nic_gbps <= 0:
        raise ConfigError("--time-scale and --nic-gbps must be positive")
    kv_blocks = args.kv_blocks if args.kv_blocks is not None else perf.kv_tokens_for(engine.memory_flags()) // engine.block_size
    if kv_blocks <= 0:
        raise ConfigError("--kv-blocks: expected a positive integer")
    # a chat without max_tokens runs to the end of the context: the model's own limit, at most 32768
    max_model_len = engine.max_model_len or min(perf.max_model_len or DEFAULT_MAX_MODEL_LEN, DEFAULT_MAX_MODEL_LEN)
    if args.hidden_states_every <= 0:
        raise ConfigError("--hidden-states-every: expected a positive integer")
    secret = secret_key_from_file(args.hidden_states_key_file) if args.hidden_states_key_file else None
    if args.hidden_states_client_key and secret is None:
        raise ConfigError("--hidden-states-client-key: needs --hidden-states-key-file")
    config = EmulatorConfig(args.model, args.host, args.port, max_model_len, args.nic_gbps,
                            args.disaggregation_mode, args.kv_hold_timeout_s,
                            hidden_states=args.hidden_states, hidden_every_tokens=args.hidden_states_every,
                            hidden_secret_key=secret, hidden_client_keys=tuple(args.hidden_states_client_key),
                            tokenizer=args.tokenizer, kv_events=args.kv_events_config)
    from baton.emulator.engine_loop import LoopConfig  # the engine loop, only for a command that runs one
    return Emulator(config, LoopConfig(engine, kv_blocks, args.time_scale), perf)


def serve(emulator: "Emulator") -> None:
    """Serve until interrupted."""
    from aiohttp import web

    cfg = emulator.config
    print(f"baton emulate: {cfg.model} on http://{cfg.host}:{cfg.port} "
          f"({emulator.engine.config.kv_blocks} KV blocks)", flush=True)
    web.run_app(emulator.app(), host=cfg.host, port=cfg.port, print=None, handler_cancellation=True,
                access_log=None)
