"""TLS: the listener's certificate (``INFERLB_TLS_*``) and how the gateway reaches an https node (``tls:``).

Contract:

* :class:`ListenerTLS` comes from ``INFERLB_TLS_CERT_FILE``, ``INFERLB_TLS_KEY_FILE``,
  ``INFERLB_TLS_KEY_PASSWORD`` (a secret: masked in every dump and repr), ``INFERLB_TLS_CLIENT_CA_FILE``
  and ``INFERLB_TLS_CLIENT_AUTH`` (``none`` | ``optional`` | ``required``; unset: ``required`` when a
  client CA is given, else ``none``). :func:`server_context` turns it into the listener's
  ``ssl.SSLContext`` (None without a certificate) or raises :class:`~inferlb.errors.ConfigError`
  naming the variable: a file that cannot be read, a key that does not match its certificate, a
  wrong key password, a client CA file without a certificate, client auth asked for without a CA.
* :class:`NodeTLS` is a node's ``tls:`` block in the fleet file (or in an admin API node add):
  ``ca_file`` (the CA the node's certificate must chain to, in place of the system's), ``cert_file``
  and ``key_file`` (the gateway's client certificate: mTLS), ``key_password_env`` (the name of the
  environment variable holding the key's password: never the password itself, so it is never
  stored in the overrides table or shown by the admin API), ``server_name`` (the name sent as SNI
  and checked against the certificate, where the URL's host is an address) and
  ``insecure_skip_verify`` (no certificate check at all: a test fleet only). It is validated when
  the fleet is: each file readable and the context built, so a broken block is a ValueError naming
  the field, located by the fleet loader (``nodes[2].tls.cert_file``).
* One ``ssl.SSLContext`` per block and file contents: contexts are cached on the block's fields and
  its files' ``stat`` (size, mtime, inode), so re-validating the fleet (a reload, a node added live)
  reuses the context (and its TLS session cache) and configs stay equal, while a certificate
  rotated on disk is picked up at the next reload.
* A key's password is always handed to OpenSSL through a callback: an encrypted key with no
  password fails at once instead of OpenSSL prompting on the terminal of a service.
* Nothing here logs, returns or puts into a message a file's contents or a password: messages name
  the field, the path and OpenSSL's reason.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from inferlb.errors import ConfigError

__all__ = ["ListenerTLS", "NodeTLS", "client_context", "server_context"]

ClientAuth = Literal["none", "optional", "required"]


class ListenerTLS(BaseSettings):
    """The listener's certificate and client-certificate policy (module docstring), from ``INFERLB_TLS_*``."""

    model_config = SettingsConfigDict(env_prefix="INFERLB_TLS_", extra="ignore", frozen=True)

    cert_file: Path | None = None
    key_file: Path | None = None                      # unset: the key is in cert_file
    key_password: SecretStr | None = None
    client_ca_file: Path | None = None
    client_auth: ClientAuth | None = None             # unset: required with a client CA, else none

    @property
    def enabled(self) -> bool:
        """Whether the listener serves HTTPS (a certificate is configured)."""
        return self.cert_file is not None

    def effective_client_auth(self) -> ClientAuth:
        """``client_auth``, or its default: ``required`` when a client CA is given, else ``none``."""
        if self.client_auth is not None:
            return self.client_auth
        return "required" if self.client_ca_file is not None else "none"


def _password(value: str | None) -> Callable[[], str]:
    # Always a callback: with password=None OpenSSL would prompt on the terminal for an encrypted key.
    return lambda: value or ""


def _readable(path: Path) -> str | None:
    """Why ``path`` cannot be read as a file, or None."""
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None if path.is_file() else "not a regular file"


def _reason(exc: ssl.SSLError) -> str:
    return str(exc.reason or exc.strerror or exc)


class _FileProblem(ValueError):
    """A certificate, key or CA file that does not load; ``which`` is the field at fault
    (``cert``, ``key``, ``password`` or ``ca``), so each caller names it its own way."""

    def __init__(self, which: str, message: str) -> None:
        self.which = which
        super().__init__(message)


def _encrypted(path: Path) -> bool:
    """Whether the PEM file holds an encrypted key (PKCS#8 or the older Proc-Type header): OpenSSL
    says only "PEM lib" for a missing or wrong password, so the file tells which it was."""
    try:
        head = path.read_bytes()
    except OSError:
        return False
    return b"BEGIN ENCRYPTED PRIVATE KEY" in head or b"Proc-Type: 4,ENCRYPTED" in head


def _load_chain(ctx: ssl.SSLContext, cert: Path, key: Path | None, password: str | None, *,
                names: tuple[str, str, str]) -> None:
    """``ctx.load_cert_chain``, with a :class:`_FileProblem` naming the field (``names``: the cert,
    key and password fields as the user writes them) for each way it fails."""
    cert_name, key_name, password_name = names
    try:
        ctx.load_cert_chain(cert, key, password=_password(password))
    except ssl.SSLError as exc:
        text = str(exc)
        if "KEY_VALUES_MISMATCH" in text:
            raise _FileProblem("key", f"{key_name} {key or cert} does not match the certificate in {cert_name} "
                                      f"{cert}") from None
        if _encrypted(key or cert):
            raise _FileProblem("password", f"{key_name} {key or cert}: the key is encrypted and {password_name} "
                                           "is missing or wrong") from None
        shown = f"{cert_name} {cert}" + (f" / {key_name} {key}" if key is not None else "")
        raise _FileProblem("cert", f"{shown}: not a PEM certificate and its private key ({_reason(exc)})") from None


