"""The Prometheus exporter-toolkit web-config file: TLS and basic auth for ``/metrics``.

Same YAML as node_exporter's ``--web.config.file``, so operators reuse what they have::

    tls_server_config:
      cert_file: /etc/fsdpmon/tls.crt
      key_file: /etc/fsdpmon/tls.key
      client_ca_file: /etc/fsdpmon/ca.crt          # optional
      client_auth_type: RequireAndVerifyClientCert # optional
      min_version: TLS12                           # optional
    basic_auth_users:
      prometheus: $2y$10$...                       # bcrypt hash

Unknown keys are errors (as in the toolkit), each naming the field; so are hashes bcrypt cannot
read, files that cannot be read, certificates that do not load and an empty file (which would
silently mean no TLS and no auth). A hash of cost below 10 is accepted with a warning.
"""

from __future__ import annotations

import logging
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from fsdpmon.errors import ConfigError

log = logging.getLogger(__name__)

BCRYPT_HASH = re.compile(r"^\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}$")
MIN_BCRYPT_COST = 10  # the exporter-toolkit's and htpasswd -B's default
HTTP_KEYS = {"http2", "headers"}

TOP_KEYS = {"tls_server_config", "basic_auth_users", "http_server_config"}
TLS_KEYS = {"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version",
            "max_version", "cipher_suites", "curve_preferences", "prefer_server_cipher_suites"}
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}


@dataclass(frozen=True)
class TlsConfig:
    cert_file: str
    key_file: str
    client_ca_file: str = ""
    client_auth_type: str = "NoClientCert"
    min_version: str = "TLS12"

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = TLS_VERSIONS[self.min_version]
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
            if self.client_ca_file:
                context.load_verify_locations(cafile=self.client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError("tls_server_config.cert_file", f"cannot load: {exc}") from None
        context.verify_mode = CLIENT_AUTH[self.client_auth_type]
        return context


@dataclass(frozen=True)
class WebConfig:
    tls: TlsConfig | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(where, f"must be a mapping, got {type(value).__name__}")
    return value


def _unknown(found: Mapping[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(found) - allowed)
    if extra:
        raise ConfigError(f"{where}{extra[0]}", "unknown field")


def _file(tls: Mapping[str, Any], key: str, required: bool) -> str:
    value = tls.get(key) or ""
    where = f"tls_server_config.{key}"
    if not isinstance(value, str):
        raise ConfigError(where, "must be a file path")
    if required and not value:
        raise ConfigError(where, "is required when tls_server_config is set")
    if value and not os.path.isfile(value):
        raise ConfigError(where, f"no such file: {value}")
    if value and not os.access(value, os.R_OK):
        raise ConfigError(where, f"cannot read {value}: permission denied")
    return value


def _tls(raw: Any) -> TlsConfig | None:
    tls = _mapping(raw, "tls_server_config")
    if not tls:
        return None
    _unknown(tls, TLS_KEYS, "tls_server_config.")
    auth = tls.get("client_auth_type") or "NoClientCert"
    if auth not in CLIENT_AUTH:
        raise ConfigError("tls_server_config.client_auth_type",
                          f"unknown value {auth!r}; choose one of {', '.join(CLIENT_AUTH)}")
    min_version = tls.get("min_version") or "TLS12"
    if min_version not in TLS_VERSIONS:
        raise ConfigError("tls_server_config.min_version",
                          f"unknown value {min_version!r}; choose one of {', '.join(TLS_VERSIONS)}")
    ca = _file(tls, "client_ca_file", required=False)
    if auth == "RequireAndVerifyClientCert" and not ca:
        raise ConfigError("tls_server_config.client_ca_file",
                          "is required for client_auth_type RequireAndVerifyClientCert")
    config = TlsConfig(_file(tls, "cert_file", True), _file(tls, "key_file", True), ca, auth,
                       min_version)
    config.ssl_context()  # a certificate or key that does not load fails here, at start
    return config


def _users(raw: Any) -> dict[str, bytes]:
    users: dict[str, bytes] = {}
    for user, hashed in _mapping(raw, "basic_auth_users").items():
        where = f"basic_auth_users.{user}"
        match = BCRYPT_HASH.match(hashed) if isinstance(hashed, str) else None
        if match is None:
            raise ConfigError(where, "must be a bcrypt hash: $2a$/$2b$/$2y$, a two-digit cost, "
                                     "$, 53 characters of salt and hash (htpasswd -nBC 12)")
        cost = int(match.group(1))
        if not 4 <= cost <= 31:
            raise ConfigError(where, f"bcrypt cost {cost} is outside 4..31")
        if cost < MIN_BCRYPT_COST:
            log.warning("%s: bcrypt cost %d is below %d: cheap to guess offline; "
                        "make a new hash with htpasswd -nBC 12", where, cost, MIN_BCRYPT_COST)
        users[str(user)] = hashed.encode()
    return users


def load_web_config(path: str | None, option: str = "--web-config-file") -> WebConfig:
    """Parse and check a web-config file (none: plain HTTP); ConfigError names the bad field."""
    if not path:
        return WebConfig()
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except OSError as exc:
        raise ConfigError(option, f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        problem = " ".join(str(exc).split())
        raise ConfigError(option, f"{path} is not valid YAML: {problem}") from None
    if raw is None:
        raise ConfigError(option, f"{path} is empty: that would mean no TLS and no auth; "
                                  "configure tls_server_config or basic_auth_users, or drop "
                                  "the option")
    top = _mapping(raw, option)
    _unknown(top, TOP_KEYS, "")
    http = _mapping(top.get("http_server_config"), "http_server_config")
    _unknown(http, HTTP_KEYS, "http_server_config.")
    config = WebConfig(tls=_tls(top.get("tls_server_config")),
                       users=_users(top.get("basic_auth_users")))
    if config.tls is None and not config.users:
        raise ConfigError(option, f"{path} configures neither tls_server_config nor "
                                  "basic_auth_users")
    return config
