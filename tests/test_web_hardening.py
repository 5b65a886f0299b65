"""Endpoints a client cannot turn against their host: bcrypt work bounded, odd credentials 401 in
the same time, TLS failures one line, the training endpoint rendering once per second at a
bounded pace and taking the exporter's web config; and the settings that guard all of that."""

from __future__ import annotations

import base64
import logging
import math
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest
import yaml
from support import free_port

from fsdpmon import basicauth
from fsdpmon.basicauth import BasicAuth, Verdict
from fsdpmon.errors import ConfigError
from fsdpmon.exporters.cli import ExporterConfig
from fsdpmon.httpserve import BACKLOG, serve
from fsdpmon.monitor.config import MonitorConfig
from fsdpmon.monitor.server import PortKeeper
from fsdpmon.monitor.state import RankStateWriter
from fsdpmon.trainer.config import parse_config
from fsdpmon.webconfig import WebConfig, load_web_config

REPO = Path(__file__).resolve().parents[1]
HASH4 = bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=4))


def _header(user: str, password: bytes) -> str:
    return "Basic " + base64.b64encode(user.encode() + b":" + password).decode()


def test_password_checks_run_one_at_a_time_and_extra_guessers_are_told_busy(monkeypatch):
    running, peak, lock = 0, 0, threading.Lock()
    real = bcrypt.checkpw

    def slow_checkpw(password: bytes, hashed: bytes) -> bool:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.05)  # as long as a cost-10 check, without burning the CPU here
        with lock:
            running -= 1
        return real(password, hashed)

    monkeypatch.setattr(basicauth.bcrypt, "checkpw", slow_checkpw)
    auth = BasicAuth({"prometheus": HASH4})
    auth.busy_delay = 0.0
    verdicts: list[Verdict] = []
    guessers = [threading.Thread(target=lambda i=i: verdicts.append(
        auth.check(_header("prometheus", f"guess-{i}".encode())))) for i in range(16)]
    for t in guessers:
        t.start()
    for t in guessers:
        t.join()
    admitted = basicauth.BCRYPT_AT_ONCE + basicauth.BCRYPT_WAITING
    assert peak <= basicauth.BCRYPT_AT_ONCE, f"{peak} bcrypt checks at once"
    assert verdicts.count(Verdict.BUSY) >= 16 - admitted, verdicts
    assert Verdict.OK not in verdicts
    checks = auth.bcrypt_checks
    assert auth.check(_header("prometheus", b"right")) is Verdict.OK
    assert auth.check(_header("prometheus", b"right")) is Verdict.OK  # cached: no bcrypt
    assert auth.bcrypt_checks == checks + 1, auth.bcrypt_checks - checks


def test_a_flood_of_fresh_wrong_passwords_cannot_evict_the_scrapers_cached_success():
    auth = BasicAuth({"prometheus": HASH4})
    good = _header("prometheus", b"right")
    assert auth.check(good) is Verdict.OK
    guesses = 2 * basicauth.CACHE_ENTRIES  # more than the cache holds, each one new
    for i in range(guesses):
        assert auth.check(_header("prometheus", f"guess-{i}".encode())) is Verdict.DENIED
    checks = auth.bcrypt_checks
    assert auth.check(good) is Verdict.OK
    assert auth.bcrypt_checks == checks, (
        f"the scraper paid bcrypt {auth.bcrypt_checks - checks} time(s) again after {guesses} "
        "guesses: its cached success was evicted, so under guessing it would queue behind them")
    wrong = _header("prometheus", b"guess-0")
    assert auth.check(wrong) is Verdict.DENIED  # a failure is never served from the cache
    assert auth.bcrypt_checks == checks + 1, auth.bcrypt_checks - checks


def test_over_long_passwords_and_unknown_users_are_denied_with_the_same_bcrypt_work():
    long_hash = bcrypt.hashpw(b"a" * 72, bcrypt.gensalt(rounds=4))
    auth = BasicAuth({"prometheus": long_hash})
    cases = [("prometheus", b"a" * 73),  # bcrypt refuses > 72 bytes; the first 72 match
             ("prometheus", b"a" * 4000),
             ("nobody", b"a" * 73),
             ("nobody", b"whatever")]
    for user, password in cases:
        before = auth.bcrypt_checks
        assert auth.check(_header(user, password)) is Verdict.DENIED, (user, len(password))
        assert auth.bcrypt_checks == before + 1, (user, len(password))
    assert auth.check(_header("prometheus", b"a" * 72)) is Verdict.OK
    for header in (None, "Bearer x", "Basic !!!", "Basic " + base64.b64encode(b"nocolon").decode()):
        assert auth.check(header) is Verdict.DENIED, header


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=30)
    return cert, key


