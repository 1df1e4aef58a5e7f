"""The NPU parameter plane (RoCE on Atlas A2): each NPU's address plan and the HCCL rank table built on it (pure)."""
