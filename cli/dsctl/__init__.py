"""dsctl: Ascend NPU fleets from bare OS to a tuned DeepSeek inference service."""

__version__ = "0.1.0"
