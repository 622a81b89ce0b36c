"""Engine emulator: a real HTTP server that behaves like one vLLM instance (OpenAI API,
vLLM metric names, continuous batching timed by a ``perf`` preset, paged KV with
preemption, NixlConnector and SGLang-bootstrap KV handoff), so that the gateway can run
and be tested on a CPU-only machine."""
