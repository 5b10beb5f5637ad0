"""Node URLs obey the network policy (config/netpolicy.py), wherever a node comes from: the catalog
of hostile URLs is refused by the fleet file (a ConfigError naming the key path and the rule) and by
the admin operation (a 400 in the OpenAI envelope) alike, 0 of them accepted; private ranges and
loopback on other ports stay allowed; ``network_policy`` narrows; URLs are redacted in messages."""

from __future__ import annotations

from typing import Any

import pytest

from inferlb.config.netpolicy import Listener, NetworkPolicy, address_problem, redact_url, url_problem
from inferlb.config.settings import Settings, fleet_from_mapping
from inferlb.errors import ConfigError, InvalidRequest
from inferlb.fleet.netguard import resolved_problem
from inferlb.live.fleet_admin import add_node, merge_overrides
from inferlb.store.overrides import NodeOverride

GATEWAY = (Listener("127.0.0.1", 8080),)

#: (hostile URL, words of the rule that must refuse it)
HOSTILE: list[tuple[str, str]] = [
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://169.254.0.1:8000", "link-local"),
    ("http://[fe80::1]:8000", "link-local"),
    ("http://[fe80::1%25eth0]:8000", "link-local"),
    ("http://metadata.google.internal/computeMetadata/v1/", "cloud metadata host"),
    ("http://metadata.google.internal./", "cloud metadata host"),
    ("http://METADATA.GOOGLE.INTERNAL/", "cloud metadata host"),
    ("http://metadata/", "cloud metadata host"),
    ("http://instance-data.ec2.internal/", "cloud metadata host"),
    ("http://[fd00:ec2::254]/", "cloud metadata address"),
    ("http://100.100.100.200/latest/meta-data/", "cloud metadata address"),
    ("http://0.0.0.0:8000", "unspecified address"),
    ("http://[::]:8000", "unspecified address"),
    ("http://127.0.0.1:8080", "own listener"),
    ("https://127.0.0.1:8080/v1", "own listener"),
    ("http://localhost:8080", "own listener"),
    ("http://localhost.:8080", "own listener"),
    ("http://[::1]:8080", "own listener"),
    ("http://127.0.0.2:8080", "own listener"),
    ("http://[::ffff:127.0.0.1]:8080", "own listener"),
    ("http://user:pw@10.0.0.5:8000", "user-info"),
    ("http://user@10.0.0.5:8000", "user-info"),
    ("http://a:b@metadata.google.internal/", "user-info"),
    ("http://2852039166/", "non-standard form"),
    ("http://0xA9FEA9FE/", "non-standard form"),
    ("http://0251.0376.0251.0376/", "non-standard form"),
    ("http://0xa9.0xfe.0xa9.0xfe/", "non-standard form"),
    ("http://169.254.43518/", "non-standard form"),
    ("http://127.1:8080/", "non-standard form"),
    ("http://0/", "non-standard form"),
    ("http://[::ffff:169.254.169.254]/", "link-local"),
    ("http://[::ffff:a9fe:a9fe]/", "link-local"),
    ("http://[::169.254.169.254]/", "link-local"),
    ("http://[64:ff9b::a9fe:a9fe]/", "link-local"),
    ("http://[2002:a9fe:a9fe::1]/", "link-local"),
]

#: Private ranges, loopback on other ports, host names: model servers and test emulators live there.
ALLOWED = ["http://10.0.0.5:8000", "http://192.168.1.20:8000", "http://172.16.0.9", "http://127.0.0.1:9000",
           "http://[::1]:9000", "http://localhost:9000", "http://gpu-1.inference.svc.cluster.local:8000",
           "https://api.example.com/v1"]

def fleet(url: str, **extra: Any) -> dict[str, Any]:
    return {"models": [{"name": "m"}], "nodes": [{"name": "a", "url": url, "models": ["m"]}], **extra}


def test_the_catalog_is_large_enough() -> None:
    assert len(HOSTILE) >= 20
    assert len({u for u, _ in HOSTILE}) == len(HOSTILE)


