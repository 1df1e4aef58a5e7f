"""The emulated ``hccn_tool`` of a lab host (/usr/local/Ascend/driver/tools/hccn_tool, linked from /usr/local/bin).

Standard library plus dsctl.emu.hwstate and dsctl.emu.npu_net only: it is packed into a zipapp by the driver .run
package, as npu-smi is.  What the NPUs hold, hccn.conf and the wire are dsctl.emu.npu_net's.

Emulated: ``-i <dev> -ip -s address A netmask M``, ``-ip -g``, ``-netdetect -s address A``, ``-netdetect -g``,
``-gateway -s gateway G``, ``-gateway -g``, ``-link -g``, ``-net_health -g``, ``-lldp -g``,
``-ping -g address A [pkt N]``, ``-cfg recovery`` (and ``-a -cfg recovery``), ``-h``.  Other real commands
(``-tls``, ``-mtu``, ``-inet6``, ``-link -s`` ...) say they are not emulated, on stderr, exit 1.

Where the behaviour comes from:

* **The driver's own hccn_tool source** (hicann/driver, src/custom/network/hccn/ascend910B: hccn_tool/main.c,
  cmd.c, cfg.c, tool_ops.c, tool_ops_ext.c, ossl_user_linux.h; hccn_product_ext/tool_cmd.c, tool_ops_ip.c,
  ds_net_ext.c; dsmi/ascend910B/ds_net.c), followed for: the command-line parsing order (argument count, then
  ``-i``/``-a``, then the command, then the device id, then the command's own arguments) and its errors; the
  return codes (``UDA_*``: 0x1004 for a bad device id, 0x2006 for a malformed address ...) whose low byte is the
  exit status, since ``main`` returns them; the messages (``Get invalid device id.``, ``The ip address you
  configured is invalid!``, ``Get ipconf failed, because no ip was preset there!``, ``Command execute failed!``
  ...) on stderr, ``Cmd executed successfully!`` on stdout after every successful set; the address checks
  (inet_pton, neither 0.0.0.0 nor 255.255.255.255, a contiguous netmask, not the same address as another NPU of
  its group of four, nothing in 192.168.1.0/24, the vNIC host's subnet); ``-ip -s`` dropping a persisted gateway
  that is no longer in the new subnet and re-applying the persisted one; the gateway needing an address and its
  subnet; hccn.conf written after the device was set; the ping's result judged by ``recv time out seq`` in the
  device's output, ``pkt`` being the packet's data length (default 4096, at most 65507); the output lines
  ``ipaddr:A`` / ``netmask:M``, ``default gateway:G, Iface:eth<dev>``, ``link status: UP|DOWN``, ``net health
  status: <Success|Socket fail|Receive timeout|Unreachable|Time exceeded|Fault|Init|...>``,
  ``device <dev> PING <A>`` before the device's ping output.
* **Field transcripts**, for what the device itself prints (the source only relays it): the ping lines
  ``recv seq=0,time=0.114000ms``, ``recv time out seq=0`` and ``3 packets transmitted, 2 received, 33.33% packet
  loss``, three packets per ping (a public "DeepseekV3 multi-node deployment" guide and a MindIE two-node guide;
  HIXL's and LMDeploy's Ascend guides: ``recv time out seq`` means not connected, ``0.00% packet loss`` means
  reachable); ``netdetect address: 11.12.165.1`` (the same DeepseekV3 guide, and the pattern MindCluster's
  collector parses; the open-source driver of 2026 prints ``netdetect addr:``, the field's drivers print this);
  ``net health status: Fault`` after a link is taken down (Ascend MindCluster's fault-injection guide) and
  ``Init`` while no detection address is set (a public vllm-ascend PD note: netdetect 0.0.0.0, net_health Init);
  ``link status: DOWN`` (Ascend mind-cluster devmanager/hccn, hccn.go); the LLDP neighbour's ``Ifname: 400GE1/1/5:1``
  port line and its ``System Description TLV`` line (the guides' ``grep Ifname``, MindCluster's get_conn_mode).
* **Guesses** (no capture found), marked where they are made: the LLDP block's other lines (lldptool's layout);
  the per-packet timeout (1 s) and the detection probe's (0.5 s); ``Receive timeout`` / ``Unreachable`` as the
  health of a detection peer that does not answer / that the NPU has no route to; a ping from an NPU whose link is
  down failing with ``Execute failed: Link status is down.`` (UDA_DSMI_LINK_IS_DOWN_ERR, in the driver's list)
  and ``-lldp -g`` failing with ``Command execute failed!`` then; the driver not loaded (installed, not rebooted)
  answering every ``-i`` command with ``Get invalid device id.`` (the device lookup is what fails first); only
  address, netmask, detection peer and gateway being recovered by ``-cfg recovery``.

The lab's NPUs are wired for real (dsctl.emu.npu_net): setting an address puts it on the host's plane interface,
``-ping`` sends ICMP echo requests from the NPU's address and prints the real round trips and losses.
"""

