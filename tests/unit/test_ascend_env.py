"""The NPU process environment: data, overrides, the profile.d script and its parser (dsctl.core.fleet.ascend_env)."""

from __future__ import annotations

import pytest

from dsctl.core.fleet.ascend_env import EnvError, catalogue, default_env, parse_env_file, render_env_file, resolve_env
from dsctl.errors import ExitStatus

TOOLKIT = "/usr/local/Ascend/ascend-toolkit/set_env.sh"
NNAL = "/usr/local/Ascend/nnal/atb/set_env.sh"
REQUIRED_VARIABLES = {
    "ASCEND_MAX_OP_CACHE_SIZE", "ASCEND_REMAIN_CACHE_SIZE_RATIO", "ASCEND_CACHE_PATH", "GE_USE_STATIC_MEMORY",
    "PYTORCH_NPU_ALLOC_CONF", "TASK_QUEUE_ENABLE", "ACL_OP_COMPILER_CACHE_MODE", "ACL_OP_COMPILER_CACHE_DIR",
    "HCCL_BUFFSIZE", "HCCL_OP_EXPANSION_MODE", "ATB_WORKSPACE_MEM_ALLOC_GLOBAL", "ATB_WORKSPACE_MEM_ALLOC_ALG_TYPE",
    "CPU_AFFINITY_CONF", "OMP_NUM_THREADS", "ASCEND_LAUNCH_BLOCKING", "ASCEND_GLOBAL_LOG_LEVEL",
}


def env_error(overrides) -> str:
    with pytest.raises(EnvError) as raised:
        resolve_env(overrides)
    assert raised.value.exit_status == ExitStatus.USAGE
    assert "\n" not in str(raised.value)
    return str(raised.value)


# --------------------------------------------------------------------------- the data


def test_every_variable_has_kind_purpose_source_and_confidence():
    variables = catalogue()
    assert REQUIRED_VARIABLES <= set(variables)
    for name, spec in variables.items():
        assert spec["kind"] in {"int", "float", "enum", "path", "string", "options", "cpu_affinity"}, name
        assert spec["purpose"] and spec["source"], name
        assert spec["confidence"] in {"official", "observed", "inferred"}, name
        assert "default" in spec, name


def test_every_default_passes_its_own_check():
    defaults = default_env()
    assert resolve_env(defaults) == defaults


def test_defaults():
    assert default_env() == {
        "ACL_OP_COMPILER_CACHE_MODE": "enable",
        "ASCEND_MAX_OP_CACHE_SIZE": "500",
        "ATB_WORKSPACE_MEM_ALLOC_ALG_TYPE": "3",
        "ATB_WORKSPACE_MEM_ALLOC_GLOBAL": "1",
        "OMP_NUM_THREADS": "1",
        "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
        "TASK_QUEUE_ENABLE": "1",
    }
    assert "GE_USE_STATIC_MEMORY" not in default_env()  # deprecated; left unset


# --------------------------------------------------------------------------- overrides


def test_overrides_merge_and_null_removes_a_default():
    env = resolve_env({"HCCL_BUFFSIZE": 1024, "TASK_QUEUE_ENABLE": 2, "OMP_NUM_THREADS": None,
                       "HCCL_OP_EXPANSION_MODE": "AIV", "ASCEND_MAX_OP_CACHE_SIZE": -1})
    assert env["HCCL_BUFFSIZE"] == "1024"
    assert env["TASK_QUEUE_ENABLE"] == "2"
    assert env["ASCEND_MAX_OP_CACHE_SIZE"] == "-1"
    assert "OMP_NUM_THREADS" not in env
    assert list(env) == sorted(env)


def test_none_and_empty_overrides_give_the_defaults():
    assert resolve_env(None) == resolve_env({}) == default_env()


def test_a_size_with_a_unit_suffix_is_refused_with_the_number_to_write():
    assert env_error({"HCCL_BUFFSIZE": "1G"}) == (
        "dsctl_ascend_env.HCCL_BUFFSIZE: expected an integer number of MB, got '1G'; write 1024"
    )


def test_the_issue_name_ascend_cache_size_does_not_exist():
    message = env_error({"ASCEND_CACHE_SIZE": 500})
    assert message.startswith("dsctl_ascend_env.ASCEND_CACHE_SIZE:")
    assert message.endswith("did you mean ASCEND_MAX_OP_CACHE_SIZE?")


def test_a_typo_gets_a_suggestion():
    assert env_error({"HCCL_BUFSIZE": 200}).endswith("did you mean HCCL_BUFFSIZE?")


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"HCCL_BUFFSIZE": 0}, "expected an integer number of MB >= 1, got 0"),
        ({"ASCEND_MAX_OP_CACHE_SIZE": 0}, "or -1 (no cache aging)"),
        ({"ASCEND_REMAIN_CACHE_SIZE_RATIO": 101}, "from 1 to 100"),
        ({"ATB_WORKSPACE_MEM_ALLOC_ALG_TYPE": 4}, "an integer from 0 to 3, got 4"),
        ({"TASK_QUEUE_ENABLE": True}, "expected one of 0, 1, 2, got True"),
        ({"HCCL_OP_EXPANSION_MODE": "aiv"}, "got 'aiv'; write AIV"),
        ({"ACL_OP_COMPILER_CACHE_MODE": "on"}, "expected one of enable, disable, force"),
        ({"GE_USE_STATIC_MEMORY": 5}, "expected one of 0, 1, 2, 3, 4"),
        ({"ASCEND_CACHE_PATH": "relative/dir"}, "expected an absolute path"),
        ({"ASCEND_CACHE_PATH": "/srv/cache dir"}, "letters, digits"),
        ({"ACL_OP_COMPILER_CACHE_DIR": 7}, "expected an absolute path"),
        ({"OMP_NUM_THREADS": 1.5}, "expected an integer, got 1.5"),
        ({"CPU_AFFINITY_CONF": 3}, "expected a mode (0, 1, 2)"),
        ({"CPU_AFFINITY_CONF": "0,npu0:0-3"}, "core ranges need mode 1 or 2"),
        ({"CPU_AFFINITY_CONF": "1,npu0:5-3"}, "not 'npu0:5-3'"),
        ({"ASCEND_GLOBAL_LOG_LEVEL": "DEBUG"}, "expected one of 0, 1, 2, 3, 4"),
    ],
)
def test_bad_values_are_refused_naming_the_variable(overrides, fragment):
    message = env_error(overrides)
    assert message.startswith(f"dsctl_ascend_env.{next(iter(overrides))}: ")
    assert fragment in message


