"""Pure estimation and search: no torch, no vLLM, no Ray."""
