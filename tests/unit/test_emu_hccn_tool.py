"""The emulated hccn_tool without a lab: its parsing, outputs, exit codes and /etc/hccn.conf, in a temporary root.

The wire (addresses on a plane interface, ICMP echoes) is a fake here; tests/lab/test_npu_plane.py runs the real one
between lab hosts.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dsctl import data
from dsctl.core.lab.plan import npu_address, npu_gateway, npu_netmask, npu_plane_cabling, plan_lab
from dsctl.emu import hccn_tool, hwstate, npu_net
from dsctl.emu.npu_net import LOST, NO_ROUTE, HccnConf, PortConfig
from dsctl.lab import faults, packages

CHIPS = data.load("chips")
MASK = npu_netmask()


@dataclass
class FakePlane:
    """The wire, recorded: what each NPU would have on the host's plane interface, and canned echo results."""

    on_wire: dict[int, PortConfig | None] = field(default_factory=dict)
    replies: dict[str, list] = field(default_factory=dict)  # destination -> results, one per echo
    echoes: list[tuple[str, str, int, int, float]] = field(default_factory=list)
    flushed: int = 0

    def apply(self, ports):
        for npu, cfg in ports.items():
            self.on_wire[npu] = None if cfg is None else PortConfig(**vars(cfg))

    def flush(self):
        self.flushed += 1
        self.on_wire.clear()

    def echo(self, source, destination, size, seq, timeout):
        self.echoes.append((source, destination, size, seq, timeout))
        results = self.replies.get(destination)
        return results.pop(0) if results else LOST


@dataclass
class Result:
    rc: int
    out: str
    err: str


class Host:
    """One emulated host's files in a temporary root: boards, cabling, this boot's driver, hccn.conf."""

    def __init__(self, root: Path):
        self.run_dir = root / "run"
        self.hw_dir = self.run_dir / "hw"
        self.hw_dir.mkdir(parents=True)
        spec = plan_lab(hosts=2, npus=8, chip="910B3", chips=CHIPS["chips"], name="ta", subnet="10.78.107.0/24")
        from dsctl.core.lab.plan import board_state

        hwstate.save_board(board_state("lab-01", 8, "910B3", CHIPS["chips"], CHIPS["bus_ids"]), self.hw_dir)
        hwstate.save_npu_plane(npu_plane_cabling(spec.name, spec.members[0], 8), self.hw_dir)
        hwstate.save_faults({}, self.hw_dir)
        self.boot(driver="24.1.rc3")
        self.conf_path = root / "etc" / "hccn.conf"
        self.conf_path.parent.mkdir()
        self.conf_path.write_text("")
        self.plane = FakePlane()
        self.ctx = npu_net.Context(HccnConf(self.conf_path), npu_net.DeviceState(self.run_dir), self.hw_dir,
                                   self.run_dir / "running.json", self.plane)

    def boot(self, driver: str | None) -> None:
        loaded = None if driver is None else {"version": driver, "compatible_version_fw": "[7.0.0,7.8.99]"}
        hwstate.save_running({"boot_id": "b1", "driver": loaded, "firmware": "7.5.0.1.129"},
                             path=self.run_dir / "running.json")

    def tool(self, command: str) -> Result:
        out, err = io.StringIO(), io.StringIO()
        rc = hccn_tool.run(command.split(), self.ctx, out, err)
        return Result(rc, out.getvalue(), err.getvalue())

    def ok(self, command: str) -> str:
        result = self.tool(command)
        assert result.rc == 0, (command, result)
        return result.out

    def conf(self) -> str:
        return self.conf_path.read_text()

    def set_ip(self, npu: int, address: str | None = None) -> str:
        return self.ok(f"-i {npu} -ip -s address {address or npu_address(1, npu)} netmask {MASK}")


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


# --- -ip -----------------------------------------------------------------------------------------------------

