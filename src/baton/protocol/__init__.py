"""OpenAI-compatible wire format shared by the gateway and the engine emulator:
request validation, response and stream-chunk builders, SSE parsing, error bodies."""