def test_good_cpu_affinity_values():
    assert resolve_env({"CPU_AFFINITY_CONF": 1})["CPU_AFFINITY_CONF"] == "1"
    assert resolve_env({"CPU_AFFINITY_CONF": "1,npu0:0-1,npu1:2-5"})["CPU_AFFINITY_CONF"] == "1,npu0:0-1,npu1:2-5"


def test_the_overrides_must_be_a_mapping():
    assert env_error(["HCCL_BUFFSIZE=1024"]).startswith("dsctl_ascend_env: expected a mapping")


# --------------------------------------------------------------------------- PYTORCH_NPU_ALLOC_CONF


@pytest.mark.parametrize(
    "value",
    ["expandable_segments:True", "expandable_segments:False", "max_split_size_mb:250",
     "max_split_size_mb:32,garbage_collection_threshold:0.6", "expandable_segments:True,base_addr_aligned_kb:0"],
)
def test_good_allocator_settings(value):
    assert resolve_env({"PYTORCH_NPU_ALLOC_CONF": value})["PYTORCH_NPU_ALLOC_CONF"] == value


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("expandable_segments:true", "write True"),  # torch_npu compares the text: True/False only
        ("expandable_segments", "write each item as key:value"),
        ("max_split_size_mb:10", "max_split_size_mb as an integer number of MB >= 21"),
        ("max_split_size_mb:1G", "write 1024"),
        ("garbage_collection_threshold:1.0", "between 0.0 and 1.0 (exclusive)"),
        ("max_spilt_size_mb:250", "did you mean max_split_size_mb?"),
        ("expandable_segments:True,max_split_size_mb:250", "drop max_split_size_mb"),
        ("max_split_size_mb:250,max_split_size_mb:300", "give max_split_size_mb once"),
        ("", "comma-separated key:value pairs"),
    ],
)
def test_bad_allocator_settings(value, fragment):
    message = env_error({"PYTORCH_NPU_ALLOC_CONF": value})
    assert message.startswith("dsctl_ascend_env.PYTORCH_NPU_ALLOC_CONF: expected ")
    assert fragment in message


# --------------------------------------------------------------------------- the env file


def test_render_sources_cann_scripts_only_if_present_then_exports_sorted():
    text = render_env_file({"TASK_QUEUE_ENABLE": "1", "HCCL_BUFFSIZE": "1024"}, toolkit_set_env=TOOLKIT,
                           nnal_set_env=NNAL)
    lines = text.splitlines()
    assert "managed by dsctl, do not edit" in lines[0]
    assert f"[ -f {TOOLKIT} ] && . {TOOLKIT}" in lines
    assert f"[ -f {NNAL} ] && . {NNAL}" in lines
    assert lines[-2:] == ["export HCCL_BUFFSIZE='1024'", "export TASK_QUEUE_ENABLE='1'"]
    assert text.endswith("\n")


def test_values_and_paths_are_shell_quoted():
    text = render_env_file({"ASCEND_CACHE_PATH": "/srv/it's here"}, toolkit_set_env="/opt/with space/set_env.sh",
                           nnal_set_env=NNAL)
    assert "[ -f '/opt/with space/set_env.sh' ] && . '/opt/with space/set_env.sh'" in text
    assert "export ASCEND_CACHE_PATH='/srv/it'\"'\"'s here'" in text


@pytest.mark.parametrize(
    "env",
    [
        {},
        resolve_env({}),
        resolve_env({"ASCEND_CACHE_PATH": "/data/ascend-cache", "CPU_AFFINITY_CONF": "1,npu0:0-1",
                     "PYTORCH_NPU_ALLOC_CONF": "max_split_size_mb:250,garbage_collection_threshold:0.8"}),
        {"ODD_VALUE": "a'b\"c $HOME `x` \\ end", "EMPTY": ""},
    ],
)
def test_render_and_parse_round_trip(env):
    assert parse_env_file(render_env_file(env, toolkit_set_env=TOOLKIT, nnal_set_env=NNAL)) == env


def test_parse_reads_hand_edited_lines_for_drift():
    text = "# comment\nexport TASK_QUEUE_ENABLE=2\nHCCL_BUFFSIZE=\"512\"\n. /x/set_env.sh\n"
    assert parse_env_file(text) == {"TASK_QUEUE_ENABLE": "2", "HCCL_BUFFSIZE": "512"}


def test_an_invalid_name_is_not_rendered():
    with pytest.raises(EnvError):
        render_env_file({"bad-name": "1"}, toolkit_set_env=TOOLKIT, nnal_set_env=NNAL)