def test_ip_set_prints_the_success_line_persists_and_reads_back(host):
    assert host.set_ip(3) == "Cmd executed successfully!\n"

    assert host.ok("-i 3 -ip -g") == "ipaddr:10.83.0.11\nnetmask:255.255.255.0\n"
    assert host.conf() == "address_3=10.83.0.11\nnetmask_3=255.255.255.0\n"
    assert host.plane.on_wire[3] == PortConfig("10.83.0.11", MASK)


def test_setting_the_same_address_twice_leaves_hccn_conf_byte_for_byte_the_same(host):
    for npu in range(8):
        host.set_ip(npu)
    before = host.conf()

    host.set_ip(7)

    assert host.conf() == before


def test_setting_an_earlier_npu_again_moves_its_lines_to_the_end_as_the_real_tool_rewrites(host):
    # cfg.c cfg_inner_write_conf: the key's line is dropped and the new one appended. A role reads the state back
    # (-ip -g) and sets only what differs, which keeps the file as it is.
    host.set_ip(0)
    host.set_ip(1)
    host.set_ip(0)

    assert host.conf().splitlines() == ["address_1=10.81.0.11", "netmask_1=255.255.255.0",
                                        "address_0=10.80.0.11", "netmask_0=255.255.255.0"]


def test_an_unset_npu_has_no_ip_to_show(host):
    result = host.tool("-i 2 -ip -g")

    assert (result.rc, result.out, result.err) == (13, "", "Get ipconf failed, because no ip was preset there!\n")


@pytest.mark.parametrize("address", ["10.80.0", "10.80.0.256", "010.80.0.1", "10.80.0.1 ", "a.b.c.d", "0.0.0.0",
                                     "255.255.255.255", "10.80.0.1/24"])
def test_a_malformed_address_is_refused_and_changes_nothing(host, address):
    host.set_ip(0)
    before = host.conf()

    out, err = io.StringIO(), io.StringIO()
    rc = hccn_tool.run(["-i", "0", "-ip", "-s", "address", address, "netmask", MASK], host.ctx, out, err)

    assert (rc, out.getvalue(), err.getvalue()) == (6, "", "The ip address you configured is invalid!\n")
    assert host.conf() == before
    assert host.ok("-i 0 -ip -g") == "ipaddr:10.80.0.11\nnetmask:255.255.255.0\n"


@pytest.mark.parametrize("netmask", ["255.0.255.0", "255.255.255.1", "24", ""])
def test_a_netmask_that_is_not_contiguous_is_refused(host, netmask):
    rc = hccn_tool.run(["-i", "0", "-ip", "-s", "address", "10.80.0.11", "netmask", netmask], host.ctx,
                       io.StringIO(), io.StringIO())

    assert rc == 6 and host.conf() == ""


def test_an_address_another_npu_of_its_group_holds_or_in_the_vnic_subnet_is_a_conflict(host):
    host.set_ip(1, "10.80.0.50")

    same_group = host.tool(f"-i 2 -ip -s address 10.80.0.50 netmask {MASK}")
    vnic = host.tool(f"-i 3 -ip -s address 192.168.1.20 netmask {MASK}")
    other_group = host.tool(f"-i 4 -ip -s address 10.80.0.51 netmask {MASK}")

    assert (same_group.rc, same_group.err) == (7, "The ip address configured is conflicted!\n")
    assert vnic.rc == 7
    assert other_group.rc == 0


@pytest.mark.parametrize(("command", "rc", "err"), [
    ("-i 0 -ip -s address 10.80.0.11", 4, "The total count of input parameters is wrong!\n"),
    ("-i 0 -ip -s adress 10.80.0.11 netmask 255.255.255.0", 3, "Get unknown option!\n"),
    ("-i 0 -ip -x", 3, "Get unknown option!\n"),
    ("-i 0 -ip", 4, "The total count of input parameters is wrong!\n"),
    ("-i 0 -ip -g extra", 4, "The total count of input parameters is wrong!\n"),
])
def test_wrong_ip_arguments_name_the_problem_then_list_the_parameters(host, command, rc, err):
    result = host.tool(command)

    assert (result.rc, result.err) == (rc, err)
    assert result.out.startswith("[ hccn_tool -i devid -ip ] needs the following parameters:\n")
    assert "address %s" in result.out


