"""The NPU process environment: data, overrides, the profile.d script and its parser (dsctl.core.fleet.ascend_env)."""

from __future__ import annotations

import pytest

from dsctl.core.fleet.ascend_env import (
    EnvError,
    annotated_env,
    catalogue,
    check_variable,
    default_env,
    parse_env_file,
    profiles,
    render_env_file,
    resolve_env,
    warning,
)
from dsctl.errors import DsctlError, ExitStatus

TOOLKIT = "/usr/local/Ascend/ascend-toolkit/set_env.sh"
NNAL = "/usr/local/Ascend/nnal/atb/set_env.sh"
REQUIRED_VARIABLES = {
    "ASCEND_MAX_OP_CACHE_SIZE", "ASCEND_REMAIN_CACHE_SIZE_RATIO", "ASCEND_CACHE_PATH", "GE_USE_STATIC_MEMORY",
    "PYTORCH_NPU_ALLOC_CONF", "TASK_QUEUE_ENABLE", "ACL_OP_COMPILER_CACHE_MODE", "ACL_OP_COMPILER_CACHE_DIR",
    "HCCL_BUFFSIZE", "HCCL_OP_EXPANSION_MODE", "ATB_WORKSPACE_MEM_ALLOC_GLOBAL", "ATB_WORKSPACE_MEM_ALLOC_ALG_TYPE",
    "CPU_AFFINITY_CONF", "OMP_NUM_THREADS", "ASCEND_LAUNCH_BLOCKING", "ASCEND_GLOBAL_LOG_LEVEL",
    # field-practice.md's memory env, and names from our own references
    "ASCEND_CACHE_SIZE", "ENABLE_FUSION_ATTENTION", "ASCEND_WORKSPACE_SIZE",
    "NPU_MEMORY_FRACTION", "ACL_OP_INIT_MODE", "MINDIE_ASYNC_SCHEDULING_ENABLE", "HCCL_CONNECT_TIMEOUT",
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
        assert spec["confidence"] in {"official", "observed", "inferred", "field", "emulation"}, name
        if spec["confidence"] == "emulation":  # the lab's own knobs: never written unless an inventory sets them
            assert name.startswith("DSCTL_ENGINE_") and spec["default"] is None, name
        assert spec["reference"], name
        assert "default" in spec, name
        if spec["confidence"] == "field":
            assert spec["believed"] and spec["covered_by"], name


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


def test_the_field_guides_memory_env_is_accepted_as_written():
    env = resolve_env({"ASCEND_CACHE_SIZE": 6000000000, "GE_USE_STATIC_MEMORY": 1})
    assert env["ASCEND_CACHE_SIZE"] == "6000000000"
    assert env["GE_USE_STATIC_MEMORY"] == "1"


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        # ~6 PB: the on-disk operator cache is in MB, so the guide's byte count is a unit mistake there
        ({"ASCEND_MAX_OP_CACHE_SIZE": 6000000000}, "an integer number of MB from 1 to 1048576"),
        ({"ASCEND_CACHE_SIZE": 6 * 10**15}, "an integer number of bytes from 1 to 1099511627776"),
        ({"ASCEND_CACHE_SIZE": 0}, "e.g. 6000000000"),
        ({"ASCEND_WORKSPACE_SIZE": 2 * 2**40}, "e.g. 1073741824"),
        ({"GE_USE_STATIC_MEMORY": "yes"}, "expected one of 0, 1, 2, 3, 4"),
        ({"ENABLE_FUSION_ATTENTION": 2}, "expected one of 0, 1"),
        ({"MINDIE_ASYNC_SCHEDULING_ENABLE": "true"}, "expected one of 0, 1"),
        ({"ACL_OP_INIT_MODE": 3}, "expected one of 0, 1, 2"),
        ({"NPU_MEMORY_FRACTION": 1.2}, "a number above 0.0 and at most 1.0"),
        ({"NPU_MEMORY_FRACTION": 0}, "a number above 0.0 and at most 1.0"),
        ({"HCCL_CONNECT_TIMEOUT": 60}, "an integer number of seconds from 120 to 7200"),
    ],
)
def test_sizes_and_switches_are_bounded(overrides, fragment):
    message = env_error(overrides)
    assert message.startswith(f"dsctl_ascend_env.{next(iter(overrides))}: expected ")
    assert fragment in message


def test_a_byte_size_with_a_suffix_gets_the_number_of_bytes():
    assert env_error({"ASCEND_CACHE_SIZE": "6G"}).endswith("got '6G'; write 6442450944")


def test_names_from_our_references_take_their_documented_values():
    env = resolve_env({"NPU_MEMORY_FRACTION": 0.96, "ACL_OP_INIT_MODE": 1, "MINDIE_ASYNC_SCHEDULING_ENABLE": 1,
                       "HCCL_CONNECT_TIMEOUT": 7200})
    assert (env["NPU_MEMORY_FRACTION"], env["ACL_OP_INIT_MODE"], env["MINDIE_ASYNC_SCHEDULING_ENABLE"],
            env["HCCL_CONNECT_TIMEOUT"]) == ("0.96", "1", "1", "7200")
    assert all(warning(name) is None for name in env)  # documented or observed: no warning


