"""Every `vllm serve` line dsctl renders, parsed by real vLLM 0.32's own argument parser.

deploy and tune render the launch lines of vllm-ascend instances from templates/ and cli/dsctl/data/engine_params.yaml;
until now only dsctl's stand-in ever read them.  Here vLLM's parser (the serve subcommand as `vllm` builds it, its
validation and AsyncEngineArgs.from_cli_args: tests/realvllm/vllm_argparse.py) reads, in one process:

* a launch line per value of every upstream engine parameter (each int at its bounds, each bool both ways, each
  enum choice, the JSON configs), plus one line with all of them, plus the multi-host head's and worker's lines;
* the flags the lab's stand-in accepts, against every option vLLM's parser has (the stand-in must refuse what vLLM
  refuses); and the stand-in's refusal of a fixed-batch knob, word for word against vLLM's own.
"""

from __future__ import annotations

import json
import shlex

import pytest

from dsctl.core.serving.service import engine_params, validate_services
from dsctl.core.serving.service_render import render_host
from dsctl.engine import __main__ as engine
from dsctl.lab import wheelhouse
from tests.realvllm.conftest import MODEL, parse_with_vllm

ENGINE = "vllm-ascend"
VERSION = "v0.13.0"
BASE = {"name": "chat", "engine": ENGINE, "model": "/models/DeepSeek-V2-Lite", "npus_per_instance": 2,
        "instances": 1, "allow_unauthenticated": True}
