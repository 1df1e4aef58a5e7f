"""A configuration real vLLM refuses at start, refused by the emulated engine in the same words, and read the same
way by the health gate (playbooks/library/service_health.py's root cause).

vLLM 0.32 refuses a max_model_len beyond the checkpoint's positions with a pydantic ValidationError whose reason is
indented below it and whose last log line is a help link; the gate used to name the link.  Both engines run as
processes here (no server comes up: both stop while reading their configuration).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

from dsctl.lab import real_vllm
from tests.realvllm.conftest import MODEL, VENV

LIBRARY = Path(__file__).resolve().parents[2] / "playbooks" / "library"
SENTENCE = re.compile(r"Value error, User-specified max_model_len \((\d+)\) is greater than the derived max_model_len "
                      r"\(max_position_embeddings=(\d+\.\d+) or model_max_length=None in model's config\.json\)")


def service_health():
    spec = importlib.util.spec_from_file_location("service_health", LIBRARY / "service_health.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def refused(argv: list[str], env: dict[str, str] | None = None) -> list[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert done.returncode != 0, done.stdout + done.stderr
    return (done.stdout + done.stderr).splitlines()


def test_a_context_beyond_the_checkpoint_is_refused_alike_by_vllm_and_the_emulated_engine(vllm_python):
    health = service_health()
    real = refused([str(VENV / "bin" / "vllm"), "serve", str(MODEL), "--max-model-len", "65536", "--enforce-eager",
                    "--port", "1"], env=real_vllm.environment())
    emulated = refused([sys.executable, "-m", "dsctl.engine", "serve", "deepseek-r1-distill-qwen-7b",
                        "--max-model-len", "1048576", "--port", "1", "--startup", "0"])
    causes = {}
    for name, lines in (("vllm", real), ("emulated", emulated)):
        failure_class, cause = health.root_cause(lines)
        assert failure_class == "startup_error", (name, lines[-5:])
        assert cause.startswith("ValidationError: 1 validation error for ModelConfig: "
                                "Value error, User-specified max_model_len ("), (name, cause)
        assert "[type=" not in cause and "errors.pydantic.dev" not in cause, cause
        # the gate's "last line" is the reason, not pydantic's help link
        assert health.last_line(lines).startswith("Value error, User-specified max_model_len"), name
        causes[name] = SENTENCE.search(cause)
        assert causes[name], (name, cause)
    assert causes["vllm"].group(1, 2) == ("65536", "4096.0")
    # the same sentence, word for word, around each engine's own numbers
    assert SENTENCE.sub("", health.root_cause(real)[1]) == SENTENCE.sub("", health.root_cause(emulated)[1])