# --- device ids, the driver, the command line --------------------------------------------------------------------

@pytest.mark.parametrize("device", ["8", "99", "100", "x", "-1", "０"])
def test_a_device_the_host_does_not_have_is_an_invalid_device_id(host, device):
    result = host.tool(f"-i {device} -ip -g")

    assert (result.rc, result.out, result.err) == (4, "", "Get invalid device id.\n")


def test_without_a_loaded_driver_every_device_is_invalid(host):
    host.boot(driver=None)  # installed, not rebooted: the driver of this boot is none

    for command in ("-i 0 -ip -g", f"-i 0 -ip -s address 10.80.0.11 netmask {MASK}", "-i 0 -link -g"):
        assert host.tool(command).rc == 4
    assert host.conf() == ""


@pytest.mark.parametrize(("command", "rc", "first_line"), [
    ("", 2, "Get invalid major cmd number. Please check your input."),
    ("-x 0 -ip -g", 1, 'Get invalid major cmd type. The valid major cmd type should be "-a" or "-i".'),
    ("-i 0 -foo -g", 3, "Get invalid major cmd."),
    ("-i 0", 3, "Get invalid major cmd."),
    ("-a -ip -g", 3, "Get invalid major cmd."),
])
def test_a_command_line_the_tool_cannot_parse(host, command, rc, first_line):
    result = host.tool(command)

    assert result.rc == rc and result.err.splitlines()[0] == first_line


def test_help_lists_the_emulated_commands_and_real_ones_it_lacks_say_so(host):
    assert "hccn_tool -i devid -ping\n" in host.ok("-h")

    missing = host.tool("-i 0 -tls -g")

    assert missing.rc == 1 and "not emulated" in missing.err and "dsctl lab" in missing.err


def test_hccn_conf_missing_fails_after_the_device_took_the_address(host):
    host.conf_path.unlink()

    result = host.tool(f"-i 0 -ip -s address 10.80.0.11 netmask {MASK}")

    assert result.rc == 29
    assert result.err == ("The hccn.conf can't access, cmd execute failed! pls check the conf file or cmd run "
                          "permission.\n")
    assert host.ok("-i 0 -ip -g").startswith("ipaddr:10.80.0.11")  # the device took it; nothing persisted it


# --- -netdetect, -gateway ----------------------------------------------------------------------------------------

def test_netdetect_is_zero_until_set_then_persisted(host):
    assert host.ok("-i 5 -netdetect -g") == "netdetect address: 0.0.0.0\n"

    host.ok(f"-i 5 -netdetect -s address {npu_gateway(5)}")

    assert host.ok("-i 5 -netdetect -g") == "netdetect address: 10.85.0.1\n"
    assert host.conf() == "netdetect_5=10.85.0.1\n"


@pytest.mark.parametrize(("address", "rc"), [("255.255.255.255", 37), ("10.85.0", 6)])
def test_netdetect_refuses_broadcast_and_malformed_addresses(host, address, rc):
    assert host.tool(f"-i 5 -netdetect -s address {address}").rc == rc
    assert host.tool("-i 5 -netdetect -s gateway 10.85.0.1").rc == 3


def test_gateway_needs_an_address_and_its_subnet(host):
    no_ip = host.tool("-i 0 -gateway -s gateway 10.80.0.1")
    host.set_ip(0)
    elsewhere = host.tool("-i 0 -gateway -s gateway 10.81.0.1")
    wrong_keyword = host.tool("-i 0 -gateway -s address 10.80.0.1")

    assert (no_ip.rc, no_ip.err) == (26, "Unable to configure gateway, because ip is not configured!\n")
    assert elsewhere.rc == 8 and "gateway doesn't match" in elsewhere.err
    assert wrong_keyword.rc == 3  # the real syntax is "-gateway -s gateway G"
    assert host.tool("-i 0 -gateway -g").rc == 2