def test_an_undocumented_name_is_a_one_line_warning_naming_the_documented_setting():
    line = warning("ASCEND_CACHE_SIZE")
    assert "\n" not in line
    assert line.startswith("ASCEND_CACHE_SIZE is not in CANN's environment variable reference")
    assert "believed to reserve about this many bytes" in line
    assert "PYTORCH_NPU_ALLOC_CONF=expandable_segments:True" in line
    assert warning("GE_USE_STATIC_MEMORY") is None  # in the CANN reference


def test_a_name_dsctl_does_not_know_is_written_with_a_warning():
    assert resolve_env({"HCCL_IF_BASE_PORT": 43432})["HCCL_IF_BASE_PORT"] == "43432"
    assert "written as given, its value unchecked" in warning("HCCL_IF_BASE_PORT")
    message = env_error({"HCCL_IF_BASE_PORT": {"a": 1}})
    assert message.startswith("dsctl_ascend_env.HCCL_IF_BASE_PORT: expected a one-line")


def test_a_typo_gets_a_suggestion():
    assert env_error({"HCCL_BUFSIZE": 200}).endswith("did you mean HCCL_BUFFSIZE?")
    assert env_error({"PYTORCH_NPU_ALOC_CONF": None}).endswith("did you mean PYTORCH_NPU_ALLOC_CONF?")


def test_one_rule_names_the_field_it_checks():
    assert check_variable("GE_USE_STATIC_MEMORY", 1, field="env") == "1"
    with pytest.raises(EnvError, match=r"^env\.ASCEND_CACHE_SIZE: expected an integer number of bytes"):
        check_variable("ASCEND_CACHE_SIZE", "lots", field="env")


# --------------------------------------------------------------------------- profiles

LONG_CONTEXT = {"ASCEND_CACHE_SIZE": "6000000000", "GE_USE_STATIC_MEMORY": "1",
                "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True", "ENABLE_FUSION_ATTENTION": "1",
                "ACL_OP_COMPILER_CACHE_MODE": "enable", "ASCEND_WORKSPACE_SIZE": "1073741824",
                "ATB_WORKSPACE_MEM_ALLOC_GLOBAL": "1"}


def test_the_long_context_profile_applies_the_field_guides_settings():
    env = resolve_env({}, profile="long-context")
    assert LONG_CONTEXT.items() <= env.items()
    assert default_env().keys() <= env.keys()  # laid over the defaults


def test_every_profile_value_passes_its_variables_check():
    for name, profile in profiles().items():
        for variable, entry in profile["variables"].items():
            assert check_variable(variable, entry["value"]) == entry["value"], (name, variable)
            assert entry["source"], (name, variable)


def test_explicit_entries_override_the_profile():
    env = resolve_env({"GE_USE_STATIC_MEMORY": None, "ASCEND_CACHE_SIZE": 2000000000}, profile="long-context")
    assert "GE_USE_STATIC_MEMORY" not in env
    assert env["ASCEND_CACHE_SIZE"] == "2000000000"


def test_an_unknown_profile_is_refused_naming_the_known_ones():
    with pytest.raises(EnvError, match=r"^dsctl_ascend_env_profile: no profile 'long'; known: long-context, or leave"):
        resolve_env({}, profile="long")


def test_each_value_says_where_it_comes_from_and_how_sure_that_is():
    entries = {e["name"]: e for e in annotated_env({"HCCL_CONNECT_TIMEOUT": 600, "ASCEND_WORKSPACE_SIZE": 2**31},
                                                   profile="long-context")}
    assert entries["ASCEND_CACHE_SIZE"] | {"warning": None} == {
        "name": "ASCEND_CACHE_SIZE", "value": "6000000000", "origin": "profile long-context", "source": "field guide",
        "confidence": "field practice, effect unknown", "warning": None}
    assert entries["ASCEND_CACHE_SIZE"]["warning"]
    assert (entries["GE_USE_STATIC_MEMORY"]["source"], entries["GE_USE_STATIC_MEMORY"]["confidence"]) == (
        "field guide", "documented")
    assert (entries["HCCL_CONNECT_TIMEOUT"]["origin"], entries["HCCL_CONNECT_TIMEOUT"]["source"]) == (
        "inventory", "CANN reference")
    assert entries["ASCEND_WORKSPACE_SIZE"]["origin"] == "inventory"
    assert entries["TASK_QUEUE_ENABLE"]["origin"] == "default"


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


def test_the_lab_engines_time_scale_is_a_checked_number():
    assert resolve_env({"DSCTL_ENGINE_TIME_SCALE": "0.25"})["DSCTL_ENGINE_TIME_SCALE"] == "0.25"
    for bad in ("0", "-1", "fast", "1000"):
        with pytest.raises(DsctlError, match="DSCTL_ENGINE_TIME_SCALE"):
            resolve_env({"DSCTL_ENGINE_TIME_SCALE": bad})
