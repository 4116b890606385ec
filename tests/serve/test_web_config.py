"""`--web-config`: the exporter-toolkit format (TLS, client certificates, bcrypt basic auth, headers),
checked with real TLS handshakes (certificates made by openssl here) and real HTTP clients."""
from __future__ import annotations

import base64
import http.client
import os
import re
import secrets
import statistics
import ssl
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from serve.servekit import TickSource
from optrace.frontend.serve.daemon import ServeDaemon
from optrace.frontend.serve.options import ServeOptions
from optrace.frontend.serve import httpserver, webconfig
from optrace.frontend.serve.webconfig import (AUTH_CACHE_SIZE, MAX_PASSWORD_CHECKS, AuthBusy, BasicAuth, TlsFiles,
                                              WebConfig, load_web_config)
from optrace.errors import OptraceError
from optrace.frontend.serve.config import build_options

CPU = "optrace_cpu_seconds_total"


def bcrypt_hash(password: str, cost: int = 4) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode()



class Running:
    """A daemon serving ``web`` on a free loopback port, with a reload that reads ``web_config``."""

    def __init__(self, web_config: Path) -> None:
        self.web_config = web_config
        options = build_options({"listen": "127.0.0.1:0", "web_config": str(web_config)})
        options.drain_interval_s = 0.05
        self.daemon = ServeDaemon(options, [TickSource()], reload=self._reload)
        self._stop, urls = threading.Event(), []
        self._thread = threading.Thread(target=self.daemon.run, args=(self._stop,), kwargs={"on_ready": urls.append})
        self._thread.start()
        deadline = time.monotonic() + 10
        while not urls and time.monotonic() < deadline:
            time.sleep(0.01)
        self.url = urls[0]

    def _reload(self) -> ServeOptions:
        return build_options({"listen": "127.0.0.1:0", "web_config": str(self.web_config)}, reloading=True)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)


@pytest.fixture
def running(tmp_path):
    started: list[Running] = []

    def start(text: str) -> Running:
        config = tmp_path / "web.yml"
        config.write_text(text)
        started.append(Running(config))
        return started[-1]

    yield start
    for run in started:
        run.stop()


def get(url: str, user: str | None = None, password: str | None = None,
        context: ssl.SSLContext | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url)
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_basic_auth_needs_a_user_and_its_password(running):
    run = running(f"basic_auth_users:\n  prom: {bcrypt_hash('s3cret')}\n  other: {bcrypt_hash('x')}\n"
                  "http_server_config:\n  headers:\n    X-Frame-Options: deny\n    X-Content-Type-Options: nosniff\n")
    for credentials in [(None, None), ("prom", "wrong"), ("nobody", "s3cret"), ("other", "s3cret"), ("prom", "")]:
        status, headers, body = get(run.url, *credentials)
        assert status == 401, credentials
        assert headers["WWW-Authenticate"] == 'Basic realm="optrace"' and b"optrace_" not in body
    status, headers, body = get(run.url, "prom", "s3cret")
    assert status == 200 and b"optrace_drains_total" in body
    assert headers["X-Frame-Options"] == "deny" and headers["X-Content-Type-Options"] == "nosniff"
    assert get(run.url.removesuffix("metrics"))[0] == 401  # every path, the index page too
    assert get(run.url, "prom", "s3cret" + "x" * 80)[0] == 401  # past bcrypt's 72 bytes: refused, not an error


def timed_401(url: str, user: str, password: str) -> float:
    started = time.perf_counter()
    status = get(url, user, password)[0]
    assert status == 401
    return time.perf_counter() - started


