"""Where a node URL may point: the ``network_policy:`` section of the fleet file and its rules.

Contract: pure (no I/O). :func:`url_problem` judges a URL as written (its literal host), and
:func:`address_problem` an address a host name resolved to (at add time and again at every
connection: engine/upstream.py and health/probe.py use :class:`~inferlb.fleet.netguard.GuardedResolver`),
both returning None when allowed, else the rule that refuses it. Every node passes through
:class:`~inferlb.config.settings.FleetConfig` validation, whatever its source (fleet file, admin API,
discovery, autoscaler), and that validation applies :func:`url_problem` to each node.

Refused whatever the policy says (the defaults no ``allow:`` can reopen):

* user-info in the URL (``http://user:pw@host``): a node's credential goes in its ``api_key``;
* link-local addresses (169.254.0.0/16, fe80::/10) and the cloud metadata endpoints
  (:data:`METADATA_HOSTS`, :data:`METADATA_ADDRESSES`);
* unspecified addresses (0.0.0.0, ::);
* the gateway itself: a listener's host and port (``Listener``), or loopback with a listener's port;
* an IPv4 address written in any form but dotted decimal (``2852039166``, ``0xA9FEA9FE``,
  ``0251.0376.0251.0376``): resolvers read them as addresses, people rarely do;
* IPv6 forms carrying an IPv4 address (``::ffff:a.b.c.d``, NAT64, 6to4) are judged by that address.

Private ranges and loopback on other ports stay allowed (model servers and the test emulators live
there); ``network_policy: {allow: [CIDR…], deny: [CIDR…]}`` narrows that: an address in a ``deny``
range is refused, and with ``allow`` set, so is an address in none of its ranges.

A host name that does not resolve at add time is let through (its DNS may come up later); the check
at connection time still applies to whatever it resolves to then.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, NamedTuple
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, PlainValidator

__all__ = ["METADATA_ADDRESSES", "METADATA_HOSTS", "IPAddress", "IPNetwork", "Listener", "NetworkPolicy",
           "address_problem", "host_address", "redact_url", "url_problem"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Host names of cloud metadata services (GCP, AWS, Azure, OpenStack, Alibaba), compared without a trailing dot.
METADATA_HOSTS = frozenset({"metadata", "metadata.google.internal", "metadata.goog", "metadata.azure.internal",
                            "instance-data", "instance-data.ec2.internal", "metadata.tencentyun.com"})
#: Metadata addresses outside the link-local ranges (AWS IPv6, Alibaba, Azure's wire server).
METADATA_ADDRESSES = frozenset({ipaddress.ip_address("fd00:ec2::254"), ipaddress.ip_address("100.100.100.200"),
                                ipaddress.ip_address("168.63.129.16")})
_LINK_LOCAL = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NUMERIC_V4 = re.compile(r"^(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+)){0,3}$")


class Listener(NamedTuple):
    """One of the gateway's own listen addresses (``INFERLB_HOST``, ``INFERLB_PORT``)."""

    host: str
    port: int


def _cidr(v: Any) -> IPNetwork:
    if isinstance(v, ipaddress.IPv4Network | ipaddress.IPv6Network):
        return v
    if not isinstance(v, str):
        raise ValueError(f"{v!r} is not a CIDR range (e.g. 10.0.0.0/8, fd00::/8)")
    try:
        return ipaddress.ip_network(v.strip())
    except ValueError as exc:
        raise ValueError(f"{v!r} is not a CIDR range: {exc}") from None


_CIDR = Annotated[IPNetwork, PlainValidator(_cidr), PlainSerializer(str, when_used="json")]


