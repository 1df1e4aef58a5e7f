"""The gateway's schema, member plan and nginx configuration (dsctl.core.serving.gateway)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from dsctl.core.serving import gateway
from dsctl.core.serving.gateway import FleetHost, GatewayError, gateway_targets, plan_gateway, validate_gateway
from dsctl.core.serving.service import validate_services
from dsctl.errors import DsctlError


def services(*entries: dict) -> tuple:
    return tuple(validate_services("h", list(entries), npu_count=8, vllm_ascend=None))


def chat(**extra) -> dict:
    return {"name": "chat", "engine": "lab-engine", "model": "m", "npus_per_instance": 4, "instances": 2,
            "port": 8000, "allow_unauthenticated": True, **extra}


def fleet(*entries: dict) -> list[FleetHost]:
    specs = services(*(entries or (chat(),)))
    return [FleetHost("lab-01", "10.78.0.11", specs, 8), FleetHost("lab-02", "10.78.0.12", specs, 8)]


def target(**declaration):
    return gateway_targets({"gw": {"dsctl_gateway": {"services": [{"service": "chat", "port": 8080}],
                                                     **declaration}}}, {})[0]


# --------------------------------------------------------------------------- schema


@pytest.mark.parametrize(("declaration", "message"), [
    ({"services": [{"service": "chat", "port": "8080"}]},
     "inventory: host gw: dsctl_gateway.services[0].port: expected a port 1..65535, got '8080'"),
    ({"services": [{"service": "chat", "port": 8080}], "read_timeout": 5},
     "dsctl_gateway.read_timeout: unknown gateway setting; did you mean read_timeout_s?"),
    ({"services": []}, "dsctl_gateway.services: expected a list of {service, port}, at least one"),
    ({}, "dsctl_gateway.services: required but not set"),
    ({"services": [{"service": "chat", "port": 8080}], "listen": "any"},
     "dsctl_gateway.listen: expected an IP address such as 0.0.0.0, got 'any'"),
    ({"services": [{"service": "chat", "port": 8080}], "worker_user": "root"},
     "dsctl_gateway.worker_user: expected a user name (not root)"),
    ({"services": [{"service": "chat", "port": 8080}], "config_dir": "/etc/x y"},
     "dsctl_gateway.config_dir: expected an absolute path of letters"),
    ({"services": [{"service": "chat", "port": 8080}, {"service": "code", "port": 8080}]},
     "dsctl_gateway.services[1].port: port 8080 is also the port of services[0]"),
    ({"services": [{"service": "chat", "port": 8080}], "drain_timeout_s": 0},
     "dsctl_gateway.drain_timeout_s: expected a number of seconds 1..86400, got 0"),
    ("chat:8080", "dsctl_gateway: expected a mapping with services"),
])
def test_a_bad_declaration_is_one_line_naming_the_field(declaration, message):
    with pytest.raises(GatewayError) as raised:
        validate_gateway("gw", declaration)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)
    assert raised.value.exit_status == 2


def test_the_defaults_are_the_documented_ones():
    spec = validate_gateway("gw", {"services": [{"service": "chat", "port": 8080}]})
    assert (spec.listen, spec.balance, spec.max_fails, spec.worker_user) == ("0.0.0.0", "least_conn", 1,
                                                                              "dsctl-gateway")
    assert spec.config_file == "/etc/dsctl/gateway/nginx.conf"
    assert spec.state_file == "/etc/dsctl/gateway/drained"


def test_a_gateway_host_without_a_declaration_is_refused():
    with pytest.raises(GatewayError, match="host gw is in group gateway but declares no gateway"):
        gateway_targets({"gw": {}}, {})


def test_the_controller_gateway_must_be_declared_alike_on_every_fleet_host():
    declaration = {"services": [{"service": "chat", "port": 8080}]}
    alike = {"lab-01": {"dsctl_gateway_on_controller": True, "dsctl_gateway": declaration},
             "lab-02": {"dsctl_gateway_on_controller": True, "dsctl_gateway": declaration}}
    [controller] = gateway_targets({}, alike)
    assert (controller.name, controller.on_controller) == ("controller", True)
    with pytest.raises(GatewayError, match="host lab-02: dsctl_gateway_on_controller: .* declared alike"):
        gateway_targets({}, {**alike, "lab-02": {"dsctl_gateway": declaration}})
    with pytest.raises(GatewayError, match="dsctl_gateway_on_controller: expected true or false"):
        gateway_targets({}, {"lab-01": {"dsctl_gateway_on_controller": "yes"}})
    assert gateway_targets({}, {"lab-01": {}}) == []


# --------------------------------------------------------------------------- plan


def test_every_instance_of_the_service_on_the_fleet_is_a_member_at_its_host_address():
    plan = plan_gateway(target(), fleet())
    assert [(m.id, m.server, m.state) for m in plan.members] == [
        ("lab-01/chat-0", "10.78.0.11:8000", "up"), ("lab-01/chat-1", "10.78.0.11:8001", "up"),
        ("lab-02/chat-0", "10.78.0.12:8000", "up"), ("lab-02/chat-1", "10.78.0.12:8001", "up")]


def test_drained_members_stay_drained_until_undrained():
    plan = plan_gateway(target(), fleet(), drained=["lab-01/chat-1", "lab-09/chat-0"], drain=["lab-02/chat-0"])
    assert plan.drained == ["lab-01/chat-1", "lab-02/chat-0"]  # the vanished lab-09 is forgotten
    plan = plan_gateway(target(), fleet(), drained=plan.drained, undrain=["lab-01/chat-1"])
    assert plan.drained == ["lab-02/chat-0"]


def test_a_drain_naming_no_member_is_refused_with_the_known_ones():
    with pytest.raises(GatewayError, match=r"dsctl_gateway_drain: lab-03/chat-0 is not an instance .* known: "
                                           r"lab-01/chat-0, lab-01/chat-1"):
        plan_gateway(target(), fleet(), drain=["lab-03/chat-0"])
    with pytest.raises(GatewayError, match="is not host/instance"):
        gateway.member_ids(["lab-01"], gateway.DRAIN_VAR)
    assert gateway.member_ids("lab-01/chat-0,lab-02/chat-1", gateway.DRAIN_VAR) == ["lab-01/chat-0",
                                                                                      "lab-02/chat-1"]


def test_a_service_no_host_runs_is_refused_with_a_suggestion():
    with pytest.raises(GatewayError, match=r"services\[0\].service: no host of the fleet runs a service named "
                                           r"chta; did you mean chat\?"):
        plan_gateway(target(services=[{"service": "chta", "port": 8080}]), fleet())


def test_an_instance_bound_to_loopback_cannot_be_reached_from_another_host():
    with pytest.raises(GatewayError, match="service chat binds 127.0.0.1, so the gateway on gw"):
        plan_gateway(target(), fleet(chat(bind="127.0.0.1")))
    specific = plan_gateway(target(), fleet(chat(bind="10.1.2.3")))
    assert {m.address for m in specific.members} == {"10.1.2.3"}


def test_a_gateway_on_a_fleet_host_may_not_take_an_instance_port():
    on_host = gateway_targets({"lab-01": {"dsctl_gateway": {"services": [{"service": "chat", "port": 8001}]}}},
                              {})[0]
    with pytest.raises(DsctlError, match="port 8001 of the gateway.s chat is also used by instance chat-1"):
        plan_gateway(on_host, fleet())


# --------------------------------------------------------------------------- nginx configuration


def test_the_config_lists_up_and_drained_members_and_streams_unbuffered():
    text = gateway.render_config(plan_gateway(target(), fleet(), drain=["lab-02/chat-1"]))
    assert 'server "10.78.0.11:8000" max_fails=1 fail_timeout=10s;' in text
    assert 'server "10.78.0.12:8001" down;' in text
    assert 'listen "0.0.0.0:8080";' in text
    assert "proxy_buffering off;" in text and "least_conn;" in text
    assert "proxy_next_upstream error timeout http_502 http_503 http_504 non_idempotent;" in text
    assert "proxy_next_upstream_tries 4;" in text
    assert 'user "dsctl-gateway" "dsctl-gateway";' in text


def test_options_reach_the_config():
    text = gateway.render_config(plan_gateway(target(listen="::", balance="round_robin", retry_non_idempotent=False,
                                                     read_timeout_s=1200, worker_processes=3), fleet()))
    assert 'listen "[::]:8080";' in text and "least_conn" not in text and "non_idempotent" not in text
    assert "proxy_read_timeout 1200s;" in text and "worker_processes 3;" in text


def test_values_are_quoted_for_nginx_and_unsafe_ones_refused():
    assert gateway.nginx_quote('a"b\\c') == '"a\\"b\\\\c"'
    for unsafe in ("$host", "a\nb", "a\x00"):
        with pytest.raises(ValueError):
            gateway.nginx_quote(unsafe)
    with pytest.raises(ValueError):
        gateway.nginx_int("5")


@pytest.mark.skipif(shutil.which("nginx") is None and not os.path.exists("/usr/sbin/nginx"),
                    reason="nginx is not installed (.ci/setup installs it)")
def test_nginx_accepts_the_rendered_config(tmp_path):
    import grp
    import pwd

    user = pwd.getpwuid(os.getuid()).pw_name
    group = grp.getgrgid(os.getgid()).gr_name
    spec = target(config_dir=str(tmp_path), state_dir=str(tmp_path / "state"), log_dir=str(tmp_path),
                  pid_file=str(tmp_path / "nginx.pid"))
    (tmp_path / "state").mkdir()
    text = gateway.render_config(plan_gateway(spec, fleet(), drain=["lab-01/chat-0"]))
    text = text.replace('user "dsctl-gateway" "dsctl-gateway";', f'user "{user}" "{group}";')
    (tmp_path / "nginx.conf").write_text(text)
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    result = subprocess.run([nginx, "-t", "-c", str(tmp_path / "nginx.conf"), "-e", str(tmp_path / "e.log")],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


def test_the_systemd_unit_runs_nginx_with_the_gateway_config():
    unit = gateway.render_systemd_unit(target().spec)
    assert "ExecStart=/usr/sbin/nginx -c /etc/dsctl/gateway/nginx.conf -e /var/log/dsctl/gateway-error.log" in unit
    assert "ExecReload=/usr/sbin/nginx -c /etc/dsctl/gateway/nginx.conf" in unit and "-s reload" in unit
    assert "PIDFile=/run/dsctl-gateway.pid" in unit


def test_the_config_answers_its_fingerprint_which_changes_with_the_members():
    up = plan_gateway(target(), fleet())
    drained = plan_gateway(target(), fleet(), drain=["lab-01/chat-0"])
    assert gateway.fingerprint(up) != gateway.fingerprint(drained)
    assert gateway.fingerprint(up) == gateway.fingerprint(plan_gateway(target(), fleet()))
    text = gateway.render_config(drained)
    assert 'location = "/dsctl-gateway/config"' in text
    assert f'return 200 "{gateway.fingerprint(drained)}";' in text
    assert gateway.config_url(up) == "http://127.0.0.1:8080/dsctl-gateway/config"


def test_a_whole_inventory_is_planned_from_validated_settings():
    from dsctl.core.inventory.schema import validate_fleet

    fleet_vars = {name: {"dsctl_npu_count": 8, "dsctl_package_source": "/srv", "dsctl_services": [chat()],
                         "ansible_host": address} for name, address in (("lab-01", "10.0.0.1"), ("lab-02", "10.0.0.2"))}
    settings = validate_fleet({name: {k: v for k, v in values.items() if k.startswith("dsctl_")}
                               for name, values in fleet_vars.items()})
    [plan] = gateway.plan_inventory({"gw": {"dsctl_gateway": {"services": [{"service": "chat", "port": 80}]}}},
                                    fleet_vars, settings)
    assert [m.server for m in plan.members] == ["10.0.0.1:8000", "10.0.0.1:8001", "10.0.0.2:8000", "10.0.0.2:8001"]
    assert gateway.plan_inventory({}, fleet_vars, settings) == []


def test_a_multi_host_service_is_balanced_over_its_heads_only():
    from dsctl.core.inventory.schema import validate_fleet
    from dsctl.core.lab.plan import npu_network_settings

    deepseek = {"name": "deepseek", "engine": "vllm-ascend", "model": "/models/DeepSeek-V3-w8a8", "weights": "int8",
                "nodes": 2, "npus_per_node": 8, "tensor_parallel_size": 4, "data_parallel_size": 4,
                "enable_expert_parallel": True, "socket_ifname": "eth0", "allow_unauthenticated": True}
    names = [f"lab-0{k}" for k in range(1, 5)]
    fleet_vars = {name: {"dsctl_npu_count": 8, "dsctl_package_source": "/srv", "dsctl_services": [deepseek],
                         "dsctl_npu_network": npu_network_settings(8), "ansible_host": f"10.0.0.{k}"}
                  for k, name in enumerate(names, start=1)}
    settings = validate_fleet({name: {k: v for k, v in values.items() if k.startswith("dsctl_")}
                               for name, values in fleet_vars.items()})
    [plan] = gateway.plan_inventory({"gw": {"dsctl_gateway": {"services": [{"service": "deepseek", "port": 80}]}}},
                                    fleet_vars, settings)
    assert [(m.id, m.server) for m in plan.members] == [("lab-01/deepseek-0", "10.0.0.1:8000"),
                                                        ("lab-03/deepseek-1", "10.0.0.3:8000")]