# Values of the parameters whose type alone does not give a meaningful one (each is what a site writes).
SAMPLES = {
    "quantization": ["ascend", "fp8"],
    "compilation_config": [{"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 8, 32]}],
    "speculative_config": [{"method": "deepseek_mtp", "num_speculative_tokens": 1}],
    "max_num_batched_tokens": [2048, 8192],
    "max_model_len": [4096, 32768],
    "max_num_seqs": [1, 256],
}


def values(name: str, entry: dict) -> list:
    """The values a site may give ``name`` that deploy renders as a flag: its bounds, both booleans, every choice."""
    if name in SAMPLES:
        return SAMPLES[name]
    kind = entry["type"]
    if kind == "bool":
        return [True, False]
    if kind in ("enum",) or "choices" in entry:
        return list(entry["choices"])
    if kind == "int":
        return sorted({entry.get("min", 1), min(entry.get("max", 64), 64)})
    if kind == "float":
        return [0.5, 0.9] if entry.get("le", 1.0) <= 1.0 else [1.0]
    if kind == "json":
        return [{}] if entry.get("shape") == "dict" else [[1, 8]]
    return ["x"]


def flag_params() -> dict[str, dict]:
    """The upstream vLLM parameters deploy renders as command-line flags (not --additional-config keys)."""
    return {name: entry for name, entry in engine_params(ENGINE).items()
            if "flag" in entry["render"] and entry.get("upstream", True)}


def launch_argv(params: dict) -> list[str]:
    """What follows `vllm serve` in the launch.sh deploy renders for one service with ``params``."""
    specs = validate_services("lab-01", [{**BASE, "params": params}], npu_count=8, vllm_ascend=VERSION,
                              serving_venv="/opt/dsctl/serving-venv", manager_default="supervisor")
    files = render_host(specs, npu_count=8, env={}, config_dir="/etc/dsctl/services", log_dir="/var/log/dsctl")
    (instance,) = files.values()
    (launch,) = [f.content for f in instance if f.role == "launch"]
    command = launch[launch.index("\nexec ") + 1:].replace("\\\n", " ")
    words = shlex.split(command.splitlines()[0])
    assert words[0] == "exec" and words[1].endswith("/vllm") and words[2] == "serve", words
    return words[3:]


def multinode_argvs() -> list[list[str]]:
    """The head's and a worker's `vllm serve` arguments of a two-node DP + EP instance (as test_multinode_render)."""
    from tests.unit.test_multinode_render import launch_words, nodes

    planned = nodes()
    out = []
    for host in ("lab-01", "lab-02"):
        words = launch_words(planned[host][0])
        at = words.index("serve")
        out.append([shlex.split(w)[0] if w.startswith("'") else w for w in words[at + 1:]])
    return out


FIXED_BATCH_LINES = [["/models/m", "--stream-num", "4"], ["/models/m", "--batch-size", "8"],
                     ["/models/m", "--max-num-seqs", "8", "--kv-sparse-threshold", "0.5"]]


def rendered_cases() -> list[tuple[str, object, list[str]]]:
    """(parameter, value, the `vllm serve` arguments deploy renders for it), the checkpoint path made the tiny
    model's (vLLM resolves it: with the hub offline, a path that does not exist is an error)."""
    params = flag_params()
    assert {"max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "enable_prefix_caching",
            "enforce_eager", "compilation_config", "block_size"} <= set(params)
    cases: list[tuple[str, object, list[str]]] = []
    for name, entry in params.items():
        for value in values(name, entry):
            cases.append((name, value, launch_argv({name: value})))
    together = {name: values(name, entry)[0] for name, entry in params.items()}
    cases.append(("all", together, launch_argv(together)))
    additional = {"multistream_overlap_shared_expert": True, "enable_shared_expert_dp": False}
    cases.append(("additional_config", additional, launch_argv(additional)))
    for k, argv in enumerate(multinode_argvs()):
        cases.append((f"multi-node {'head' if k == 0 else 'worker'}", None, argv))
    for _, _, argv in cases:
        assert argv[0].startswith("/models/"), argv
        argv[0] = str(MODEL)
    return cases


@pytest.fixture(scope="module")
def parsed(vllm_python):
    """One vLLM process parses every line (importing vLLM takes about 9 s)."""
    cases = rendered_cases()
    answer = parse_with_vllm(vllm_python, [argv for _, _, argv in cases] + FIXED_BATCH_LINES)
    results = answer["results"]
    return cases, results[:len(cases)], results[len(cases):], set(answer["options"])


def test_every_flag_deploy_renders_is_parsed_by_real_vllm(parsed):
    cases, results, _, _ = parsed
    refused = [(name, value, result["error"]) for (name, value, _), result in zip(cases, results, strict=True)
               if not result["ok"]]
    assert not refused, refused
    by_case = {(name, json.dumps(value, sort_keys=True)): result["options"]
               for (name, value, _), result in zip(cases, results, strict=True)}
    # vLLM read the values deploy meant, under the names deploy meant them for
    assert by_case[("max_num_seqs", "256")]["max_num_seqs"] == 256
    assert by_case[("enable_chunked_prefill", "false")]["enable_chunked_prefill"] is False
    assert by_case[("enable_prefix_caching", "true")]["enable_prefix_caching"] is True
    assert by_case[("enforce_eager", "true")]["enforce_eager"] is True
    assert by_case[("block_size", "128")]["block_size"] == 128
    head = next(options for (name, _), options in by_case.items() if name == "multi-node head")
    worker = next(options for (name, _), options in by_case.items() if name == "multi-node worker")
    assert head["headless"] is False and worker["headless"] is True
    assert head["data_parallel_size"] == worker["data_parallel_size"] == 4
    assert head["enable_expert_parallel"] is True


def stand_in() -> dict:
    namespace: dict = {}
    exec(compile(wheelhouse.STAND_IN_VLLM_MAIN, "stand-in vllm main", "exec"), namespace)  # noqa: S102 - our code
    return namespace


def test_the_lab_stand_in_accepts_no_flag_real_vllm_refuses(parsed):
    real = parsed[3]
    namespace = stand_in()
    known = set(namespace["serve_options"](engine.build_parser()))
    accepted = (known - namespace["ENGINE_ONLY_FLAGS"]) | namespace["VLLM_ONLY_FLAGS"]
    # the emulation's own controls are the only flags the stand-in takes that vLLM has not; sites never render them
    assert sorted(accepted - real - namespace["EMULATION_FLAGS"]) == []
    assert not namespace["EMULATION_FLAGS"] & real


def test_the_stand_in_refuses_a_fixed_batch_knob_in_vllms_own_words(parsed):
    namespace = stand_in()
    for argv, result in zip(FIXED_BATCH_LINES, parsed[2], strict=True):
        unknown = namespace["unrecognized"](argv[1:], engine.build_parser())
        assert result == {"ok": False, "error": "vllm: error: unrecognized arguments: " + " ".join(unknown)}, argv