from __future__ import annotations

import ipaddress  # no start-up cost of its own: pathlib (dsctl.emu.hwstate) imports it through urllib.parse
import sys
from enum import IntEnum

from dsctl.emu import npu_net
from dsctl.emu.npu_net import Context, PortConfig

# This tool runs dozens of times per provision and most calls are queries: socket is imported only where addresses
# are parsed, and neither dataclasses nor typing is imported at run time (start-up cost, as in npu_net).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import TextIO


class Code(IntEnum):
    """The driver's UDA_* return codes (ossl_user_linux.h); the process exits with their low byte."""

    SUCCESS = 0x0
    MAJOR_CMD_TYPE = 0x1001
    MAJOR_CMD_NUM = 0x1002
    MAJOR_CMD_INVALID = 0x1003
    MAJOR_CMD_DEV_ID = 0x1004
    MAJOR_CMD_LEN = 0x1005
    PARAM_INVALID = 0x2001
    PARAM_OP_NOT_SUPPORT = 0x2003
    PARAM_CMD_COUNT = 0x2004
    PARAM_IP_INVALID = 0x2006
    PARAM_CONFLICT_IP_ADDR = 0x2007
    PARAM_DIFF_SEGMT_GTWY = 0x2008
    TOOL_SYS_NOT_ACCESS = 0x300C
    TOOL_GATEWAY_NO_IP_CONF = 0x301A
    TOOL_ACCESS_CONF_FILE = 0x301D
    TOOL_CONFIG_BROAD_ADDRESS = 0x3025
    DSMI_EXE = 0x4001
    DSMI_GATEWAY_NOT_PRESET = 0x4002
    DSMI_IPCONF_NOT_PRESET = 0x400D
    DSMI_LINK_IS_DOWN = 0x4016


MAJOR_FAMILY, PARAM_FAMILY = 0x1000, 0x2000

# (text, and whether the command's parameter list follows it), as cmd.c's uda_handle_*_err print them on stderr.
MESSAGES: dict[Code, tuple[str, bool]] = {
    Code.MAJOR_CMD_TYPE: ('Get invalid major cmd type. The valid major cmd type should be "-a" or "-i".\n'
                          "Enter [ hccn_tool -h ] for more details.", False),
    Code.MAJOR_CMD_INVALID: ("Get invalid major cmd.\nEnter [ hccn_tool -h ] for more details.", False),
    Code.MAJOR_CMD_NUM: ("Get invalid major cmd number. Please check your input.\n"
                         "Enter [ hccn_tool -h ] for more details.", False),
    Code.MAJOR_CMD_DEV_ID: ("Get invalid device id.", False),
    Code.MAJOR_CMD_LEN: ("Get invalid input param len.", False),
    Code.PARAM_INVALID: ("Get invalid parameters!", True),
    Code.PARAM_OP_NOT_SUPPORT: ("Get unknown option!", True),
    Code.PARAM_CMD_COUNT: ("The total count of input parameters is wrong!", True),
    Code.PARAM_IP_INVALID: ("The ip address you configured is invalid!", False),
    Code.PARAM_CONFLICT_IP_ADDR: ("The ip address configured is conflicted!", False),
    Code.PARAM_DIFF_SEGMT_GTWY: (
        "The segment of configured gateway doesn't match that of the configured ip adress!", False),
    Code.TOOL_SYS_NOT_ACCESS: ("permission denied: pls check this cmd run permission.", False),
    Code.TOOL_GATEWAY_NO_IP_CONF: ("Unable to configure gateway, because ip is not configured!", False),
    Code.TOOL_ACCESS_CONF_FILE: (
        "The hccn.conf can't access, cmd execute failed! pls check the conf file or cmd run permission.", False),
    Code.TOOL_CONFIG_BROAD_ADDRESS: ("Can not config broadcast address!", False),
    Code.DSMI_EXE: ("Command execute failed!", False),
    Code.DSMI_GATEWAY_NOT_PRESET: ("Get gateway failed, because no gateway was preset there!", False),
    Code.DSMI_IPCONF_NOT_PRESET: ("Get ipconf failed, because no ip was preset there!", False),
    Code.DSMI_LINK_IS_DOWN: ("Execute failed: Link status is down.", False),
}
SUCCESS_LINE = "Cmd executed successfully!"
RECOVERY_FAILED = "Recovery failed. Check '/var/log/hccn_tool/hccn_config.log' for details."