def _load_ca(ctx: ssl.SSLContext, ca: Path, *, name: str) -> None:
    try:
        ctx.load_verify_locations(cafile=ca)
    except ssl.SSLError as exc:
        raise _FileProblem("ca", f"{name} {ca}: no PEM CA certificate in it ({_reason(exc)})") from None


def server_context(tls: ListenerTLS) -> ssl.SSLContext | None:
    """The listener's context (TLS 1.2 or later, the client certificate policy applied), None when
    no certificate is configured; ConfigError naming the ``INFERLB_TLS_*`` variable otherwise."""
    def fail(var: str, message: str) -> ConfigError:
        return ConfigError(message, source="environment", path=f"INFERLB_TLS_{var}")

    if tls.cert_file is None:
        for var, value in (("KEY_FILE", tls.key_file), ("CLIENT_CA_FILE", tls.client_ca_file)):
            if value is not None:
                raise fail(var, "set without INFERLB_TLS_CERT_FILE: the listener has no certificate to serve")
        if tls.client_auth not in (None, "none"):
            raise fail("CLIENT_AUTH", "set without INFERLB_TLS_CERT_FILE: client certificates need HTTPS")
        return None
    for var, path in (("CERT_FILE", tls.cert_file), ("KEY_FILE", tls.key_file), ("CLIENT_CA_FILE", tls.client_ca_file)):
        why = _readable(path) if path is not None else None
        if why is not None:
            raise fail(var, f"cannot read {path}: {why}")
    auth = tls.effective_client_auth()
    if auth != "none" and tls.client_ca_file is None:
        raise fail("CLIENT_AUTH", f"{auth!r} needs INFERLB_TLS_CLIENT_CA_FILE (the CA client certificates must "
                                  "chain to)")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    password = tls.key_password.get_secret_value() if tls.key_password is not None else None
    try:
        _load_chain(ctx, tls.cert_file, tls.key_file, password,
                    names=("INFERLB_TLS_CERT_FILE", "INFERLB_TLS_KEY_FILE", "INFERLB_TLS_KEY_PASSWORD"))
        if tls.client_ca_file is not None:
            _load_ca(ctx, tls.client_ca_file, name="INFERLB_TLS_CLIENT_CA_FILE")
    except _FileProblem as exc:
        var = {"key": "KEY_FILE" if tls.key_file is not None else "CERT_FILE", "password": "KEY_PASSWORD",
               "ca": "CLIENT_CA_FILE"}.get(exc.which, "CERT_FILE")
        raise fail(var, str(exc)) from None
    ctx.verify_mode = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}[auth]
    return ctx


class NodeTLS(BaseModel):
    """How the gateway reaches one https node (module docstring); ``tls:`` on a node."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None                       # unset: the key is in cert_file
    key_password_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=256)
    server_name: str | None = Field(None, pattern=r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")
    insecure_skip_verify: bool = False
    _context: ssl.SSLContext | None = PrivateAttr(None)

    @field_validator("ca_file", "cert_file", "key_file")
    @classmethod
    def _file(cls, v: str | None) -> str | None:
        if v is None:
            return None
        why = _readable(Path(v))
        if why is not None:
            raise ValueError(f"cannot read {v}: {why}")
        return v

    @model_validator(mode="after")
    def _build(self) -> NodeTLS:
        if self.key_file is not None and self.cert_file is None:
            raise ValueError("key_file is set without cert_file (the client certificate it belongs to)")
        if self.key_password_env is not None and self.cert_file is None:
            raise ValueError("key_password_env is set without cert_file")
        if self.insecure_skip_verify and (self.ca_file is not None or self.server_name is not None):
            raise ValueError("insecure_skip_verify checks no certificate: ca_file and server_name would be ignored; "
                             "set one or the other")
        self._context = client_context(self)
        return self

    @property
    def context(self) -> ssl.SSLContext:
        """The context to connect with (built and checked at validation; shared, module docstring)."""
        assert self._context is not None
        return self._context


_CACHE_MAX = 256
_client_contexts: dict[tuple[object, ...], ssl.SSLContext] = {}


def _stat(path: str | None) -> tuple[int, int, int] | None:
    if path is None:
        return None
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ino


def client_context(tls: NodeTLS) -> ssl.SSLContext:
    """The context for a node's ``tls`` block, cached on the block and its files (module
    docstring); ValueError naming the field when a file is not what it should be."""
    password = os.environ.get(tls.key_password_env) if tls.key_password_env is not None else None
    key = (tls.ca_file, tls.cert_file, tls.key_file, tls.key_password_env, password, tls.insecure_skip_verify,
           _stat(tls.ca_file), _stat(tls.cert_file), _stat(tls.key_file))
    cached = _client_contexts.get(key)
    if cached is not None:
        return cached
    if tls.ca_file is not None:
        # The node's CA in place of the system's (hostname checked, certificate required).
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        _load_ca(ctx, Path(tls.ca_file), name="ca_file")
    else:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if tls.insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if tls.cert_file is not None:
        _load_chain(ctx, Path(tls.cert_file), Path(tls.key_file) if tls.key_file else None, password,
                    names=("cert_file", "key_file", f"key_password_env ({tls.key_password_env})"
                           if tls.key_password_env else "key_password_env"))
    if len(_client_contexts) >= _CACHE_MAX:
        _client_contexts.pop(next(iter(_client_contexts)))
    _client_contexts[key] = ctx
    return ctx
