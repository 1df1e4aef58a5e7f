"""Load generation and its statistics: arrival processes, workloads and vLLM bench's metric definitions."""