MAX_ARGC = 64          # cmd.h MAX_PARAM: argc must stay below it
MAX_ARGV_LEN = 900     # cmd.h MAX_ARGV_LEN
MAX_DEVICE_ID_LEN = 2  # cmd.h MAX_PHY_ID_LEN
GROUP_SIZE = 4         # tool.h TOOL_DEVICE_CHIP_ID_MAX: address conflicts are looked for among NPUs 0-3, or 4-
VNIC_HOST_NETWORK = ipaddress.ip_network("192.168.1.0/24")  # tool_ops.c is_ipaddr_conflict: refused for RoCE ports
PING_PACKETS = 3
PING_DEFAULT_DATA_LEN = 4096
PING_MAX_DATA_LEN = 65535 - 20 - 8
PING_TIMEOUT_S = 1.0       # guess: no capture shows the device's wait
DETECT_TIMEOUT_S = 0.5     # guess
DETECT_PAYLOAD = 56

# Real commands (cmd.c g_cmd_list, hccn_product_ext/cmd_ext.c) this emulation does not carry.
NOT_EMULATED = frozenset((
    "-adapt_status", "-arp", "-auto_downgrade", "-backpressure", "-bad_thd", "-bandwidth", "-cdr", "-context",
    "-cur_tc_buf", "-dcqcn", "-diagnostic", "-down_data", "-dscp_to_tc", "-dump", "-duplex", "-esd", "-eth_test",
    "-fec", "-fec_err", "-generic", "-hccs_ping", "-hilink_info", "-hw_stats", "-ip_route", "-ip_rule", "-link_stat",
    "-local_lldp", "-mac", "-mem_reserve", "-mtu", "-neigh", "-optical", "-optical_snr", "-pci", "-pcs", "-pfc",
    "-pfc_stat", "-pfc_storm", "-prio_tc", "-process", "-qp_info", "-reg", "-roce_test", "-route", "-scdr",
    "-scdr_reset", "-send_arp", "-serdes", "-shaping", "-speed", "-stat", "-stat_extra", "-status", "-tc_cfg",
    "-tc_qos", "-tc_stat", "-tls", "-tlsca", "-traceroute", "-udhcpc", "-udp", "-version", "-vnic", "-xsfp_reset",
))


class ToolError(Exception):
    def __init__(self, code: Code):
        super().__init__(code.name)
        self.code = code


class NotEmulated(Exception):
    """A real hccn_tool command or option the lab's emulation does not carry (lab-only message)."""


class Command:
    __slots__ = ("attr", "option", "help", "run")

    def __init__(self, attr: str, option: str, help: str, run: Callable[[Invocation, list[str]], Code]):
        self.attr = attr  # "-i" (per device) or "-a" (all devices)
        self.option = option
        self.help = help
        self.run = run


class Invocation:
    __slots__ = ("ctx", "out", "err", "npu", "is_get")

    def __init__(self, ctx: Context, out: TextIO, err: TextIO, npu: int = -1, is_get: bool = False):
        self.ctx = ctx
        self.out = out
        self.err = err
        self.npu = npu
        self.is_get = is_get  # a query: no "Cmd executed successfully!" after it

    def say(self, line: str) -> None:
        self.out.write(line + "\n")


# --- addresses, as the tool checks them -------------------------------------------------------------------------