def test_an_unknown_user_takes_as_long_as_a_wrong_password(running, monkeypatch):
    """No user names by timing: a known user's hash has cost 8 (~30 ms here), and an unknown user's password
    was checked against a decoy of cost 10 (4 times as long); now a decoy of the users' own cost. Fresh
    names and passwords each time (a repeated one is answered from the cache, known or not), interleaved,
    medians compared. The refusals' pace (refusals.py: 60 401s would wait their turns) is off: this times
    the checks."""
    monkeypatch.setattr(httpserver, "REFUSAL_BURST", 1000)
    run = running(f"basic_auth_users:\n  prom: {bcrypt_hash('s3cret', cost=8)}\n")
    known, unknown = [], []
    for attempt in range(30):
        guess = secrets.token_hex(8)
        known.append(timed_401(run.url, "prom", guess))
        unknown.append(timed_401(run.url, f"user{attempt}-{guess}", guess))
    ratio = statistics.median(unknown) / statistics.median(known)
    print(f"medians: wrong password {statistics.median(known) * 1e3:.1f} ms, unknown user "
          f"{statistics.median(unknown) * 1e3:.1f} ms (ratio {ratio:.2f})")
    assert 0.8 <= ratio <= 1.25


def test_unknown_users_are_checked_at_the_costs_users_have():
    users = {"a": bcrypt_hash("x", cost=4).encode(), "b": bcrypt_hash("y", cost=6).encode(),
             "c": bcrypt_hash("z", cost=6).encode()}
    auth = BasicAuth(users)
    costs = [int(auth._decoy(f"name{i}")[4:6]) for i in range(300)]
    assert set(costs) == {4, 6} and 60 < costs.count(4) < 140  # a third of the users have cost 4
    assert auth._decoy("name7") == auth._decoy("name7")  # one name, one cost: no average to take


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_wrong_guesses_do_not_push_the_right_password_out_of_the_cache(monkeypatch):
    auth = BasicAuth({"prom": bcrypt_hash("pw").encode()})
    assert auth.allows(basic("prom", "pw"))
    for guess in range(AUTH_CACHE_SIZE * 2):
        assert not auth.allows(basic("prom", f"guess{guess}"))
    monkeypatch.setattr(webconfig, "_bcrypt_matches", lambda *args: pytest.fail("a bcrypt for a cached password"))
    assert auth.allows(basic("prom", "pw"))