def test_gateway_set_reads_back_with_the_ports_interface_and_follows_a_move_to_another_subnet(host):
    host.set_ip(6)
    host.ok("-i 6 -gateway -s gateway 10.86.0.1")

    assert host.ok("-i 6 -gateway -g") == "default gateway:10.86.0.1, Iface:eth6\n"
    assert "gateway_6=10.86.0.1\n" in host.conf()
    assert host.plane.on_wire[6].gateway == "10.86.0.1"

    host.set_ip(6, "10.99.0.11")  # out of the gateway's subnet: the persisted gateway goes, and the device's

    assert "gateway_6" not in host.conf()
    assert host.tool("-i 6 -gateway -g").err == "Get gateway failed, because no gateway was preset there!\n"


# --- links, health, LLDP -----------------------------------------------------------------------------------------

def test_a_downed_link_reports_down_and_fault_and_leaves_the_wire(host):
    host.set_ip(3)
    assert host.ok("-i 3 -link -g") == "link status: UP\n"

    hwstate.save_faults({"npu_link_down": [3]}, host.hw_dir)
    npu_net.sync(host.ctx)

    assert host.ok("-i 3 -link -g") == "link status: DOWN\n"
    assert host.ok("-i 3 -net_health -g") == "net health status: Fault\n"
    assert host.plane.on_wire[3] is None
    assert host.ok("-i 3 -ip -g") == "ipaddr:10.83.0.11\nnetmask:255.255.255.0\n"  # the NPU keeps its settings
    assert host.plane.on_wire[2] is None and host.ok("-i 2 -link -g") == "link status: UP\n"


def test_net_health_probes_the_detection_address_from_the_npu(host):
    assert host.ok("-i 0 -net_health -g") == "net health status: Init\n"
    host.set_ip(0)
    host.ok("-i 0 -netdetect -s address 10.80.0.1")
    host.plane.replies["10.80.0.1"] = [0.05, LOST, NO_ROUTE]

    assert [host.ok("-i 0 -net_health -g") for _ in range(3)] == [
        "net health status: Success\n", "net health status: Receive timeout\n", "net health status: Unreachable\n"]
    assert host.plane.echoes[0][:2] == ("10.80.0.11", "10.80.0.1")


def test_lldp_names_the_switch_port_the_npu_is_cabled_to(host):
    lines = host.ok("-i 2 -lldp -g").splitlines()

    assert "\tIfname: 200GE1/0/3" in lines
    assert lines[lines.index("System Description TLV") + 1].startswith("\tRouting switch of the dsctl lab")


def test_a_port_without_cabling_is_down(host):
    (host.hw_dir / hwstate.NPU_PLANE_FILE).unlink()

    assert host.ok("-i 0 -link -g") == "link status: DOWN\n"
    assert host.tool("-i 0 -lldp -g").rc == 1


# --- -ping -------------------------------------------------------------------------------------------------------

def test_ping_prints_the_devices_lines_and_three_round_trips(host):
    host.set_ip(0)
    host.plane.replies["10.80.0.12"] = [0.114, 0.067, 0.0631]

    result = host.tool("-i 0 -ping -g address 10.80.0.12")

    assert result.rc == 0 and result.err == ""
    assert result.out == ("device 0 PING 10.80.0.12\n"
                          "recv seq=0,time=0.114000ms\nrecv seq=1,time=0.067000ms\nrecv seq=2,time=0.063000ms\n"
                          "3 packets transmitted, 3 received, 0.00% packet loss\n")
    assert [echo[:4] for echo in host.plane.echoes] == [("10.80.0.11", "10.80.0.12", 4096, seq) for seq in range(3)]


def test_a_lost_packet_is_a_timeout_line_and_a_failed_command(host):
    host.set_ip(0)
    host.plane.replies["10.80.0.12"] = [LOST, 0.097, 0.066]

    result = host.tool("-i 0 -ping -g address 10.80.0.12 pkt 64")

    assert result.out.splitlines()[1:] == ["recv time out seq=0", "recv seq=1,time=0.097000ms",
                                           "recv seq=2,time=0.066000ms",
                                           "3 packets transmitted, 2 received, 33.33% packet loss"]
    assert (result.rc, result.err) == (1, "Command execute failed!\n")
    assert {echo[2] for echo in host.plane.echoes} == {64}