def _pton(text: str) -> int | None:
    """inet_pton(AF_INET) (the C library's own: four decimal parts, no leading zeros), as an integer."""
    import socket  # lazily: queries parse no address, and socket costs more than the rest of the start-up

    try:
        return int.from_bytes(socket.inet_pton(socket.AF_INET, text), "big")
    except (OSError, ValueError):
        return None


def _check_address(text: str) -> None:
    value = _pton(text)
    if value is None or value in (0, 0xFFFFFFFF):
        raise ToolError(Code.PARAM_IP_INVALID)


def _check_netmask(text: str) -> None:
    value = _pton(text)
    if value is None or (value | ((value - 1) & 0xFFFFFFFF)) != 0xFFFFFFFF:
        raise ToolError(Code.PARAM_IP_INVALID)


def _same_segment(address: str, other: str, netmask: str) -> bool:
    a, b, mask = _pton(address), _pton(other), _pton(netmask)
    if a is None or b is None or mask is None:
        raise ToolError(Code.PARAM_IP_INVALID)
    return a & mask == b & mask


def _conflicts(npu: int, address: str, ports: dict[int, PortConfig]) -> bool:
    value = _pton(address)
    if value is not None and ipaddress.ip_address(value) in VNIC_HOST_NETWORK:
        return True
    group = range(0, GROUP_SIZE) if npu < GROUP_SIZE else range(GROUP_SIZE, 1 << 8)
    return any(other != npu and other in group and cfg.address == address for other, cfg in ports.items())


def _set_address(inv: Invocation, ports: dict[int, PortConfig], address: str, netmask: str) -> None:
    """What tool_ip_set_address does to the device: conflict, address and mask checks, then the port holds it."""
    if _conflicts(inv.npu, address, ports):
        raise ToolError(Code.PARAM_CONFLICT_IP_ADDR)
    _check_address(address)
    _check_netmask(netmask)
    cfg = ports.setdefault(inv.npu, PortConfig())
    cfg.address, cfg.netmask = address, netmask
    if cfg.gateway is not None and not _same_segment(address, cfg.gateway, netmask):
        cfg.gateway = None  # a gateway outside the new subnet is no route any more


def _read_conf(inv: Invocation, name: str) -> str | None:
    try:
        return inv.ctx.conf.read(npu_net.conf_key(name, inv.npu))
    except npu_net.ConfAccessError:
        raise ToolError(Code.TOOL_ACCESS_CONF_FILE) from None


def _write_conf(inv: Invocation, name: str, value: str) -> None:
    try:
        inv.ctx.conf.write(npu_net.conf_key(name, inv.npu), value)
    except npu_net.ConfAccessError:
        raise ToolError(Code.TOOL_ACCESS_CONF_FILE) from None


def _delete_conf(inv: Invocation, name: str) -> None:
    try:
        inv.ctx.conf.delete(npu_net.conf_key(name, inv.npu))
    except npu_net.ConfAccessError:
        raise ToolError(Code.TOOL_ACCESS_CONF_FILE) from None


def _commit(inv: Invocation, ports: dict[int, PortConfig]) -> None:
    inv.ctx.state.save(ports)
    try:
        inv.ctx.put_on_wire([inv.npu], ports)
    except OSError:
        raise ToolError(Code.DSMI_EXE) from None


# --- the commands ----------------------------------------------------------------------------------------------

def _refuse_inet6(args: list[str]) -> None:
    if args and args[0] == "-inet6":
        raise NotEmulated("-inet6 (IPv6)")


