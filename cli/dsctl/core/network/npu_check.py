"""`dsctl check` of the NPU parameter plane: which NPU pairs to ping, and what is wrong, one line each (pure).

Per NPU of every host with a plan (dsctl.core.network.hccn_plan), from what the host's hccn_tool says
(dsctl.core.network.hccn_state): the link (must be UP), the net health (the detection probe, must be Success),
the detection address, the address and netmask against the plan, and /etc/hccn.conf against the plan (the driver
re-applies the file at every boot, so a wrong entry is tomorrow's wrong address).  Then reachability between hosts:
NPU i of a host pings NPU i of every other host it shares a multi-host instance with (every other host with a
plan when no instance spans hosts): the vllm-ascend multi-node tutorials' "cross-node ping from each device"
(multi-node.md, "The NPU network").

What is pinged, and how little: NPU i of every server is in the same subnet as NPU i of the others (the vendor's
addressing rule, which the plan enforces), so only same-index NPUs are paired, and each pair of hosts is pinged in
one direction only (an echo that comes back crossed the plane both ways), the directions spread so that every host
sends about as many pings as the others.  Each ping is hccn_tool's own three packets.

A failed ping is put on the NPU that explains it: a link DOWN, no address or the wrong one (on either end) before a
failed net health, and only pairs nothing explains are reported as unreachable, on the host that pinged.  So a
cable pulled on lab-02 NPU 3 is one line on lab-02 naming NPU 3, the NPUs that cannot reach it, and the multi-host
instances that need it; the other hosts stay clean.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dsctl.core.fleet.compat import Finding, describe_npus
from dsctl.core.network.hccn_plan import HCCN_CONF, HostNetwork, NetworkPlan, conf_differences
from dsctl.core.network.hccn_state import HEALTH_OK, HostNetworkState, NpuState, PingResult

COMPONENT = "network"
PROVISION_NETWORK = "dsctl provision {inventory} --tags network"


@dataclass(frozen=True)
class PeerPing:
    """One ping a host sends: from its NPU ``npu`` to NPU ``peer_npu`` of ``peer`` at ``address``."""

    npu: int
    peer: str
    peer_npu: int
    address: str

    def to_arg(self) -> dict[str, Any]:
        """What the collector module takes (npu, address)."""
        return {"npu": self.npu, "address": self.address}


@dataclass(frozen=True)
class InstanceUse:
    """A multi-host instance as the check needs it: its name, its hosts (head first) and the NPUs it uses on each."""

    name: str
    hosts: tuple[str, ...]
    npus: tuple[int, ...]

    def label(self) -> str:
        return f"{self.name} ({', '.join(self.hosts)})"


def host_pairs(plan: NetworkPlan, groups: Sequence[Sequence[str]] | None) -> list[tuple[str, str]]:
    """Unordered pairs of planned hosts that must reach each other, in plan order: within each group (the hosts of
    one multi-host instance), or all planned hosts when there is no group."""
    order = {host.host: index for index, host in enumerate(plan.hosts)}
    pools = [list(order)] if not groups else [[name for name in group if name in order] for group in groups]
    pairs: set[tuple[str, str]] = set()
    for pool in pools:
        ranked = sorted(set(pool), key=order.__getitem__)
        pairs.update((a, b) for i, a in enumerate(ranked) for b in ranked[i + 1:])
    return sorted(pairs, key=lambda pair: (order[pair[0]], order[pair[1]]))


def ping_plan(plan: NetworkPlan, checked: Collection[str],
              groups: Sequence[Sequence[str]] | None = None) -> dict[str, list[PeerPing]]:
    """Per checked host, the pings it sends.  A pair of hosts both checked is pinged by one of them, by position
    among the checked hosts (k pings k+1 .. k+(n-1)/2, and k+n/2 for the first half when n is even: every host sends
    to about half of its peers); a pair with one end outside ``checked`` (dsctl check --limit) is pinged by the
    other end; NPU i of one to NPU i of the other, for every NPU both plan."""
    pairs = host_pairs(plan, groups)
    ranked = [host.host for host in plan.hosts if host.host in checked]
    position = {name: index for index, name in enumerate(ranked)}
    count = len(ranked)
    sends: dict[str, list[PeerPing]] = {name: [] for name in ranked}
    for a, b in pairs:
        if a in position and b in position:
            distance = (position[b] - position[a]) % count
            if distance * 2 < count or (distance * 2 == count and position[a] < count // 2):
                source, target = a, b
            else:
                source, target = b, a
        elif a in position:
            source, target = a, b
        elif b in position:
            source, target = b, a
        else:
            continue
        theirs = plan.host(target).addresses
        sends[source] += [PeerPing(npu.npu, target, npu.npu, theirs[npu.npu])
                          for npu in plan.host(source).npus if npu.npu in theirs]
    for name in sends:
        sends[name].sort(key=lambda ping: (ping.npu, position.get(ping.peer, count)))
    return {name: pings for name, pings in sends.items() if pings or name in position}


# --------------------------------------------------------------------------- findings


@dataclass(frozen=True)
class NetworkReport:
    """One host's part of the check: its findings and what each NPU and ping said (for --json and the table)."""

    findings: tuple[Finding, ...]
    summary: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Pair:
    source: str
    npu: int
    target: str
    target_npu: int
    result: PingResult