def _status(url: str, header: str | None = None, context: ssl.SSLContext | None = None) -> int:
    request = urllib.request.Request(url)
    if header:
        request.add_header("Authorization", header)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_exporter_answers_401_to_a_73_byte_password_and_logs_tls_failures_once(
        tls_files, tmp_path, caplog, capfd):
    cert, key = tls_files
    web_file = tmp_path / "web.yaml"
    web_file.write_text(yaml.safe_dump({
        "tls_server_config": {"cert_file": str(cert), "key_file": str(key)},
        "basic_auth_users": {"prometheus": HASH4.decode()}}))
    app = lambda environ, start: (start("200 OK", []), [b"ok\n"])[1]  # noqa: E731
    server = serve(app, "127.0.0.1", 0, load_web_config(str(web_file)), lambda: (True, "ok"))
    url = f"https://127.0.0.1:{server.port}/metrics"
    context = ssl.create_default_context(cafile=str(cert))
    try:
        assert _status(url, _header("prometheus", b"x" * 73), context) == 401
        assert _status(url, _header("ghost", b"x" * 73), context) == 401
        assert _status(url, _header("prometheus", b"right"), context) == 200
        caplog.set_level(logging.WARNING, logger="fsdpmon.httpserve")
        for _ in range(5):  # plain HTTP to the TLS port: a handshake failure each
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
                sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
                sock.recv(100)
        deadline = time.monotonic() + 5
        while server.failed_connections < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.failed_connections == 5, server.failed_connections
        lines = [r.getMessage() for r in caplog.records if r.name == "fsdpmon.httpserve"]
        assert len(lines) == 1 and "TLS handshake failed" in lines[0], lines
        assert "Traceback" not in capfd.readouterr().err
        assert _status(url, _header("prometheus", b"right"), context) == 200
    finally:
        server.stop()
    assert BACKLOG >= 128


def _serving_keeper(tmp_path: Path, **kwargs) -> tuple[PortKeeper, RankStateWriter, int]:
    writer = RankStateWriter(tmp_path / "state", 0)
    writer.snapshot({"pid": writer.pid, "rank": 0, "local_rank": 0, "job_name": "j",
                     "values": {"fsdpmon_train_loss": 2.5}})
    writer.heartbeat(time.time(), 1, 1, 1, 0, 60)
    port = free_port()
    keeper = PortKeeper(tmp_path / "state", "127.0.0.1", port, 0, 0.1, **kwargs)
    keeper.start()
    deadline = time.monotonic() + 10
    while not keeper.serving and time.monotonic() < deadline:
        time.sleep(0.02)
    assert keeper.serving
    return keeper, writer, port


def test_training_endpoint_renders_once_per_second_at_a_bounded_pace(tmp_path):
    rate = 20.0
    keeper, writer, port = _serving_keeper(tmp_path, max_per_second=rate)
    try:
        n = 12
        t0 = time.monotonic()
        for _ in range(n):
            assert _status(f"http://127.0.0.1:{port}/metrics") == 200
        elapsed = time.monotonic() - t0
        # n request starts spaced 1/rate apart take at least (n-1)/rate, whatever the client
        assert elapsed >= (n - 1) / rate * 0.99, f"{n} requests in {elapsed:.3f}s at {rate}/s"
        renders = keeper.exposition.renders
        assert renders <= math.ceil(elapsed / 1.0) + 1, f"{renders} renders in {elapsed:.2f}s"
    finally:
        keeper.close()
        writer.close()


def test_training_endpoint_takes_basic_auth_from_a_web_config(tmp_path):
    web = WebConfig(users={"prometheus": HASH4})
    keeper, writer, port = _serving_keeper(tmp_path, web=web)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        assert _status(url) == 401
        assert _status(url, _header("prometheus", b"wrong")) == 401
        assert _status(url, _header("prometheus", b"right")) == 200
    finally:
        keeper.close()
        writer.close()


def _web(tmp_path: Path, text: str) -> str:
    path = tmp_path / "web.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(("text", "field", "problem"), [
    ("basic_auth_users: {p: $2y$10$short}", "basic_auth_users.p", "must be a bcrypt hash"),
    ("basic_auth_users: {p: '$2y$99$" + "a" * 53 + "'}", "basic_auth_users.p",
     "cost 99 is outside"),
    ("http_server_config: {http3: true}", "http_server_config.http3", "unknown field"),
    ("tls_server_config: {}\n", "--web-config-file", "neither"),
    ("", "--web-config-file", "is empty"),
    ("# only a comment\n", "--web-config-file", "is empty"),
])
def test_bad_web_config_fails_at_start_naming_the_field(tmp_path, text, field, problem):
    with pytest.raises(ConfigError) as err:
        load_web_config(_web(tmp_path, text))
    assert err.value.field == field and problem in err.value.problem, str(err.value)


def test_a_cheap_bcrypt_hash_is_accepted_with_a_warning(tmp_path, caplog):
    path = _web(tmp_path, f"basic_auth_users: {{p: '{HASH4.decode()}'}}")
    with caplog.at_level(logging.WARNING, logger="fsdpmon.webconfig"):
        assert load_web_config(path).users == {"p": HASH4}
    assert any("bcrypt cost 4 is below 10" in r.getMessage() for r in caplog.records)


