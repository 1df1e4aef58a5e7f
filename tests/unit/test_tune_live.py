"""The live tune's pure parts: how a refused start is read, and what counts as the baseline's configuration."""

from __future__ import annotations

from dsctl.core.tune.search import CRASHES, Failure
from dsctl.services import tune_live

# inference_service's failure line (roles/inference_service/tasks/rollout.yml), as deploy returns it.
ROLLED_BACK = ("lab-02: failed at inference_service : Fail with the reason, the rollback's outcome and the failed "
               "configuration's log: chat-1: the new configuration failed: instance exited during start-up: {reason}; "
               "rolled back, the previous configuration serves again | log: INFO: Shutting down")


def test_a_vllm_value_error_at_start_up_is_a_bad_flag_with_vllms_words():
    reason = ("ValueError: max_num_batched_tokens (3475) is smaller than max_model_len (131072). This effectively "
              "limits the maximum sequence length")
    outcome = tune_live.start_failure([ROLLED_BACK.format(reason=reason)], {"host": "lab-02"})
    assert outcome.failure == Failure.BAD_FLAG
    assert outcome.detail == f"instance exited during start-up: {reason}"
    assert outcome.data["host"] == "lab-02"


def test_out_of_memory_and_a_health_timeout_are_classified_from_the_engines_words():
    oom = tune_live.start_failure([ROLLED_BACK.format(
        reason="ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`")], {})
    assert oom.failure == Failure.OUT_OF_MEMORY  # the memory words win over the ValueError
    slow = tune_live.start_failure([ROLLED_BACK.format(reason="not ready after 120 s")], {})
    assert slow.failure == Failure.START_TIMEOUT
    other = tune_live.start_failure(["lab-01: unreachable: ssh: connect to host: No route to host"], {})
    assert other.failure == Failure.ERROR and other.detail.startswith("lab-01: unreachable")


def test_the_cann_runtimes_allocation_failure_at_start_is_a_memory_failure():
    # field-practice.md's words; the tuner keeps the allocator's failure apart from vLLM's KV arithmetic
    for reason in ("[ERROR] RUNTIME: aclrtMalloc failed, size=2147483648, error code is 207001",
                   "RuntimeError: ACL_ERROR_RT_MEMORY_ALLOCATION_FAILED"):
        outcome = tune_live.start_failure([ROLLED_BACK.format(reason=reason)], {})
        assert outcome.failure == Failure.ACLRTMALLOC and outcome.failure in CRASHES, reason


def test_same_value_tells_booleans_from_numbers():
    assert tune_live.same_value(0.9, 0.9000000000000001) and not tune_live.same_value(True, 1)
    assert not tune_live.same_value(64, 96) and tune_live.same_value("a", "a")