def _plural(items: Collection[Any], one: str, many: str) -> str:
    return one if len(items) == 1 else many


def _hosts(names: Iterable[str]) -> str:
    names = list(dict.fromkeys(names))
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _partners(ends: Collection[tuple[str, int]]) -> str:
    """"NPU 3 of lab-01 and lab-03" / "NPUs 0-7 of lab-01, lab-02 and lab-04"."""
    hosts = sorted({host for host, _ in ends})
    return f"{describe_npus(npu for _, npu in ends)} of {_hosts(hosts)}"


def _instances_using(instances: Sequence[InstanceUse], host: str, npus: Collection[int]) -> list[InstanceUse]:
    return [item for item in instances if host in item.hosts and set(item.npus) & set(npus)]


def _needed_by(found: Sequence[InstanceUse], npus_word: str = "it") -> str:
    if not found:
        return ""
    labels = ", ".join(item.label() for item in found)
    return f"; {_plural(found, 'instance', 'instances')} {labels} {_plural(found, 'needs', 'need')} {npus_word}"


def _state_of(state: HostNetworkState | None, npu: int) -> NpuState:
    found = state.npus.get(npu) if state is not None else None
    return found if found is not None else NpuState(npu)


def _hard(planned_host: HostNetwork, state: HostNetworkState) -> dict[int, str]:
    """NPU -> "link" | "missing" | "wrong": what keeps it off the plane whatever the rest does."""
    hard = {}
    for planned in planned_host.npus:
        now = state.npus.get(planned.npu)
        if now is None or now.error:
            continue
        if now.link == "DOWN":
            hard[planned.npu] = "link"
        elif "ip" in now.read and now.address is None:
            hard[planned.npu] = "missing"
        elif "ip" in now.read and (now.address, now.netmask) != (planned.address, planned.netmask):
            hard[planned.npu] = "wrong"
    return hard


def _soft(planned_host: HostNetwork, state: HostNetworkState, hard: Mapping[int, str]) -> dict[int, str]:
    """NPU -> its net health when that is not Success (and the plan gives it a detection peer)."""
    soft = {}
    for planned in planned_host.npus:
        now = state.npus.get(planned.npu)
        if now is None or planned.npu in hard or planned.netdetect is None or now.health in (None, HEALTH_OK):
            continue
        soft[planned.npu] = now.health
    return soft


def _pairs(plan: NetworkPlan, states: Mapping[str, HostNetworkState | None],
           pings: Mapping[str, Sequence[PeerPing]]) -> list[_Pair]:
    pairs = []
    for source, sent in pings.items():
        state = states.get(source)
        if state is None:
            continue
        results = {(result.npu, result.address): result for result in state.pings}
        for ping in sent:
            result = results.get((ping.npu, ping.address))
            if result is not None:
                pairs.append(_Pair(source, ping.npu, ping.peer, ping.peer_npu, result))
    return pairs