def test_too_many_password_checks_at_once_are_refused_not_queued():
    """Each wrong password costs a bcrypt, one at a time: the requests past MAX_PASSWORD_CHECKS get 429 at once
    instead of holding a worker each (a flood of guesses would hold them all)."""
    auth = BasicAuth({"prom": bcrypt_hash("pw", cost=12).encode()})
    outcomes: list[str] = []

    def guess(n: int) -> None:
        try:
            outcomes.append(str(auth.allows(basic("prom", f"wrong{n}"))))
        except AuthBusy:
            outcomes.append("busy")

    threads = [threading.Thread(target=guess, args=(n,)) for n in range(MAX_PASSWORD_CHECKS + 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert sorted(outcomes) == ["False"] * MAX_PASSWORD_CHECKS + ["busy"] * 3


def test_basic_auth_checks_malformed_headers_without_errors():
    auth = BasicAuth({"prom": bcrypt_hash("pw").encode()})
    for header in [None, "", "Basic", "Basic !!!", "Bearer abc", "Basic " + base64.b64encode(b"no-colon").decode(),
                   "Basic " + base64.b64encode(b"\xff\xfe:\x00").decode()]:
        assert auth.allows(header) is False
    good = "Basic " + base64.b64encode(b"prom:pw").decode()
    started = time.perf_counter()
    assert all(auth.allows(good) for _ in range(100))  # one bcrypt, then the cached outcome
    assert time.perf_counter() - started < 1
    assert BasicAuth({}).allows(None)


def test_tls_from_the_web_config_with_verified_client_certificates(running, tmp_path, certs):
    server = certs.self_signed(tmp_path, "server")
    ca = certs.self_signed(tmp_path, "clients-ca")
    good = certs.client(tmp_path, ca, "scraper")
    stranger = certs.self_signed(tmp_path, "stranger")  # not signed by the CA
    run = running(f"tls_server_config:\n  cert_file: {Path(server.cert).name}\n  key_file: {Path(server.key).name}\n"
                  f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {ca.cert}\n")
    assert run.url.startswith("https://127.0.0.1:")  # relative paths: from the web config's folder

    def context(client: TlsFiles | None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=server.cert)
        if client:
            ctx.load_cert_chain(client.cert, client.key)
        return ctx

    status, _, body = get(run.url, context=context(good))
    assert status == 200 and b"optrace_drains_total" in body
    for client in (None, stranger):
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            get(run.url, context=context(client))
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        get(run.url.replace("https://", "http://"))


def test_min_version_is_enforced(running, tmp_path, certs):
    server = certs.self_signed(tmp_path, "server")
    run = running(f"tls_server_config:\n  cert_file: {server.cert}\n  key_file: {server.key}\n  min_version: TLS13\n")
    modern = ssl.create_default_context(cafile=server.cert)
    assert get(run.url, context=modern)[0] == 200
    old = ssl.create_default_context(cafile=server.cert)
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises(urllib.error.URLError, match="(?i)version|alert"):
        get(run.url, context=old)


def test_reload_picks_up_a_new_user_and_keeps_serving(running):
    run = running(f"basic_auth_users:\n  alice: {bcrypt_hash('a')}\n")
    assert get(run.url, "alice", "a")[0] == 200 and get(run.url, "bob", "b")[0] == 401
    run.web_config.write_text(f"basic_auth_users:\n  bob: {bcrypt_hash('b')}\n")
    run.daemon.request_reload()
    deadline = time.monotonic() + 5
    while get(run.url, "bob", "b")[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert get(run.url, "bob", "b")[0] == 200 and get(run.url, "alice", "a")[0] == 401
    run.web_config.write_text("basic_auth_users:\n  carol: not-a-hash\n")  # a broken file keeps the last good one
    run.daemon.request_reload()
    time.sleep(0.5)
    assert get(run.url, "bob", "b")[0] == 200


def test_tls_flags_still_work_and_clash_with_a_tls_web_config(tmp_path, self_signed):
    options = build_options({"tls_cert": self_signed.cert, "tls_key": self_signed.key})
    assert options.web == WebConfig(TlsFiles(self_signed.cert, self_signed.key))
    config = tmp_path / "web.yml"
    config.write_text(f"basic_auth_users:\n  prom: {bcrypt_hash('p')}\n")
    combined = build_options({"tls_cert": self_signed.cert, "tls_key": self_signed.key, "web_config": str(config)})
    assert combined.web.tls == TlsFiles(self_signed.cert, self_signed.key) and list(combined.web.users) == ["prom"]
    config.write_text(f"tls_server_config:\n  cert_file: {self_signed.cert}\n  key_file: {self_signed.key}\n")
    with pytest.raises(OptraceError, match="TLS is set both in --web-config"):
        build_options({"tls_cert": self_signed.cert, "tls_key": self_signed.key, "web_config": str(config)})


@pytest.mark.parametrize("text", ["", "# basic_auth_users:\n#   prom: $2b$...\n", "null\n", "{}\n"])
def test_a_web_config_without_settings_is_refused(tmp_path, text):
    """Not plain HTTP without users: a truncated file must not open /metrics (see the reload test)."""
    config = tmp_path / "web.yml"
    config.write_text(text)
    with pytest.raises(OptraceError, match="has no settings .empty, or only comments.: leave out --web-config"):
        load_web_config(str(config))


def unsafe_settings_files(tmp_path: Path) -> dict[str, Path]:
    """Web configs another user could change: by mode, by owner, by folder (each holds a valid config)."""
    text = f"basic_auth_users:\n  prom: {GOOD_HASH}\n"
    made = {}
    for name, mode in (("writable by other users (mode 0666)", 0o666), ("writable by other users (mode 0620)", 0o620)):
        made[name] = tmp_path / f"{mode:o}.yml"
        made[name].write_text(text)
        made[name].chmod(mode)
    made["owned by uid 65534"] = tmp_path / "nobody.yml"
    made["owned by uid 65534"].write_text(text)
    os.chown(made["owned by uid 65534"], 65534, 65534)
    for name, mode in (("open", 0o777), ("nobodys", 0o755)):
        folder = tmp_path / name
        folder.mkdir()
        folder.chmod(mode)
        if name == "nobodys":
            os.chown(folder, 65534, 65534)
        (folder / "web.yml").write_text(text)
    made[f"the folder {tmp_path}/open is writable by other users (mode 0777)"] = tmp_path / "open" / "web.yml"
    made[f"the folder {tmp_path}/nobodys is owned by uid 65534"] = tmp_path / "nobodys" / "web.yml"
    return made


@pytest.mark.root
def test_a_web_config_another_user_could_change_is_refused(tmp_path):
    for problem, path in unsafe_settings_files(tmp_path).items():
        with pytest.raises(OptraceError, match=re.escape(problem)):
            load_web_config(str(path))
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)  # as /tmp: others cannot replace root's file in it
    (sticky / "web.yml").write_text(f"basic_auth_users:\n  prom: {GOOD_HASH}\n")
    assert list(load_web_config(str(sticky / "web.yml")).users) == ["prom"]


@pytest.mark.root
def test_sighup_refuses_an_empty_invalid_or_unsafe_web_config_and_keeps_the_users(running, tmp_path):
    """The issue's finding: an empty web config reloaded as "no auth", silently. Each of these is refused
    with an error line, and the users of the last good config stay."""
    run = running(f"basic_auth_users:\n  alice: {bcrypt_hash('a')}\n")
    errors: list[str] = []
    run.daemon._on_error = errors.append
    folder = tmp_path / "unsafe"
    folder.mkdir()
    bad = {"has no settings": "", "not valid YAML": "basic_auth_users: [\n", "not a bcrypt hash": "basic_auth_users:\n  x: y\n"}
    for problem, text in bad.items():
        run.web_config.write_text(text)
        reload_and_wait(run, errors)
        assert problem in errors[-1] and errors[-1].startswith("reload failed, still serving with the previous")
        assert get(run.url)[0] == 401 and get(run.url, "alice", "a")[0] == 200
    for problem, path in unsafe_settings_files(folder).items():
        run.web_config.unlink()
        run.web_config.symlink_to(path)  # the unsafe file, with a user "prom" of its own
        reload_and_wait(run, errors)
        assert problem in errors[-1]
        assert get(run.url)[0] == 401 and get(run.url, "alice", "a")[0] == 200


def reload_and_wait(run: Running, errors: list[str]) -> None:
    before = len(errors)
    run.daemon.request_reload()
    deadline = time.monotonic() + 10
    while len(errors) == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(errors) == before + 1, "the reload was not refused"


GOOD_HASH = "$2b$04$" + "a" * 53


@pytest.mark.parametrize("text, message", [
    ("basic_auth_users: [1, 2\n", "not valid YAML"),
    ("- a\n", "expected a mapping at the top level"),
    ("rate_limit: {burst: 1}\n", "unknown setting rate_limit"),
    ("basic_auth_users:\n  prom: hunter2\n", "the password of 'prom' is not a bcrypt hash"),
    ("basic_auth_users:\n  'a:b': " + GOOD_HASH + "\n", "bad user name 'a:b'"),
    ("basic_auth_users:\n  prom: $2b$15$" + "a" * 53 + "\n", "the hash of 'prom' has bcrypt cost 15, over 14"),
    ("basic_auth_users:\n  prom: $2y$31$" + "a" * 53 + "\n", "the hash of 'prom' has bcrypt cost 31, over 14"),
    ("tls_server_config:\n  cert_file: c.pem\n", "tls_server_config.key_file is missing"),
    ("tls_server_config:\n  cert: inline\n", "tls_server_config.cert is not supported by optrace serve"),
    ("tls_server_config:\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n", "cipher_suites is not supported"),
    ("tls_server_config:\n  cert_file: c\n  key_file: k\n  client_auth_type: RequireAnyClientCert\n",
     "without verifying it"),
    ("tls_server_config:\n  cert_file: c\n  key_file: k\n  client_auth_type: Sometimes\n", "is not one of"),
    ("tls_server_config:\n  cert_file: c\n  key_file: k\n  client_ca_file: ca\n",
     "client_ca_file is set but client_auth_type is NoClientCert"),
    ("tls_server_config:\n  cert_file: c\n  key_file: k\n  client_auth_type: RequireAndVerifyClientCert\n",
     "needs client_ca_file"),
    ("tls_server_config:\n  cert_file: c\n  key_file: k\n  min_version: TLS14\n", "unknown TLS version 'TLS14'"),
    ("tls_server_config:\n  cert_file: c\n  key_file: k\n  min_version: TLS13\n  max_version: TLS12\n",
     "min_version TLS13 is above max_version TLS12"),
    ("tls_server_config:\n  cert_file: /nonexistent.pem\n  key_file: /nonexistent.key\n",
     "cannot read TLS file /nonexistent.pem"),
    ("http_server_config:\n  headers:\n    Set-Cookie: a\n", "HTTP header 'Set-Cookie' can not be configured"),
    ("http_server_config:\n  headers:\n    X-Frame-Options: allow-all\n", "invalid value for header X-Frame-Options"),
])
def test_bad_web_configs_are_one_line_errors(tmp_path, optrace, text, message):
    config = tmp_path / "web.yml"
    config.write_text(text)
    result = optrace("serve", "--listen", "127.0.0.1:0", "--web-config", str(config), timeout=60)
    assert result.returncode == 1
    assert message in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_a_fifo_web_config_is_refused_not_waited_on(tmp_path, optrace):
    import os

    fifo = tmp_path / "web.yml"
    os.mkfifo(fifo)
    result = optrace("serve", "--web-config", str(fifo), timeout=30)
    assert result.returncode == 1 and "cannot read web config" in result.stderr and "not a regular file" in result.stderr


def test_http_client_sees_401_then_200(running):
    """http.client, not urllib: the 401 comes with the challenge a client needs to retry."""
    run = running(f"basic_auth_users:\n  prom: {bcrypt_hash('pw')}\n")
    host, port = run.url.split("//")[1].split("/")[0].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("GET", "/metrics")
    response = connection.getresponse()
    assert response.status == 401 and response.getheader("WWW-Authenticate").startswith("Basic")
    response.read()
    connection.close()
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("HEAD", "/metrics", headers={"Authorization": "Basic " + base64.b64encode(b"prom:pw").decode()})
    response = connection.getresponse()
    assert response.status == 200 and int(response.getheader("Content-Length")) > 0 and response.read() == b""
    connection.close()


YAML_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=8)
    | st.sampled_from(["TLS12", "TLS13", "NoClientCert", "RequireAndVerifyClientCert", "deny", "nosniff", GOOD_HASH]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6) | st.sampled_from(
        ["cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "headers", "http2",
         "X-Frame-Options", "prom"]), inner, max_size=4),
    max_leaves=12)
TOP_LEVEL = st.dictionaries(st.sampled_from(["tls_server_config", "http_server_config", "basic_auth_users", "other"]),
                            YAML_VALUES, max_size=3)


@settings(max_examples=300, deadline=None)
@given(document=TOP_LEVEL | YAML_VALUES)
def test_any_yaml_web_config_loads_or_is_one_clear_error(tmp_path_factory, document):
    config = tmp_path_factory.mktemp("fuzz") / "web.yml"
    config.write_text(yaml.safe_dump(document))
    try:
        load_web_config(str(config))
    except OptraceError as exc:
        assert "\n" not in str(exc)