def test_a_certificate_that_does_not_load_fails_at_start(tmp_path, tls_files):
    cert, _ = tls_files
    with pytest.raises(ConfigError, match=r"tls_server_config\.cert_file: cannot load"):
        load_web_config(_web(tmp_path, yaml.safe_dump(
            {"tls_server_config": {"cert_file": str(cert), "key_file": str(cert)}})))


@pytest.mark.parametrize(("env", "var"), [
    ({"FSDPMON_LISTEN_ADDRESS": "no.such.host.invalid"}, "FSDPMON_LISTEN_ADDRESS"),
    ({"FSDPMON_LISTEN_ADDRESS": "192.0.2.1"}, "FSDPMON_LISTEN_ADDRESS"),  # not ours
    ({"FSDPMON_SERVER_RETRY_SECONDS": "inf"}, "FSDPMON_SERVER_RETRY_SECONDS"),
    ({"FSDPMON_SERVER_RETRY_SECONDS": "1e-9"}, "FSDPMON_SERVER_RETRY_SECONDS"),
    ({"FSDPMON_STALL_FLOOR_SECONDS": "nan"}, "FSDPMON_STALL_FLOOR_SECONDS"),
    ({"FSDPMON_LOG_INTERVAL": "0"}, "FSDPMON_LOG_INTERVAL"),
    ({"FSDPMON_MAX_SCRAPES_PER_SECOND": "inf"}, "FSDPMON_MAX_SCRAPES_PER_SECOND"),
])
def test_bad_monitor_settings_fail_at_start_naming_the_variable(env, var):
    with pytest.raises(ConfigError) as err:
        MonitorConfig.from_env(env={"FSDPMON_PORT": str(free_port()), **env})
    assert err.value.field == var, str(err.value)


@pytest.mark.parametrize("interval", [math.inf, 1e-9, math.nan])
def test_exporter_interval_is_bounded(interval):
    with pytest.raises(ConfigError, match="--interval: must be between"):
        ExporterConfig(interval_s=interval, node_name="n").validate()


def test_trainer_log_interval_comes_from_the_environment_unless_the_flag_is_given(monkeypatch):
    from fsdpmon.trainer.loop import _monitor_config

    monkeypatch.setenv("FSDPMON_LOG_INTERVAL", "3")
    assert _monitor_config(parse_config(["--metrics-port", "0"])).log_interval == 3
    assert _monitor_config(parse_config(["--metrics-port", "0", "--log-every", "7"])
                           ).log_interval == 7
    monkeypatch.delenv("FSDPMON_LOG_INTERVAL")
    assert _monitor_config(parse_config(["--metrics-port", "0"])).log_interval == 10


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="reading as another user needs root and setpriv")
def test_a_file_the_user_cannot_read_fails_at_start_naming_the_field(tls_files):
    cert, key = tls_files
    work = Path(tempfile.mkdtemp(prefix="fsdpmon-test-web."))
    try:
        work.chmod(0o755)
        for source in (cert, key):
            shutil.copy(source, work / source.name)
            (work / source.name).chmod(0o644)
        (work / "key.pem").chmod(0o600)  # root's: the user below cannot read it
        web = work / "web.yaml"
        web.write_text(yaml.safe_dump({"tls_server_config": {
            "cert_file": str(work / "cert.pem"), "key_file": str(work / "key.pem")}}))
        web.chmod(0o644)
        # The user below runs fsdpmon and yaml from copies here: the checkout and its .venv
        # may sit in a directory only root can enter (a `mktemp -d` clone is 0700).
        lib = work / "lib"
        for package in (REPO / "fsdpmon", Path(yaml.__file__).parent):
            shutil.copytree(package, lib / package.name,
                            ignore=shutil.ignore_patterns("__pycache__"))
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                     os.path.realpath(sys.executable), "-c"]
        env = {"PYTHONPATH": str(lib), "PYTHONDONTWRITEBYTECODE": "1"}
        code = ("from fsdpmon.webconfig import load_web_config\n"
                "from fsdpmon.errors import ConfigError\n"
                f"try:\n    load_web_config({str(web)!r})\n"
                "except ConfigError as exc:\n    print(exc)\n")
        done = subprocess.run([*as_nobody, code], capture_output=True, text=True,
                              timeout=60, cwd=str(work), env=env)
        assert done.stdout.strip().startswith(
            "tls_server_config.key_file: cannot read"), (done.stdout, done.stderr[-500:])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_cached_rendering_is_renewed_after_max_age_or_when_the_state_changes():
    from prometheus_client import CollectorRegistry

    from fsdpmon.monitor.server import CachedExposition

    now, version = [0.0], [1]
    cache = CachedExposition(CollectorRegistry(), max_age=1.0, clock=lambda: now[0],
                             version=lambda: version[0])
    for _ in range(5):
        cache.body("")
    assert cache.renders == 1
    version[0] = 2  # a rank published: served at once
    cache.body("")
    assert cache.renders == 2
    now[0] = 0.99
    cache.body("")
    assert cache.renders == 2
    now[0] = 1.0  # a heartbeat may be this old, no older
    cache.body("")
    assert cache.renders == 3