def network_findings(plan: NetworkPlan, states: Mapping[str, HostNetworkState | None],
                     pings: Mapping[str, Sequence[PeerPing]], *, instances: Sequence[InstanceUse] = (),
                     inventory: str = "INVENTORY", pending_reboot: Collection[str] = ()) -> dict[str, NetworkReport]:
    """Each checked host's NPU network findings (component "network") and summary.

    ``states``: the checked hosts' parsed collector output (None: not read, e.g. unreachable); ``pings``: what
    `ping_plan` had each send; ``instances``: the multi-host instances (named in the findings of the NPUs and pairs
    they need); ``pending_reboot``: hosts whose driver waits for a reboot (their unreadable NPUs are only info)."""
    provision = PROVISION_NETWORK.format(inventory=inventory)
    again = f"then run dsctl check {inventory} again"
    hard: dict[str, dict[int, str]] = {}
    soft: dict[str, dict[int, str]] = {}
    for host, state in states.items():
        if state is not None and host in plan and state.unreadable is None:
            hard[host] = _hard(plan.host(host), state)
            soft[host] = _soft(plan.host(host), state, hard[host])
    pairs = _pairs(plan, states, pings)
    # Who explains each failed ping: (host, npu) -> the other ends of the pairs it explains.
    cut_off: dict[tuple[str, int], set[tuple[str, int]]] = {}
    unexplained: dict[str, dict[str, list[_Pair]]] = {}
    for pair in pairs:
        if pair.result.reachable:
            continue
        ends = [(pair.source, pair.npu), (pair.target, pair.target_npu)]
        blamed = [end for end in ends if end[1] in hard.get(end[0], {})] or \
                 [end for end in ends if end[1] in soft.get(end[0], {})]
        for end in blamed:
            cut_off.setdefault(end, set()).update(other for other in ends if other != end)
        if not blamed:
            unexplained.setdefault(pair.source, {}).setdefault(pair.target, []).append(pair)

    reports = {}
    for host, state in states.items():
        if host not in plan:
            continue
        planned_host = plan.host(host)
        findings: list[Finding] = []
        if state is None:
            reports[host] = NetworkReport((), {"planned": len(planned_host.npus), "read": False})
            continue
        reason = state.unreadable
        if reason is not None:
            pending = host in pending_reboot
            if pending:
                fix = f"Reboot the host to load the installed driver, {again}."
            elif state.tool is None:
                fix = "Run dsctl provision to install the NPU driver, which ships hccn_tool."
            else:
                fix = "Run `hccn_tool -i 0 -ip -g` on the host and fix what it reports (`npu-smi info` lists the NPUs)."
            findings.append(Finding("info" if pending else "error", COMPONENT,
                                    f"The NPU network cannot be read: {reason}.", fix, "npu-network-unread"))
            reports[host] = NetworkReport(tuple(findings), _summary(planned_host, state, pairs, host))
            continue
        findings += _npu_findings(host, planned_host, state, hard[host], soft[host], cut_off, instances,
                                  provision, again)
        for target, failed in unexplained.get(host, {}).items():
            npus = [pair.npu for pair in failed]
            loss = max(pair.result.loss for pair in failed)
            peer_checked = states.get(target) is not None
            both = "the links on both ends are UP" if peer_checked else f"{host}'s links are UP"
            shared = [item for item in instances if host in item.hosts and target in item.hosts]
            sample = failed[0]
            findings.append(Finding(
                "error", COMPONENT,
                f"{describe_npus(npus)} cannot reach {describe_npus(npus) if len(npus) == 1 else 'the same NPUs'} "
                f"of {target} "
                f"(hccn_tool -i {sample.npu} -ping -g address {sample.result.address}: {loss:.0f}% loss), though "
                f"{both}{_needed_by(shared, 'both hosts')}.",
                f"Check the switch ports, VLANs and routes between the NPU ports of {host} and {target} (hccn_tool "
                f"-i {sample.npu} -lldp -g names each port), {again}.", "npu-unreachable"))
        reports[host] = NetworkReport(tuple(findings), _summary(planned_host, state, pairs, host))
    return reports


def _addresses(npus: Sequence[Any], limit: int = 2) -> str:
    shown = [f"{npu.address}/{npu.netmask}" for npu in npus[:limit]]
    return ", ".join(shown) + (", ..." if len(npus) > limit else "")


def _reach(cut: set[tuple[str, int]], them: str) -> str:
    return f"; {_partners(cut)} cannot reach {them}" if cut else ""