def cmd_ip(inv: Invocation, args: list[str]) -> Code:
    if not args:
        raise ToolError(Code.PARAM_CMD_COUNT)
    _refuse_inet6(args)
    if args[0] == "-g":
        inv.is_get = True
        if len(args) != 1:
            raise ToolError(Code.PARAM_CMD_COUNT)
        cfg = inv.ctx.state.load().get(inv.npu)
        if cfg is None or cfg.address is None:
            raise ToolError(Code.DSMI_IPCONF_NOT_PRESET)
        inv.say(f"ipaddr:{cfg.address}")
        inv.say(f"netmask:{cfg.netmask}")
        return Code.SUCCESS
    if args[0] != "-s":
        raise ToolError(Code.PARAM_OP_NOT_SUPPORT)
    if len(args) != 5:
        raise ToolError(Code.PARAM_CMD_COUNT)
    given = {"address": "", "netmask": ""}
    for key, value in ((args[1], args[2]), (args[3], args[4])):
        if key not in given:
            raise ToolError(Code.PARAM_OP_NOT_SUPPORT)
        given[key] = value
    address, netmask = given["address"], given["netmask"]
    with inv.ctx.state.locked():
        ports = inv.ctx.state.load()
        _set_address(inv, ports, address, netmask)
        _commit(inv, ports)
        # tool_set_ipaddr_recovery: a persisted gateway outside the new subnet is dropped, the persisted one
        # (if any) re-applied, then the address and mask are persisted.
        persisted_gateway = _read_conf(inv, "gateway")
        if persisted_gateway is not None and not _same_segment(address, persisted_gateway, netmask):
            _delete_conf(inv, "gateway")
            persisted_gateway = None
        if persisted_gateway is not None:
            _check_address(persisted_gateway)
            ports[inv.npu].gateway = persisted_gateway
            _commit(inv, ports)
        _write_conf(inv, "address", address)
        _write_conf(inv, "netmask", netmask)
    return Code.SUCCESS


def cmd_netdetect(inv: Invocation, args: list[str]) -> Code:
    if not args:
        raise ToolError(Code.PARAM_CMD_COUNT)
    _refuse_inet6(args)
    if args[0] == "-g":
        inv.is_get = True
        if len(args) != 1:
            raise ToolError(Code.PARAM_CMD_COUNT)
        cfg = inv.ctx.state.load().get(inv.npu)
        inv.say(f"netdetect address: {(cfg.netdetect if cfg else None) or '0.0.0.0'}")
        return Code.SUCCESS
    if args[0] != "-s":
        raise ToolError(Code.PARAM_OP_NOT_SUPPORT)
    if len(args) != 3:
        raise ToolError(Code.PARAM_CMD_COUNT)
    if args[1] != "address":
        raise ToolError(Code.PARAM_OP_NOT_SUPPORT)
    address = args[2]
    value = _pton(address)
    if value is None:
        raise ToolError(Code.PARAM_IP_INVALID)
    if value == 0xFFFFFFFF:
        raise ToolError(Code.TOOL_CONFIG_BROAD_ADDRESS)
    with inv.ctx.state.locked():
        ports = inv.ctx.state.load()
        ports.setdefault(inv.npu, PortConfig()).netdetect = address
        _commit(inv, ports)
        _write_conf(inv, "netdetect", address)
    return Code.SUCCESS


def cmd_gateway(inv: Invocation, args: list[str]) -> Code:
    if not args:
        raise ToolError(Code.PARAM_CMD_COUNT)
    _refuse_inet6(args)
    if args[0] == "-g":
        inv.is_get = True
        if len(args) != 1:
            raise ToolError(Code.PARAM_CMD_COUNT)
        cfg = inv.ctx.state.load().get(inv.npu)
        if cfg is None or cfg.gateway is None:
            raise ToolError(Code.DSMI_GATEWAY_NOT_PRESET)
        inv.say(f"default gateway:{cfg.gateway}, Iface:eth{inv.npu}")
        return Code.SUCCESS
    if args[0] != "-s":
        raise ToolError(Code.PARAM_OP_NOT_SUPPORT)
    if len(args) != 3:
        raise ToolError(Code.PARAM_CMD_COUNT)
    if args[1] != "gateway":
        raise ToolError(Code.PARAM_OP_NOT_SUPPORT)
    gateway = args[2]
    with inv.ctx.state.locked():
        ports = inv.ctx.state.load()
        cfg = ports.get(inv.npu)
        if cfg is None or cfg.address is None:
            raise ToolError(Code.TOOL_GATEWAY_NO_IP_CONF)
        if not _same_segment(cfg.address, gateway, cfg.netmask or "0.0.0.0"):
            raise ToolError(Code.PARAM_DIFF_SEGMT_GTWY)
        cfg.gateway = gateway
        _commit(inv, ports)
        _write_conf(inv, "gateway", gateway)
    return Code.SUCCESS


def cmd_link(inv: Invocation, args: list[str]) -> Code:
    if not args:
        raise ToolError(Code.PARAM_CMD_COUNT)
    if args[0] == "-g":
        inv.is_get = True
        if len(args) != 1:
            raise ToolError(Code.PARAM_OP_NOT_SUPPORT)
        inv.say(f"link status: {'UP' if inv.ctx.link_up(inv.npu) else 'DOWN'}")
        return Code.SUCCESS
    if args[0] == "-s":
        raise NotEmulated("-link -s")
    raise ToolError(Code.PARAM_OP_NOT_SUPPORT)