def test_ping_from_a_downed_link_fails_before_sending(host):
    host.set_ip(0)
    hwstate.save_faults({"npu_link_down": [0]}, host.hw_dir)

    result = host.tool("-i 0 -ping -g address 10.80.0.12")

    assert (result.rc, result.out, result.err) == (22, "", "Execute failed: Link status is down.\n")
    assert host.plane.echoes == []


@pytest.mark.parametrize(("command", "rc"), [
    ("-i 0 -ping -g address", 4),
    ("-i 0 -ping -g address 10.80.0.300", 6),
    ("-i 0 -ping -g address 10.80.0.12 pkt 70000", 1),
    ("-i 0 -ping -g address 10.80.0.12 pkt x", 1),
    ("-i 0 -ping -g address 10.80.0.12 count 3", 3),
    ("-i 0 -ping -s address 10.80.0.12", 3),
])
def test_ping_arguments_are_checked_as_the_real_tool_checks_them(host, command, rc):
    host.set_ip(0)

    assert host.tool(command).rc == rc
    assert host.plane.echoes == []


# --- -cfg recovery: what the driver does at every boot -----------------------------------------------------------

def test_recovery_re_applies_hccn_conf_to_every_npu(host):
    for npu in range(8):
        host.set_ip(npu)
        host.ok(f"-i {npu} -netdetect -s address {npu_gateway(npu)}")
        host.ok(f"-i {npu} -gateway -s gateway {npu_gateway(npu)}")
    conf = host.conf()
    (host.run_dir / npu_net.STATE_FILE).unlink()  # a boot: the devices hold nothing
    host.plane.flush()

    assert host.ok("-a -cfg recovery") == "Cmd executed successfully!\n"

    assert host.conf() == conf
    assert host.ok("-i 7 -ip -g") == "ipaddr:10.87.0.11\nnetmask:255.255.255.0\n"
    assert host.ok("-i 7 -gateway -g") == "default gateway:10.87.0.1, Iface:eth7\n"
    assert sorted(npu for npu, cfg in host.plane.on_wire.items() if cfg) == list(range(8))


def test_a_mistyped_entry_fails_its_npus_recovery_and_the_others_still_recover(host):
    host.conf_path.write_text("address_0=10.80.0.1l\nnetmask_0=255.255.255.0\n"
                              "address_1=10.81.0.11\nnetmask_1=255.255.255.0\n")

    result = host.tool("-a -cfg recovery")

    assert result.rc == 6 and result.err == "The ip address you configured is invalid!\n"
    assert host.tool("-i 0 -ip -g").rc == 13
    assert host.ok("-i 1 -ip -g").startswith("ipaddr:10.81.0.11")


# --- hccn.conf as the real tool reads and writes it --------------------------------------------------------------

def test_hccn_conf_reads_the_first_exact_key_and_writes_in_place(tmp_path):
    path = tmp_path / "hccn.conf"
    path.write_text("# site note\naddress_10=1.1.1.1\naddress_1=10.81.0.11\naddress_1=9.9.9.9\n")
    path.chmod(0o640)
    conf = HccnConf(path)

    assert conf.read("address_1") == "10.81.0.11" and conf.read("address_2") is None
    conf.write("address_1", "10.81.0.12")

    assert path.read_text() == "# site note\naddress_10=1.1.1.1\naddress_1=10.81.0.12\n"
    assert path.stat().st_mode & 0o777 == 0o640


def test_an_entry_appended_after_a_last_line_without_newline_is_glued_to_it(tmp_path):
    path = tmp_path / "hccn.conf"
    path.write_text("address_0=10.80.0.11")  # a hand edit without the final newline

    HccnConf(path).write("netmask_0", MASK)

    assert path.read_text() == "address_0=10.80.0.11netmask_0=255.255.255.0\n"  # what the real strcat does