def _npu_findings(host: str, planned_host: HostNetwork, state: HostNetworkState, hard: Mapping[int, str],
                  soft: Mapping[int, str], cut_off: Mapping[tuple[str, int], set[tuple[str, int]]],
                  instances: Sequence[InstanceUse], provision: str, again: str) -> list[Finding]:
    findings = []
    by_npu = {npu.npu: npu for npu in planned_host.npus}

    def cut(npus: Iterable[int]) -> set[tuple[str, int]]:
        return set().union(*(cut_off.get((host, npu), set()) for npu in npus))

    def them(npus: Collection[int]) -> str:
        return _plural(npus, "it", "them")

    unread = [npu for npu in by_npu if _state_of(state, npu).error]
    if unread:
        first = _state_of(state, unread[0])
        findings.append(Finding("error", COMPONENT, f"{describe_npus(unread)} could not be read: {first.error}.",
                                "Run that command on the host and fix what it reports (`npu-smi info` lists the NPUs).",
                                "npu-network-unread"))
    down = [npu for npu, kind in hard.items() if kind == "link"]
    if down:
        healths = sorted({_state_of(state, npu).health for npu in down if _state_of(state, npu).health})
        health = f", net health {'/'.join(healths)}" if healths else ""
        findings.append(Finding(
            "error", COMPONENT,
            f"The RoCE {_plural(down, 'link', 'links')} of {describe_npus(down)} {_plural(down, 'is', 'are')} DOWN "
            f"(hccn_tool -i {down[0]} -link -g"
            f"{health}){_reach(cut(down), them(down))}"
            f"{_needed_by(_instances_using(instances, host, down), them(down))}.",
            f"Check the cable, optical module and switch port of {describe_npus(down)} (hccn_tool -i {down[0]} "
            f"-lldp -g names the port once the link is up), {again}.", "npu-link-down"))
    missing = [npu for npu, kind in hard.items() if kind == "missing"]
    if missing:
        findings.append(Finding(
            "error", COMPONENT,
            f"{describe_npus(missing)} {_plural(missing, 'has', 'have')} no RoCE address (hccn_tool -i {missing[0]} "
            f"-ip -g: no ip was preset), the plan gives {_addresses([by_npu[npu] for npu in missing])}"
            f"{_reach(cut(missing), them(missing))}"
            f"{_needed_by(_instances_using(instances, host, missing), them(missing))}.",
            f"Run {provision}: it sets the plan's addresses with hccn_tool.", "npu-address-missing"))
    wrong = [npu for npu, kind in hard.items() if kind == "wrong"]
    if wrong:
        said = "; ".join(f"NPU {npu} answers at {_state_of(state, npu).address}/{_state_of(state, npu).netmask}, the "
                         f"plan gives {by_npu[npu].address}/{by_npu[npu].netmask}" for npu in wrong[:3])
        more = f" (and {len(wrong) - 3} more)" if len(wrong) > 3 else ""
        findings.append(Finding(
            "error", COMPONENT,
            f"{said}{more} (hccn_tool -i {wrong[0]} -ip -g){_reach(cut(wrong), them(wrong))}"
            f"{_needed_by(_instances_using(instances, host, wrong), them(wrong))}.",
            f"Run {provision}: it sets the plan's addresses with hccn_tool.", "npu-address-wrong"))
    findings += _conf_findings(host, planned_host, state, instances, provision)
    detect = [npu for npu in by_npu if "netdetect" in _state_of(state, npu).read and by_npu[npu].netdetect
              and _state_of(state, npu).netdetect != by_npu[npu].netdetect]
    if detect:
        said = "; ".join(f"NPU {npu} detects {_state_of(state, npu).netdetect or 'nothing (0.0.0.0)'}, the plan sets "
                         f"{by_npu[npu].netdetect}" for npu in detect[:3])
        more = f" (and {len(detect) - 3} more)" if len(detect) > 3 else ""
        findings.append(Finding("warning", COMPONENT, f"{said}{more} (hccn_tool -i {detect[0]} -netdetect -g).",
                                f"Run {provision}: it sets the plan's detection peers.", "npu-netdetect-wrong"))
    by_health: dict[str, list[int]] = {}
    for npu, health in soft.items():
        by_health.setdefault(health, []).append(npu)
    for health, npus in sorted(by_health.items()):
        peers = sorted({by_npu[npu].netdetect for npu in npus if by_npu[npu].netdetect})
        peer = peers[0] if len(peers) == 1 else f"{peers[0]}, ..."
        lost = cut(npus)
        meaning = ("no detection address is set" if health == "Init"
                   else f"the detection address {peer} does not answer")
        if lost:
            words = (f"{describe_npus(npus)} net health is {health} (hccn_tool -i {npus[0]} -net_health -g: {meaning}) "
                     f"and {_partners(lost)} cannot reach {them(npus)} (hccn_tool -ping), links UP: {host}'s NPU ports "
                     f"are cut off the NPU plane{_needed_by(_instances_using(instances, host, npus), them(npus))}.")
            fix = (f"Check {host}'s switch ports (port isolation, VLAN, ACLs; hccn_tool -i {npus[0]} -lldp -g names "
                   f"each) and the routes to {peer}, {again}.")
        else:
            words = (f"{describe_npus(npus)} net health is {health} (hccn_tool -i {npus[0]} -net_health -g: "
                     f"{meaning}), though the pings between hosts answer.")
            fix = (f"Check that {peer} (the plan's detection peer, usually the switch) answers on the NPU plane, "
                   f"{again}.")
        findings.append(Finding("error" if lost else "warning", COMPONENT, words, fix, "npu-net-health"))
    return findings