def _health(inv: Invocation) -> str:
    if not inv.ctx.link_up(inv.npu):
        return "Fault"
    cfg = inv.ctx.state.load().get(inv.npu)
    if cfg is None or cfg.address is None or cfg.netdetect in (None, "0.0.0.0") or inv.ctx.plane is None:
        return "Init"
    try:
        result = inv.ctx.plane.echo(cfg.address, cfg.netdetect, DETECT_PAYLOAD, 0, DETECT_TIMEOUT_S)
    except OSError:
        return "Socket fail"
    if isinstance(result, float):
        return "Success"
    return "Unreachable" if result == npu_net.NO_ROUTE else "Receive timeout"  # guesses (module docstring)


def cmd_net_health(inv: Invocation, args: list[str]) -> Code:
    if len(args) != 1:
        raise ToolError(Code.PARAM_CMD_COUNT)
    if args[0] != "-g":
        raise ToolError(Code.PARAM_OP_NOT_SUPPORT)
    inv.is_get = True
    inv.say(f"net health status: {_health(inv)}")
    return Code.SUCCESS


def cmd_lldp(inv: Invocation, args: list[str]) -> Code:
    if len(args) != 1:
        raise ToolError(Code.PARAM_CMD_COUNT)
    if args[0] != "-g":
        raise ToolError(Code.PARAM_OP_NOT_SUPPORT)
    inv.is_get = True
    cabling = inv.ctx.cabling()
    if not cabling or not inv.ctx.link_up(inv.npu):
        raise ToolError(Code.DSMI_EXE)  # guess: no neighbour heard on a dead link
    switch, port = cabling["switch"], cabling["ports"][inv.npu]
    # Guess: lldptool's layout; the Ifname line and the description after its TLV line are what the guides read.
    for line in (
        "Chassis ID TLV", f"\tMAC: {switch['chassis_mac']}",
        "Port ID TLV", f"\tIfname: {port}",
        "Time to Live TLV", "\t121",
        "Port Description TLV", f"\t{port}",
        "System Name TLV", f"\t{switch['name']}",
        "System Description TLV", f"\t{switch['description']}",
        "System Capabilities TLV", "\tSystem capabilities:  Bridge, Router", "\tEnabled capabilities: Bridge, Router",
        "Management Address TLV", f"\tIPv4: {switch['management_address']}", "\tIfindex: 1",
        "End of LLDPDU TLV",
    ):
        inv.say(line)
    return Code.SUCCESS


def _ping_args(args: list[str]) -> tuple[str, int]:
    address, data_len = "0.0.0.0", PING_DEFAULT_DATA_LEN
    index = 1
    while index < len(args):
        name = args[index]
        if name not in ("pkt", "address", "ipv6_address"):
            raise ToolError(Code.PARAM_OP_NOT_SUPPORT)
        if index + 1 >= len(args):
            raise ToolError(Code.PARAM_CMD_COUNT)
        value = args[index + 1]
        if name == "pkt":
            digits = value.strip().removeprefix("+")
            if not digits.isdigit() or int(digits) > PING_MAX_DATA_LEN:
                raise ToolError(Code.PARAM_INVALID)
            data_len = int(digits)
        elif name == "address":
            if _pton(value) is None:
                raise ToolError(Code.PARAM_IP_INVALID)
            address = value
        else:
            raise ToolError(Code.PARAM_INVALID)  # "Please use [address] instead of [ipv6_address]"
        index += 2
    return address, data_len


def _rtt(ms: float) -> str:
    return f"{round(ms, 3):.6f}"  # the device measures in microseconds: recv seq=0,time=0.114000ms