def test_the_plane_puts_an_npu_in_a_table_of_its_own(monkeypatch):
    batches = []
    plane = npu_net.IpPlane("npu-plane")
    monkeypatch.setattr(plane, "_batch", lambda lines, force: batches.append((force, lines)))

    plane.apply({2: PortConfig("10.82.0.11", MASK, None, "10.82.0.1"), 3: None})

    assert batches[0] == (True, [
        "address flush dev npu-plane label npu-plane:2", "route flush table 102", "rule del pref 102",
        "address flush dev npu-plane label npu-plane:3", "route flush table 103", "rule del pref 103"])
    assert batches[1] == (False, [
        "address add 10.82.0.11/24 dev npu-plane noprefixroute label npu-plane:2",
        "route add 10.82.0.0/24 dev npu-plane src 10.82.0.11 table 102",
        "rule add from 10.82.0.11 lookup 102 pref 102",
        "route add default via 10.82.0.1 dev npu-plane src 10.82.0.11 table 102"])


# --- shipped with the driver ---------------------------------------------------------------------------------------

def run_zipapp(app, env, *args):
    return subprocess.run([sys.executable, str(app), *args], env=env, capture_output=True, text=True, timeout=60)


def rewritten(app: bytes, change) -> bytes:
    """The zipapp with each member's bytes passed through change(name, data)."""
    shebang, rest = app.split(b"\n", 1)
    out = io.BytesIO()
    out.write(shebang + b"\n")
    with zipfile.ZipFile(io.BytesIO(rest)) as old, zipfile.ZipFile(out, "w") as new:
        for info in old.infolist():
            new.writestr(info, change(info.filename, old.read(info)))
    return out.getvalue()


def test_the_driver_package_ships_hccn_tool_as_a_zipapp_that_runs_on_a_bare_python(tmp_path):
    entry, modules = packages.DRIVER_TOOLS["hccn_tool"]
    assert entry == "dsctl.emu.hccn_tool:main"
    app = tmp_path / "hccn_tool"
    app.write_bytes(packages.zipapp(entry, modules))
    env = {"PATH": os.environ.get("PATH", ""), "DSCTL_LAB_RUN_DIR": str(tmp_path / "run")}

    helped = run_zipapp(app, env, "-h")
    # No driver loaded in this boot (no running.json): the device lookup fails first, /etc is never read.
    query = run_zipapp(app, env, "-i", "0", "-ip", "-g")

    assert helped.returncode == 0 and "hccn_tool -i devid -ip\n" in helped.stdout
    assert (query.returncode, query.stderr) == (4, "Get invalid device id.\n")


def test_the_zipapp_runs_its_bytecode_and_falls_back_to_its_source_on_another_python(tmp_path):
    entry, modules = packages.DRIVER_TOOLS["hccn_tool"]
    built = packages.zipapp(entry, modules)
    env = {"PATH": os.environ.get("PATH", ""), "DSCTL_LAB_RUN_DIR": str(tmp_path / "run")}
    # Sources that cannot compile: the tool still runs, so what ran was the bytecode (no compile at each call).
    no_source = tmp_path / "no-source"
    no_source.write_bytes(rewritten(built, lambda name, data: b"raise SystemExit(99)\n" if name.endswith(
        "hccn_tool.py") else data))
    # Bytecode of another Python (its magic number): zipimport rejects it and compiles the source beside it.
    other_python = tmp_path / "other-python"
    other_python.write_bytes(rewritten(built, lambda name, data: b"\x00\x00" + data[2:] if name.endswith(".pyc")
                                       else data))

    for app in (no_source, other_python):
        result = run_zipapp(app, env, "-i", "0", "-ip", "-g")
        assert (result.returncode, result.stderr) == (4, "Get invalid device id.\n"), app


@pytest.mark.parametrize(("right", "wrong"), [("10.83.0.12", "10.38.0.12"), ("10.80.0.12", "10.80.0.21"),
                                              ("10.80.0.1", "10.80.0.11")])
def test_hccn_conf_wrong_swaps_two_digits_as_a_hand_edit_does(right, wrong):
    assert faults._mistype(right) == wrong