def _conf_findings(host: str, planned_host: HostNetwork, state: HostNetworkState,
                   instances: Sequence[InstanceUse], provision: str) -> list[Finding]:
    if state.conf is None:
        return [Finding("error", COMPONENT,
                        f"{HCCN_CONF} is missing or unreadable: the driver re-applies the NPUs' addresses from it at "
                        "every boot.",
                        f"Reinstall the NPU driver (its installer creates the file), then run {provision}.",
                        "hccn-conf-wrong")]
    differences = conf_differences(planned_host, state.conf)
    if not differences:
        return []
    npus = sorted({int(line.split()[1].rstrip(":")) for line in differences})
    shown = "; ".join(differences[:3]) + (f" (and {len(differences) - 3} more)" if len(differences) > 3 else "")
    return [Finding(
        "error", COMPONENT,
        f"{HCCN_CONF} differs from the plan: {shown}; the driver applies the file at every boot, so "
        f"{describe_npus(npus)} would come up with it"
        f"{_needed_by(_instances_using(instances, host, npus), _plural(npus, 'it', 'them'))}.",
        f"Run {provision}: hccn_tool sets the plan's values and rewrites their lines (edit {HCCN_CONF} only through "
        "hccn_tool).", "hccn-conf-wrong")]


def _summary(planned_host: HostNetwork, state: HostNetworkState, pairs: Sequence[_Pair], host: str) -> dict[str, Any]:
    npus = []
    conf = state.conf_values
    for planned in planned_host.npus:
        now = _state_of(state, planned.npu)
        filed = conf.get(planned.npu, {})
        npus.append({**now.to_dict(), "planned": {"address": planned.address, "netmask": planned.netmask,
                                                  "netdetect": planned.netdetect, "gateway": planned.gateway},
                     "conf_matches": state.conf is not None and all(
                         filed.get(key) == value for key, value in (("address", planned.address),
                                                                    ("netmask", planned.netmask),
                                                                    ("netdetect", planned.netdetect),
                                                                    ("gateway", planned.gateway))
                         if value is not None)})
    mine = [pair for pair in pairs if host in (pair.source, pair.target)]
    return {
        "planned": len(planned_host.npus),
        "read": state.unreadable is None,
        "links_up": sum(1 for npu in npus if npu["link"] == "UP"),
        "healthy": sum(1 for npu in npus if npu["health"] == HEALTH_OK),
        "addresses_match": sum(1 for npu in npus if (npu["address"], npu["netmask"]) ==
                               (npu["planned"]["address"], npu["planned"]["netmask"])),
        "conf_matches": sum(1 for npu in npus if npu["conf_matches"]),
        "pairs": len(mine),
        "pairs_reachable": sum(1 for pair in mine if pair.result.reachable),
        "npus": npus,
        "pings": [{"npu": pair.npu, "peer": pair.target, "peer_npu": pair.target_npu, "address": pair.result.address,
                   "reachable": pair.result.reachable, "loss": pair.result.loss, "reason": pair.result.reason}
                  for pair in pairs if pair.source == host],
    }


def chip_findings(instances: Sequence[InstanceUse], chips: Mapping[str, Sequence[str]],
                  inventory: str) -> dict[str, list[Finding]]:
    """Host -> an error for each multi-host instance whose NPUs there are another chip than its head's (npu-smi's
    names, `audit`'s row): an instance's ranks split the model evenly and HCCL links like chips only, so dsctl
    deploy's plan assumes one chip per instance (the service's ``chip``) and this is where a mixed group shows."""
    found: dict[str, list[Finding]] = {}
    for instance in instances:
        head = instance.hosts[0]
        ours = sorted(set(chips.get(head) or ()))
        if not ours:
            continue
        for host in instance.hosts[1:]:
            theirs = sorted(set(chips.get(host) or ()))
            if theirs and theirs != ours:
                found.setdefault(host, []).append(Finding(
                    "error", "npu",
                    f"{host} has {'/'.join(theirs)} NPUs, the head {head} of instance {instance.label()} "
                    f"{'/'.join(ours)}; an instance runs on one chip type (its ranks split the model evenly).",
                    f"Group hosts of one chip in the service's host_groups, then run dsctl check {inventory} again.",
                    "instance-mixed-chips"))
    return found