def cmd_ping(inv: Invocation, args: list[str]) -> Code:
    if len(args) < 3:
        raise ToolError(Code.PARAM_CMD_COUNT)
    _refuse_inet6(args)
    if args[0] != "-g":
        raise ToolError(Code.PARAM_OP_NOT_SUPPORT)
    inv.is_get = True
    if len(args) > 5:
        raise ToolError(Code.PARAM_CMD_COUNT)
    destination, data_len = _ping_args(args)
    if not inv.ctx.link_up(inv.npu) or inv.ctx.plane is None:
        raise ToolError(Code.DSMI_LINK_IS_DOWN)  # guess (module docstring)
    cfg = inv.ctx.state.load().get(inv.npu)
    lines, received, failed = [], 0, False
    for seq in range(PING_PACKETS):
        result: npu_net.EchoResult = npu_net.LOST
        if cfg is not None and cfg.address is not None and inv.ctx.wanted(inv.npu, cfg) is not None:
            try:
                result = inv.ctx.plane.echo(cfg.address, destination, data_len, seq, PING_TIMEOUT_S)
            except OSError:
                raise ToolError(Code.DSMI_EXE) from None
        if isinstance(result, float):
            received += 1
            lines.append(f"recv seq={seq},time={_rtt(result)}ms")
        elif result == npu_net.TOO_LONG:
            lines.append(f"send seq={seq} failed: Message too long")  # guess: only the words are the source's
            failed = True
        else:
            lines.append(f"recv time out seq={seq}")
            failed = True
    loss = 100.0 * (PING_PACKETS - received) / PING_PACKETS
    lines.append(f"{PING_PACKETS} packets transmitted, {received} received, {loss:.2f}% packet loss")
    inv.say(f"device {inv.npu} PING {destination}")
    for line in lines:
        inv.say(line)
    if failed:  # ds_net_ext.c dsmi_ping_fun: "recv time out seq" / "Message too long" in the output is a failure
        raise ToolError(Code.DSMI_EXE)
    return Code.SUCCESS


def _recover(inv: Invocation) -> None:
    """Re-apply what hccn.conf holds for one NPU (the driver runs this at every device boot)."""
    # Each setting is applied as it is read, so one that fails leaves those before it on the device.
    with inv.ctx.state.locked():
        ports = inv.ctx.state.load()
        address, netmask = _read_conf(inv, "address"), _read_conf(inv, "netmask")
        if address is not None and netmask is not None:
            _set_address(inv, ports, address, netmask)
            _commit(inv, ports)
        netdetect = _read_conf(inv, "netdetect")
        if netdetect is not None:
            if _pton(netdetect) is None:
                raise ToolError(Code.PARAM_IP_INVALID)
            ports.setdefault(inv.npu, PortConfig()).netdetect = netdetect
            _commit(inv, ports)
        gateway = _read_conf(inv, "gateway")
        cfg = ports.get(inv.npu)
        if gateway is not None and cfg is not None and cfg.address is not None:
            if not _same_segment(cfg.address, gateway, cfg.netmask or "0.0.0.0"):
                raise ToolError(Code.PARAM_DIFF_SEGMT_GTWY)
            cfg.gateway = gateway
            _commit(inv, ports)


def cmd_cfg(inv: Invocation, args: list[str]) -> Code:
    if not args:
        raise ToolError(Code.PARAM_CMD_COUNT)
    if args[0] == "status":
        raise NotEmulated("-cfg status")
    if args[0] != "recovery":
        raise ToolError(Code.PARAM_OP_NOT_SUPPORT)
    if inv.npu >= 0:
        _recover(inv)
        return Code.SUCCESS
    if not inv.ctx.driver_loaded():
        raise ToolError(Code.DSMI_EXE)
    failure: ToolError | None = None
    for npu in inv.ctx.npu_ids():
        inv.npu = npu
        try:
            _recover(inv)
        except ToolError as error:
            failure = error  # the other devices are still recovered
    inv.npu = -1
    if failure is not None:
        raise failure
    return Code.SUCCESS


IP_HELP = ("   [-s]                 : set ip cfg \n"
           "       address %s       : set IPv4 ip address, such as x.x.x.x\n"
           "       netmask %s       : set IPv4 ip netmask, such as x.x.x.x\n"
           "   [-g]                 : get ip address and netmask/prefix_length \n")
