"""The live gateway: an OpenAI-compatible server that runs Baton's policies in front of
real engines (vLLM, SGLang) or emulators."""
