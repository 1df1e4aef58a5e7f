#!/usr/bin/python
"""Read-only collector of what an Ascend host runs: version files, npu-smi output, disk, serving venv.

It only reads. Parsing happens on the controller (the ascend_facts action plugin hands the raw text to
dsctl.core.hostfacts.hoststate), so one tested parser serves roles, `dsctl check` and the lab alike.
Where each fact lives: shared/reference/ascend-interfaces.md section 7 ("Detecting installed state").
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: ascend_facts
short_description: Collect the raw state of an Ascend NPU host (read-only)
description:
  - Reads the driver, firmware and CANN version files, C(npu-smi info) and C(npu-smi info -t board -i N),
    free disk on the install path, memory, the run user and the serving venv's installed distributions.
  - Never changes the host; safe in check mode.
options:
  install_path:
    description: CANN root (the C(--install-path) given to the CANN installers).
    type: path
    default: /usr/local/Ascend
  env_file:
    description: The managed environment file whose content is returned for drift checks.
    type: path
  serving_venv:
    description: The serving virtualenv whose installed distributions are listed.
    type: path
  serving_python:
    description: The interpreter the serving venv is made from; its C(--version) output is returned.
    type: path
  run_user:
    description: The driver's run user.
    type: str
    default: HwHiAiUser
  run_group:
    description: The driver's run group.
    type: str
    default: HwHiAiUser
  instances:
    description:
      - Serving instances whose process to inspect (C(name), C(unit), C(manager) supervisor, systemd or container,
        C(runtime) for a container). For each, the CANN version directories its process has mapped
        (C(/proc/PID/maps): the libraries it loaded), so an instance left on a stack no longer active shows.
    type: list
    elements: dict
    default: []
author: dsctl
"""

RETURN = r"""
ascend_raw:
  description: Raw file contents and command outputs, parsed on the controller.
  returned: always
  type: dict
"""

import glob  # noqa: E402
import grp  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import pwd  # noqa: E402
import re  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

DRIVER_ROOT = "/usr/local/Ascend"  # the driver ignores --install-path (reference section 5.2)
NPU_SMI_CANDIDATES = ("/usr/local/bin/npu-smi", "/usr/local/sbin/npu-smi")
COMMAND_TIMEOUT_S = 30


def read_text(path, limit=1 << 20):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(limit)
    except OSError:
        return None


def os_release():
    text = read_text("/etc/os-release") or ""
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip('"')
    return {"id": values.get("ID"), "version_id": values.get("VERSION_ID"), "pretty_name": values.get("PRETTY_NAME")}