class NetworkPolicy(BaseModel):
    """``network_policy:`` of the fleet file: CIDR ranges that narrow where node URLs may point."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow: list[_CIDR] = Field(default_factory=list)   # set: a node address must be in one of these
    deny: list[_CIDR] = Field(default_factory=list)    # a node address in one of these is refused


def redact_url(url: str) -> str:
    """``url`` fit for logs and events: user-info dropped, each query value and the fragment replaced.
    Textual, so it works on a URL too broken to parse (whose message must not leak either)."""
    rest, hashmark, fragment = url.partition("#")
    rest, qmark, query = rest.partition("?")
    scheme, sep, after = rest.partition("//")
    if sep:
        authority, slash, path = after.partition("/")
        rest = f"{scheme}//{authority.rpartition('@')[2]}{slash}{path}"
    if qmark:
        rest += "?" + "&".join(f"{kv.split('=', 1)[0]}=redacted" for kv in query.split("&") if kv)
    return rest + ("#redacted" if hashmark and fragment else "")


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, compatible, NAT64, 6to4), if any."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if 1 < int(ip) < 2 ** 32:   # ::a.b.c.d (IPv4-compatible, deprecated); not :: nor ::1
        return ipaddress.IPv4Address(int(ip))
    return None


def host_address(host: str) -> IPAddress | None:
    """The address a URL's host names literally (brackets, zone id and a trailing dot ignored),
    or None for a host name."""
    h = host.strip("[]").split("%", 1)[0].rstrip(".")
    try:
        return ipaddress.ip_address(h)
    except ValueError:
        return None


def address_problem(ip: IPAddress, port: int, policy: NetworkPolicy, listeners: tuple[Listener, ...] = ()
                    ) -> str | None:
    """Why a connection to ``ip``:``port`` is refused (the rule, in words), or None when allowed."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_v4(ip)
        if inner is not None:
            why = address_problem(inner, port, policy, listeners)
            return f"{why} (carried in the IPv6 address {ip})" if why else None
        if ip.scope_id:
            ip = ipaddress.IPv6Address(ip.compressed.split("%", 1)[0])
    if ip.is_unspecified:
        return f"{ip} is the unspecified address"
    if ip in METADATA_ADDRESSES or any(ip in net for net in _LINK_LOCAL if net.version == ip.version):
        return f"{ip} is link-local or a cloud metadata address"
    for lst in listeners:
        mine = host_address(lst.host)
        if port == lst.port and (ip.is_loopback or ip == mine):
            return f"{ip}:{port} is this gateway's own listener ({lst.host}:{lst.port})"
    for net in policy.deny:
        if net.version == ip.version and ip in net:
            return f"{ip} is in network_policy.deny {net}"
    if policy.allow and not any(net.version == ip.version and ip in net for net in policy.allow):
        return f"{ip} is in no range of network_policy.allow"
    return None


def url_problem(url: str, policy: NetworkPolicy, listeners: tuple[Listener, ...] = ()) -> str | None:
    """Why a node at ``url`` is refused as written (the rule, in words), or None; a host name is
    judged by name here, and by address once resolved (:func:`address_problem`)."""
    try:
        p = urlsplit(url)
        port = p.port or (443 if p.scheme == "https" else 80)
    except ValueError as exc:
        return f"not a valid URL: {exc}"
    if "@" in p.netloc:
        return "the URL carries user-info (user:password@): put the node's credential in api_key or api_key_env"
    host = (p.hostname or "").rstrip(".")
    if not host:
        return "no host"
    ip = host_address(host)
    if ip is not None:
        return address_problem(ip, port, policy, listeners)
    if "%" in host:
        return f"host {host!r} is percent-encoded"
    if _NUMERIC_V4.match(host):
        return f"host {host!r} is an IPv4 address in a non-standard form: write it in dotted decimal"
    if host in METADATA_HOSTS:
        return f"{host} is a cloud metadata host"
    for lst in listeners:
        if port == lst.port and (host == lst.host.lower().rstrip(".") or host == "localhost"
                                 or host.endswith(".localhost")):
            return f"{host}:{port} is this gateway's own listener ({lst.host}:{lst.port})"
    return None
