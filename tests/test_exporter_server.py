"""Serving over real HTTP(S): /metrics, /healthz, TLS and basic auth from a web-config file."""

from __future__ import annotations

import base64
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
import yaml
from prometheus_client import Gauge, make_wsgi_app
from prometheus_client.registry import CollectorRegistry

from fsdpmon.errors import ConfigError
from fsdpmon.httpserve import Server, serve
from fsdpmon.webconfig import WebConfig, load_web_config


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=30,
    )
    return cert, key


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Gauge("fsdpmon_nvml_up", "test", ["node"], registry=registry).labels("n").set(1)
    return registry


@pytest.fixture
def server_factory() -> Iterator:
    started: list[Server] = []

    def start(web: WebConfig, healthy: bool = True) -> Server:
        server = serve(make_wsgi_app(_registry()), "127.0.0.1", 0, web,
                       lambda: (healthy, "ok" if healthy else "last sample is 99s old"))
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _get(url: str, auth: tuple[str, str] | None = None,
         context: ssl.SSLContext | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url)
    if auth:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _write(path: Path, config: dict) -> str:
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_plain_http_metrics_and_healthz(server_factory) -> None:
    server = server_factory(WebConfig())
    status, body = _get(f"http://127.0.0.1:{server.port}/metrics")
    assert status == 200 and 'fsdpmon_nvml_up{node="n"} 1.0' in body
    assert _get(f"http://127.0.0.1:{server.port}/healthz") == (200, "ok\n")
    unhealthy = server_factory(WebConfig(), healthy=False)
    assert _get(f"http://127.0.0.1:{unhealthy.port}/healthz") == (503,
                                                                   "last sample is 99s old\n")


def test_tls_and_basic_auth_from_a_web_config_file(server_factory, tls_files, tmp_path) -> None:
    cert, key = tls_files
    hashed = bcrypt.hashpw(b"scrape-me", bcrypt.gensalt(rounds=4)).decode()
    hashed_2y = "$2y$" + hashed[4:]  # htpasswd writes $2y$; the toolkit accepts it
    path = _write(tmp_path / "web.yaml", {
        "tls_server_config": {"cert_file": str(cert), "key_file": str(key)},
        "basic_auth_users": {"prometheus": hashed, "grafana": hashed_2y},
    })
    server = server_factory(load_web_config(path))
    url = f"https://127.0.0.1:{server.port}"
    context = ssl.create_default_context(cafile=str(cert))
    assert _get(url + "/metrics", context=context)[0] == 401
    assert _get(url + "/metrics", ("prometheus", "wrong"), context)[0] == 401
    assert _get(url + "/metrics", ("nobody", "scrape-me"), context)[0] == 401
    status, body = _get(url + "/metrics", ("prometheus", "scrape-me"), context)
    assert status == 200 and "fsdpmon_nvml_up" in body
    assert _get(url + "/metrics", ("grafana", "scrape-me"), context)[0] == 200
    assert _get(url + "/metrics", ("prometheus", "scrape-me"), context)[0] == 200  # cached
    assert _get(url + "/healthz", context=context) == (200, "ok\n")  # probes need no password
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # no plain HTTP on TLS
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5)
    assert _get(url + "/metrics", ("prometheus", "scrape-me"), context)[0] == 200  # still up


def test_a_stalled_client_does_not_block_other_scrapes(server_factory, tls_files,
                                                       tmp_path) -> None:
    cert, key = tls_files
    path = _write(tmp_path / "web.yaml",
                  {"tls_server_config": {"cert_file": str(cert), "key_file": str(key)}})
    server = server_factory(load_web_config(path))
    context = ssl.create_default_context(cafile=str(cert))
    with socket.create_connection(("127.0.0.1", server.port)) as stalled:
        stalled.sendall(b"\x16\x03\x01")  # the start of a TLS record, then nothing
        t0 = time.monotonic()
        status, _ = _get(f"https://127.0.0.1:{server.port}/metrics", context=context)
        assert status == 200 and time.monotonic() - t0 < 5


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"tls_server_config": {"cert_file": "/nonexistent.pem", "key_file": "/x"}},
         "tls_server_config.cert_file"),
        ({"tls_server_config": {"key_file": "/x"}}, "tls_server_config.cert_file"),
        ({"tls_server_config": {"cert_file": "CERT", "key_file": "KEY", "colour": "red"}},
         "tls_server_config.colour"),
        ({"tls_server_config": {"cert_file": "CERT", "key_file": "KEY",
                                "client_auth_type": "Maybe"}},
         "tls_server_config.client_auth_type"),
        ({"tls_server_config": {"cert_file": "CERT", "key_file": "KEY",
                                "client_auth_type": "RequireAndVerifyClientCert"}},
         "tls_server_config.client_ca_file"),
        ({"tls_server_config": {"cert_file": "CERT", "key_file": "KEY", "min_version": "SSL3"}},
         "tls_server_config.min_version"),
        ({"basic_auth_users": {"prometheus": "plaintext-password"}},
         "basic_auth_users.prometheus"),
        ({"basic_auth_users": ["prometheus"]}, "basic_auth_users"),
        ({"basic_auth": {}}, "basic_auth"),
        (["not", "a", "mapping"], "--web-config-file"),
    ],
)
def test_bad_web_config_names_the_field(config, field, tls_files, tmp_path) -> None:
    cert, key = tls_files
    text = yaml.safe_dump(config).replace("CERT", str(cert)).replace("KEY", str(key))
    path = tmp_path / "web.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_web_config(str(path))
    assert info.value.field == field


def test_unreadable_or_invalid_web_config_file(tmp_path) -> None:
    with pytest.raises(ConfigError, match="--web-config-file: cannot read"):
        load_web_config(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("tls_server_config: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_web_config(str(bad))
    empty = tmp_path / "empty.yaml"
    empty.write_text("")  # would silently mean no TLS and no auth
    with pytest.raises(ConfigError, match="empty: that would mean no TLS and no auth"):
        load_web_config(str(empty))
    assert load_web_config("") == WebConfig()  # no file given: plain HTTP