COMMANDS = (
    Command("-i", "-ip", IP_HELP, cmd_ip),
    Command("-i", "-gateway", "   [-s]                : set gateway cfg \n"
                              "       gateway %s      : set IPv4 gateway, such as x.x.x.x\n"
                              "   [-g]                : get gateway address \n", cmd_gateway),
    Command("-i", "-netdetect", "   [-s]                : set net detect cfg \n"
                                "       address %s      : set net detect IPv4 ip address, such as x.x.x.x\n"
                                "   [-g]                : get net detect cfg \n", cmd_netdetect),
    Command("-i", "-lldp", "   [-g]        : get lldp cfg \n", cmd_lldp),
    Command("-i", "-cfg", "   recovery    : recovery cfg \n", cmd_cfg),
    Command("-i", "-link", "   [-g]                   : get the eth ports link status, UP or DOWN \n", cmd_link),
    Command("-i", "-net_health", "   [-g]        : get net health status\n", cmd_net_health),
    Command("-i", "-ping", "   [-g]                : get ping result\n"
                           "       address %s      : set net detect IPv4 ip address, such as x.x.x.x\n"
                           "       pkt %d          : ping packet data length, default 4096\n", cmd_ping),
    Command("-a", "-cfg", "   recovery    : recovery all device cfg \n", cmd_cfg),
)


def _param_list(command: Command) -> str:
    value = "devid " if command.attr == "-i" else ""
    return f"[ hccn_tool {command.attr} {value}{command.option} ] needs the following parameters:\n{command.help}\n"


def _help() -> str:
    return "".join(f"hccn_tool {c.attr} {'devid ' if c.attr == '-i' else ''}{c.option}\n{c.help}\n" for c in COMMANDS)


def _find_command(argv: list[str]) -> tuple[Command, int]:
    """cmd.c parse_major_dev_cmd: ``-i <dev> <cmd>`` or ``-a <cmd>``; returns the command and where its own
    arguments start."""
    if argv[0] == "-i":
        attr, at = "-i", 2
    elif argv[0] == "-a":
        attr, at = "-a", 1
    else:
        raise ToolError(Code.MAJOR_CMD_TYPE)
    if at >= len(argv):
        raise ToolError(Code.MAJOR_CMD_INVALID)
    for command in COMMANDS:
        if command.attr == attr and command.option == argv[at]:
            return command, at + 1
    if attr == "-i" and argv[at] in NOT_EMULATED:
        raise NotEmulated(argv[at])
    raise ToolError(Code.MAJOR_CMD_INVALID)


def _device(ctx: Context, text: str) -> int:
    """cmd.c tool_parse_dev: one or two digits, then the driver must know that device."""
    if not text or len(text) > MAX_DEVICE_ID_LEN or not text.isdigit() or not text.isascii():
        raise ToolError(Code.MAJOR_CMD_DEV_ID)
    npu = int(text)
    if not ctx.driver_loaded() or npu not in ctx.npu_ids():
        raise ToolError(Code.MAJOR_CMD_DEV_ID)
    return npu


def run(argv: Sequence[str], ctx: Context | None = None, out: TextIO | None = None,
        err: TextIO | None = None) -> int:
    argv = list(argv)
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    command: Command | None = None
    inv: Invocation | None = None
    try:
        if not argv or len(argv) + 1 >= MAX_ARGC:
            raise ToolError(Code.MAJOR_CMD_NUM)
        if any(len(arg) > MAX_ARGV_LEN for arg in argv):
            raise ToolError(Code.MAJOR_CMD_LEN)
        if argv in (["-h"], ["--help"]):
            out.write(_help())
            return 0
        command, start = _find_command(argv)
        ctx = ctx if ctx is not None else Context.default()
        inv = Invocation(ctx, out, err)
        if command.attr == "-i":
            inv.npu = _device(ctx, argv[1])
        command.run(inv, argv[start:])
    except NotEmulated as missing:
        err.write(f"hccn_tool (dsctl lab): {missing} is not emulated on this lab host\n")
        return 1
    except ToolError as error:
        text, with_params = MESSAGES.get(error.code, ("Cmd execute failed!", False))
        err.write(text + "\n")
        if with_params and command is not None:
            out.write(_param_list(command))
        family = error.code & 0xF000
        recovering = command is not None and command.option == "-cfg"
        if recovering and family not in (MAJOR_FAMILY, PARAM_FAMILY) and error.code != Code.TOOL_SYS_NOT_ACCESS:
            out.write(RECOVERY_FAILED + "\n")
        return error.code & 0xFF
    if inv is not None and not inv.is_get:
        out.write(SUCCESS_LINE + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