@pytest.mark.parametrize(("url", "rule"), HOSTILE)
def test_a_hostile_url_in_the_fleet_file_is_a_config_error_naming_key_and_rule(url: str, rule: str) -> None:
    with pytest.raises(ConfigError) as ei:
        fleet_from_mapping(fleet(url), source="fleet.yaml", listeners=GATEWAY)
    msg = str(ei.value)
    assert ei.value.path == "nodes[0].url"
    assert msg.startswith("fleet.yaml: nodes[0].url: ") and "refused by the network policy" in msg
    assert rule in msg
    assert "pw" not in msg.split("refused")[0]   # the password is never echoed


@pytest.mark.parametrize(("url", "rule"), HOSTILE)
def test_a_hostile_url_added_live_is_a_400_in_the_envelope(url: str, rule: str) -> None:
    eff = merge_overrides(fleet_from_mapping(fleet("http://10.0.0.1:8000"), listeners=GATEWAY), [])
    with pytest.raises(InvalidRequest) as ei:
        add_node(eff, [], {"name": "evil", "url": url, "models": ["m"]}, key_id=None, at=0.0)
    assert ei.value.status == 400
    env = ei.value.envelope()["error"]
    assert set(env) == {"message", "type", "param", "code"}
    assert env["param"] == "url" and env["code"] == "node_url_refused"
    assert "pw@" not in env["message"]


def test_zero_of_the_catalog_is_accepted() -> None:
    accepted = [u for u, _ in HOSTILE if url_problem(u, NetworkPolicy(), GATEWAY) is None]
    assert accepted == []


@pytest.mark.parametrize("url", ALLOWED)
def test_private_ranges_loopback_elsewhere_and_host_names_are_allowed(url: str) -> None:
    cfg = fleet_from_mapping(fleet(url), listeners=GATEWAY)
    assert cfg.nodes[0].url == url.rstrip("/")
    assert cfg.listeners == GATEWAY


def test_the_policy_narrows_with_deny_and_allow_and_names_the_range() -> None:
    with pytest.raises(ConfigError, match=r"10\.0\.0\.5 is in network_policy.deny 10\.0\.0\.0/8"):
        fleet_from_mapping(fleet("http://10.0.0.5:8000", network_policy={"deny": ["10.0.0.0/8"]}))
    with pytest.raises(ConfigError, match=r"192\.168\.1\.2 is in no range of network_policy.allow"):
        fleet_from_mapping(fleet("http://192.168.1.2:8000", network_policy={"allow": ["10.0.0.0/8"]}))
    ok = fleet_from_mapping(fleet("http://10.1.2.3:8000", network_policy={"allow": ["10.0.0.0/8", "fd00::/8"]}))
    assert [str(n) for n in ok.network_policy.allow] == ["10.0.0.0/8", "fd00::/8"]
    # allow never reopens a default refusal
    with pytest.raises(ConfigError, match="link-local"):
        fleet_from_mapping(fleet("http://169.254.169.254", network_policy={"allow": ["0.0.0.0/0"]}))


def test_a_bad_cidr_is_a_config_error_at_its_key_path() -> None:
    with pytest.raises(ConfigError) as ei:
        fleet_from_mapping(fleet("http://10.0.0.5", network_policy={"deny": ["10.0.0.0/33"]}))
    assert ei.value.path == "network_policy.deny[0]"
    with pytest.raises(ConfigError) as ei:
        fleet_from_mapping(fleet("http://10.0.0.5", network_policy={"block": []}))
    assert ei.value.path == "network_policy.block"


def test_health_source_urls_obey_the_policy_too() -> None:
    raw = fleet("http://10.0.0.5:8000", health={"nodes": {"a": {"dcgm_url": "http://169.254.169.254/metrics"}}})
    with pytest.raises(ConfigError) as ei:
        fleet_from_mapping(raw)
    assert ei.value.path == "health.nodes.a.dcgm_url"


def test_settings_check_the_inline_fleet_against_the_gateway_listener() -> None:
    inline = fleet_from_mapping(fleet("http://127.0.0.1:8080"))   # not bound to a listener: allowed
    assert inline.listeners == ()
    with pytest.raises(ConfigError, match="own listener"):
        Settings(fleet=inline, port=8080).resolved_fleet()
    bound = Settings(fleet=inline, port=9999, admin_port=0).resolved_fleet()
    assert bound.listeners == (Listener("127.0.0.1", 9999),)