def mem_total_mb():
    for line in (read_text("/proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return None


def disk_of(path):
    probe = path
    while probe and not os.path.isdir(probe):
        probe = os.path.dirname(probe.rstrip("/")) or "/"
    stats = os.statvfs(probe)
    return {"path": probe, "free_mb": stats.f_bavail * stats.f_frsize // (1 << 20),
            "total_mb": stats.f_blocks * stats.f_frsize // (1 << 20)}


def toolkit_state(install_path, arch):
    home = os.path.join(install_path, "ascend-toolkit")
    dirs, kernels = {}, {}
    for info in sorted(glob.glob(os.path.join(home, "*", "*-linux", "ascend_toolkit_install.info"))):
        version = info[len(home) + 1:].split(os.sep)[0]
        if version == "latest":
            continue
        dirs[version] = read_text(info)
        kernels[version] = os.path.isdir(os.path.join(home, version, "opp_kernel"))
    latest = None
    link = os.path.join(home, "latest", "set_env.sh")
    if os.path.islink(link):
        # latest/ is a farm of relative links into ../<version>/ (reference section 4.4)
        latest = os.readlink(link).split("/")[1] if os.readlink(link).startswith("../") else None
    return dirs, kernels, latest


def nnal_dirs(install_path):
    """NNAL versions installed side by side: nnal/atb/<version>/ holding a version.info (latest -> <version>)."""
    home = os.path.join(install_path, "nnal", "atb")
    found = {}
    for info in sorted(glob.glob(os.path.join(home, "*", "version.info"))):
        version = info[len(home) + 1:].split(os.sep)[0]
        if version != "latest" and not os.path.islink(os.path.join(home, version)):
            found[version] = True
    return found


def run(module, argv):
    rc, out, err = module.run_command(argv, check_rc=False)
    return {"rc": rc, "stdout": out, "stderr": err}


def npu_smi_state(module):
    path = next((p for p in NPU_SMI_CANDIDATES if os.access(p, os.X_OK)), None)
    if path is None:
        return {"path": None, "info": None, "boards": {}}
    info = run(module, [path, "info"])
    boards = {}
    if info["rc"] == 0:
        npu_ids = sorted({int(m) for m in re.findall(r"^\|\s*(\d+)\s+\S*910\S*\s*\|", info["stdout"], re.M)})
        for npu_id in npu_ids:
            boards[str(npu_id)] = run(module, [path, "info", "-t", "board", "-i", str(npu_id)])
    return {"path": path, "info": info, "boards": boards}


PID_COMMANDS = {
    "supervisor": lambda unit, runtime: ["supervisorctl", "pid", unit],
    "systemd": lambda unit, runtime: ["systemctl", "show", "--property", "MainPID", "--value", unit],
    "container": lambda unit, runtime: [runtime or "docker", "inspect", "-f", "{{.State.Pid}}", unit],
}
MAX_MAPS_BYTES = 16 * 1024 * 1024  # a serving process maps a few thousand regions; bounded read


def instance_state(module, install_path, item):
    """The instance's main PID (None: not running) and the CANN version directories its process maps."""
    manager = str(item.get("manager") or "")
    command = PID_COMMANDS.get(manager)
    found = {"name": item.get("name"), "unit": item.get("unit"), "pid": None, "cann": []}
    if command is None or not item.get("unit"):
        return found
    result = run(module, command(str(item["unit"]), item.get("runtime")))
    text = (result.get("stdout") or "").strip()
    if result.get("rc") != 0 or not text.isdigit() or int(text) <= 0:
        return found
    found["pid"] = int(text)
    try:
        with open(f"/proc/{int(text)}/maps", encoding="utf-8", errors="replace") as handle:
            maps = handle.read(MAX_MAPS_BYTES)
    except OSError:
        return found
    prefix = os.path.join(install_path, "ascend-toolkit") + "/"
    versions = set()
    for line in maps.splitlines():
        path = line.split(None, 5)[5] if len(line.split(None, 5)) == 6 else ""
        if path.startswith(prefix):
            versions.add(path[len(prefix):].split("/", 1)[0])
    found["cann"] = sorted(v for v in versions if v and v != "latest")
    return found


def serving_state(venv):
    if not venv:
        return None
    packages = {}
    for metadata in glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "*.dist-info", "METADATA")):
        name = version = None
        for line in (read_text(metadata, 65536) or "").splitlines():
            if line.startswith("Name: "):
                name = line[6:].strip()
            elif line.startswith("Version: "):
                version = line[9:].strip()
            elif not line:
                break
        if name and version:
            packages[re.sub(r"[-_.]+", "-", name).lower()] = version
    python = None
    config = read_text(os.path.join(venv, "pyvenv.cfg")) or ""
    found = re.search(r"^version(?:_info)?\s*=\s*(\S+)", config, re.M)
    if found:
        python = found.group(1)
    return {"venv": venv, "exists": os.path.isdir(venv), "python": python, "packages": packages}


def python_version(module, python):
    """What ``<python> --version`` says (read-only; the version is judged on the controller)."""
    if not python:
        return None
    if not os.access(python, os.X_OK):
        return {"path": python, "rc": 127, "output": python + ": not found or not executable"}
    rc, out, err = module.run_command([python, "--version"], check_rc=False)
    return {"path": python, "rc": rc, "output": (out + err)[:4096]}


def user_state(user, group):
    try:
        pwd.getpwnam(user)
        user_exists = True
    except KeyError:
        user_exists = False
    try:
        grp.getgrnam(group)
        group_exists = True
    except KeyError:
        group_exists = False
    return {"name": user, "exists": user_exists, "group": group, "group_exists": group_exists}


def main():
    module = AnsibleModule(
        argument_spec={
            "install_path": {"type": "path", "default": DRIVER_ROOT},
            "env_file": {"type": "path"},
            "serving_venv": {"type": "path"},
            "serving_python": {"type": "path"},
            "run_user": {"type": "str", "default": "HwHiAiUser"},
            "run_group": {"type": "str", "default": "HwHiAiUser"},
            "instances": {"type": "list", "elements": "dict", "default": []},
        },
        supports_check_mode=True,
    )
    params = module.params
    install_path = params["install_path"].rstrip("/") or "/"
    arch = platform.machine()
    toolkit_dirs, kernels_dirs, toolkit_latest = toolkit_state(install_path, arch)
    upgrade_tools = glob.glob(os.path.join(DRIVER_ROOT, "driver", "**", "upgrade-tool"), recursive=True)
    # The firmware's own upgrade record decides --upgrade or --full (ascend-deployer task_firmware.yml:
    # find /usr/local/Ascend/firmware -regex '.*upgrade.*'), not whether a driver exists.
    firmware_records = sorted(glob.glob(os.path.join(DRIVER_ROOT, "firmware", "**", "upgrade*"), recursive=True))
    raw = {
        "collector_version": 1,
        "install_path": install_path,
        "arch": arch,
        "kernel": platform.release(),
        "os": os_release(),
        "boot_id": (read_text("/proc/sys/kernel/random/boot_id") or "").strip() or None,
        "mem_total_mb": mem_total_mb(),
        "disk": disk_of(install_path),
        "files": {
            "driver_version_info": read_text(os.path.join(DRIVER_ROOT, "driver", "version.info")),
            "firmware_version_info": read_text(os.path.join(DRIVER_ROOT, "firmware", "version.info")),
            "ascend_install_info": read_text("/etc/ascend_install.info"),
            "cann_install_info": read_text("/etc/Ascend/ascend_cann_install.info"),
            "toolkit_version_cfg": read_text(os.path.join(install_path, "ascend-toolkit", "latest", "version.cfg")),
            "opp_version_info": read_text(os.path.join(install_path, "ascend-toolkit", "latest", "opp",
                                                       "version.info")),
            "nnal_version_info": read_text(os.path.join(install_path, "nnal", "atb", "latest", "version.info")),
            "env_file": read_text(params["env_file"]) if params["env_file"] else None,
        },
        "toolkit_dirs": toolkit_dirs,
        "toolkit_latest": toolkit_latest,
        "kernels_dirs": kernels_dirs,
        "nnal_dirs": nnal_dirs(install_path),
        "npu_smi": npu_smi_state(module),
        "upgrade_tool": upgrade_tools[0] if upgrade_tools else None,
        "firmware_record": firmware_records[0] if firmware_records else None,
        "run_user": user_state(params["run_user"], params["run_group"]),
        "serving": serving_state(params["serving_venv"]),
        "serving_python": python_version(module, params["serving_python"]),
        "instances": [instance_state(module, install_path, item) for item in params["instances"][:256]],
    }
    module.exit_json(changed=False, ascend_raw=raw)


if __name__ == "__main__":
    main()
