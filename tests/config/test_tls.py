"""TLS settings (config/tls.py): a node's ``tls`` block is checked when the fleet is loaded (the
error names the field), its context is built once and shared; the listener's ``INFERLB_TLS_*``
files are checked at start-up with an error naming the variable. Certificates are made in the test."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from inferlb.config.settings import fleet_from_mapping
from inferlb.config.tls import ListenerTLS, NodeTLS, server_context
from inferlb.errors import ConfigError
from tests.support import Certs, certs


@pytest.fixture
def pem(tmp_path: Path) -> Certs:
    return certs(tmp_path)


def _fleet(node: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"models": [{"name": "m"}], "nodes": [{"name": "a", "models": ["m"], **node}], **top}


def _refused(raw: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        fleet_from_mapping(raw, source="fleet.yaml")
    return info.value


def test_a_node_tls_block_builds_one_shared_context(pem: Certs) -> None:
    block = {"ca_file": str(pem.ca), "cert_file": str(pem.client_cert), "key_file": str(pem.client_key),
             "server_name": "localhost"}
    first = fleet_from_mapping(_fleet({"url": "https://127.0.0.1:8443", "tls": block}))
    again = fleet_from_mapping(first.model_dump())
    tls = first.nodes[0].tls
    assert tls is not None and isinstance(tls.context, ssl.SSLContext)
    assert tls.context.verify_mode == ssl.CERT_REQUIRED and tls.context.check_hostname
    # re-validated (a reload, a node added live): the same context, and the configs stay equal
    assert again.nodes[0].tls is not None and again.nodes[0].tls.context is tls.context
    assert again.nodes[0] == first.nodes[0]


def test_a_rotated_certificate_gives_a_new_context(pem: Certs, tmp_path: Path) -> None:
    before = NodeTLS(ca_file=str(pem.ca))
    (tmp_path / "next").mkdir()
    other = certs(tmp_path / "next")
    pem.ca.write_bytes(other.ca.read_bytes() + b"\n")
    assert NodeTLS(ca_file=str(pem.ca)).context is not before.context


@pytest.mark.parametrize(("field", "what"), [("ca_file", "cannot read"), ("cert_file", "cannot read"),
                                             ("key_file", "cannot read")])
def test_a_missing_file_is_refused_naming_the_field(pem: Certs, field: str, what: str) -> None:
    block = {"cert_file": str(pem.client_cert), "key_file": str(pem.client_key), field: "/nonexistent/x.pem"}
    err = _refused(_fleet({"url": "https://n.example", "tls": block}))
    assert err.path == f"nodes[0].tls.{field}" and what in err.message and "/nonexistent/x.pem" in err.message


def test_a_key_that_does_not_match_its_certificate_is_refused(pem: Certs) -> None:
    block = {"cert_file": str(pem.client_cert), "key_file": str(pem.other_key)}
    err = _refused(_fleet({"url": "https://n.example", "tls": block}))
    assert err.path == "nodes[0].tls" and "key_file" in err.message and "does not match" in err.message
    assert "PRIVATE KEY" not in str(err)   # a path and a reason, never the key


def test_a_ca_file_without_a_certificate_is_refused(pem: Certs) -> None:
    err = _refused(_fleet({"url": "https://n.example", "tls": {"ca_file": str(pem.client_key)}}))
    assert err.path == "nodes[0].tls" and "ca_file" in err.message


def test_an_encrypted_key_takes_its_password_from_the_named_variable(pem: Certs, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    key = serialization.load_pem_private_key(pem.client_key.read_bytes(), password=None)
    locked = tmp_path / "locked-key.pem"
    locked.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.BestAvailableEncryption(b"s3cret-pw")))
    block = {"cert_file": str(pem.client_cert), "key_file": str(locked), "key_password_env": "NODE_KEY_PW"}
    monkeypatch.delenv("NODE_KEY_PW", raising=False)
    err = _refused(_fleet({"url": "https://n.example", "tls": block}))   # no terminal prompt: an error
    assert "NODE_KEY_PW" in err.message and "missing or wrong" in err.message
    monkeypatch.setenv("NODE_KEY_PW", "s3cret-pw")
    cfg = fleet_from_mapping(_fleet({"url": "https://n.example", "tls": block}))
    assert cfg.nodes[0].tls is not None
    assert "s3cret-pw" not in repr(cfg) and "s3cret-pw" not in str(cfg.model_dump())


def test_tls_on_a_plain_http_node_is_refused(pem: Certs) -> None:
    err = _refused(_fleet({"url": "http://n.example", "tls": {"ca_file": str(pem.ca)}}))
    assert err.path == "nodes[0]" and "not https://" in err.message


def test_insecure_skip_verify_with_a_ca_is_refused(pem: Certs) -> None:
    err = _refused(_fleet({"url": "https://n.example", "tls": {"ca_file": str(pem.ca), "insecure_skip_verify": True}}))
    assert "insecure_skip_verify" in err.message
    ok = NodeTLS(insecure_skip_verify=True)
    assert ok.context.verify_mode == ssl.CERT_NONE and not ok.context.check_hostname


def test_the_fleet_default_goes_to_https_nodes_without_their_own(pem: Certs) -> None:
    raw = {"models": [{"name": "m"}], "node_tls": {"ca_file": str(pem.ca)}, "nodes": [
        {"name": "a", "url": "https://a.example", "models": ["m"]},
        {"name": "b", "url": "http://b.example", "models": ["m"]},
        {"name": "c", "url": "https://c.example", "models": ["m"], "tls": {}}]}
    a, b, c = fleet_from_mapping(raw).nodes
    assert a.tls is not None and a.tls.ca_file == str(pem.ca)
    assert b.tls is None               # plain http: no TLS to configure
    assert c.tls == NodeTLS()          # its own block (the system CAs) wins


def test_https_nodes_still_pass_the_network_policy(pem: Certs) -> None:
    raw = _fleet({"url": "https://10.0.0.5:8443", "tls": {"ca_file": str(pem.ca)}},
                 network_policy={"allow": ["10.0.0.0/8"]})
    assert fleet_from_mapping(raw).nodes[0].url == "https://10.0.0.5:8443"


# ---------------------------------------------------------------- the listener (INFERLB_TLS_*)

def _listener_error(**kw: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        server_context(ListenerTLS(**kw))
    return info.value


def test_the_listener_context_from_the_environment(pem: Certs, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERLB_TLS_CERT_FILE", str(pem.server_cert))
    monkeypatch.setenv("INFERLB_TLS_KEY_FILE", str(pem.server_key))
    monkeypatch.setenv("INFERLB_TLS_CLIENT_CA_FILE", str(pem.ca))
    tls = ListenerTLS()
    ctx = server_context(tls)
    assert ctx is not None and ctx.verify_mode == ssl.CERT_REQUIRED   # required: the default with a client CA
    monkeypatch.setenv("INFERLB_TLS_CLIENT_AUTH", "optional")
    optional = server_context(ListenerTLS())
    assert optional is not None and optional.verify_mode == ssl.CERT_OPTIONAL
    assert server_context(ListenerTLS(cert_file=None, key_file=None, client_ca_file=None,
                                      client_auth=None)) is None


def test_listener_misconfigurations_name_the_variable(pem: Certs) -> None:
    err = _listener_error(cert_file=pem.server_cert, key_file=Path("/nonexistent/key.pem"))
    assert err.path == "INFERLB_TLS_KEY_FILE" and "cannot read /nonexistent/key.pem" in err.message
    err = _listener_error(cert_file=pem.server_cert, key_file=pem.other_key)
    assert err.path == "INFERLB_TLS_KEY_FILE" and "does not match" in err.message
    err = _listener_error(cert_file=pem.server_cert, key_file=pem.server_key, client_auth="required")
    assert err.path == "INFERLB_TLS_CLIENT_AUTH" and "INFERLB_TLS_CLIENT_CA_FILE" in err.message
    err = _listener_error(key_file=pem.server_key)
    assert err.path == "INFERLB_TLS_KEY_FILE" and "without INFERLB_TLS_CERT_FILE" in err.message
    err = _listener_error(cert_file=pem.server_cert, key_file=pem.server_key, client_ca_file=pem.server_key)
    assert err.path == "INFERLB_TLS_CLIENT_CA_FILE"


def test_the_listener_key_password_is_a_secret(pem: Certs, tmp_path: Path) -> None:
    key = serialization.load_pem_private_key(pem.server_key.read_bytes(), password=None)
    locked = tmp_path / "locked.pem"
    locked.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.BestAvailableEncryption(b"pw-listener")))
    err = _listener_error(cert_file=pem.server_cert, key_file=locked, key_password="wrong")
    assert err.path == "INFERLB_TLS_KEY_PASSWORD" and "wrong" not in err.message.replace("missing or wrong", "")
    tls = ListenerTLS(cert_file=pem.server_cert, key_file=locked, key_password="pw-listener")
    assert server_context(tls) is not None and "pw-listener" not in repr(tls)


def test_a_denied_https_node_is_refused_by_the_network_policy(pem: Certs) -> None:
    raw = _fleet({"url": "https://10.0.0.5:8443", "tls": {"ca_file": str(pem.ca)}},
                 network_policy={"deny": ["10.0.0.0/8"]})
    assert _refused(raw).path == "nodes[0].url"