def test_the_admin_listener_is_the_gateways_own_too() -> None:
    """A node URL on the admin listener (the public port + 1 by default) points back at the gateway."""
    inline = fleet_from_mapping(fleet("http://127.0.0.1:9001"))
    with pytest.raises(ConfigError, match="own listener"):
        Settings(fleet=inline, port=9000).resolved_fleet()
    with pytest.raises(ConfigError, match="own listener"):
        Settings(fleet=inline, port=8080, admin_port=9001).resolved_fleet()
    assert Settings(fleet=inline, port=9000, admin_port=0).resolved_fleet().listeners == (Listener("127.0.0.1", 9000),)
    assert Settings(fleet=inline, port=9000, admin_port=9100).resolved_fleet().listeners == (
        Listener("127.0.0.1", 9000), Listener("127.0.0.1", 9100))


def test_merging_keeps_the_listeners_and_leaves_out_a_refused_discovered_node() -> None:
    base = fleet_from_mapping(fleet("http://10.0.0.1:8000"), listeners=GATEWAY)
    pods = [NodeOverride("pod-ok", "discovery", {"name": "pod-ok", "url": "http://10.0.0.2:8000", "models": ["m"]}),
            NodeOverride("pod-bad", "discovery", {"name": "pod-bad", "url": "http://169.254.1.1:8000",
                                                  "models": ["m"]})]
    eff = merge_overrides(base, [], discovered=pods)
    assert [n.name for n in eff.cfg.nodes] == ["a", "pod-ok"]
    assert eff.cfg.listeners == GATEWAY
    with pytest.raises(ConfigError, match="own listener"):
        merge_overrides(base, [NodeOverride("x", "admin", {"name": "x", "url": "http://127.0.0.1:8080",
                                                           "models": ["m"]})])


def test_address_problem_judges_resolved_addresses() -> None:
    import ipaddress

    p = NetworkPolicy()
    assert address_problem(ipaddress.ip_address("169.254.169.254"), 80, p) is not None
    assert address_problem(ipaddress.ip_address("127.0.0.1"), 8080, p, GATEWAY) is not None
    assert address_problem(ipaddress.ip_address("127.0.0.1"), 9000, p, GATEWAY) is None
    assert address_problem(ipaddress.ip_address("10.9.9.9"), 8080, p, GATEWAY) is None


async def test_a_host_name_is_resolved_and_checked_at_add_time() -> None:
    async def rebinding(host: str, port: int, **_: Any) -> list[Any]:
        return [(2, 1, 6, "", ("10.0.0.7", port)), (2, 1, 6, "", ("169.254.169.254", port))]

    async def fine(host: str, port: int, **_: Any) -> list[Any]:
        return [(2, 1, 6, "", ("10.0.0.7", port))]

    async def nxdomain(host: str, port: int, **_: Any) -> list[Any]:
        raise OSError("Name or service not known")

    why = await resolved_problem("http://evil.example:8000", NetworkPolicy(), GATEWAY, resolve=rebinding)
    assert why is not None and "169.254.169.254" in why
    assert await resolved_problem("http://gpu.example:8000", NetworkPolicy(), GATEWAY, resolve=fine) is None
    # not resolvable yet: let through (checked again at every connection)
    assert await resolved_problem("http://later.example:8000", NetworkPolicy(), GATEWAY, resolve=nxdomain) is None


@pytest.mark.parametrize(("url", "shown"), [
    ("http://user:secret@10.0.0.1:8000/v1", "http://10.0.0.1:8000/v1"),
    ("http://10.0.0.1/v1?token=abc&x=1", "http://10.0.0.1/v1?token=redacted&x=redacted"),
    ("http://10.0.0.1/v1#frag", "http://10.0.0.1/v1#redacted"),
    ("http://u:p@10.0.0.1:notaport/", "http://10.0.0.1:notaport/"),
    ("http://10.0.0.1:8000", "http://10.0.0.1:8000"),
])
def test_urls_are_redacted_of_secrets(url: str, shown: str) -> None:
    assert redact_url(url) == shown
