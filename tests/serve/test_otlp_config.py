"""serve's OTLP settings the OpenTelemetry way (frontend/serve/otlpconfig.py): flags and config keys over the
profiles signal's variables over the generic ones, the URL rules of OTLP/HTTP and gRPC, headers and
resource attributes in W3C baggage form, TLS files; bad configuration is one line on stderr."""
from __future__ import annotations

from pathlib import Path

import pytest

from optrace.errors import OptraceError
from optrace.frontend.serve.config import build_options
from optrace.frontend.serve.otlpconfig import DEFAULT_INTERVAL_S, DEFAULT_QUEUE_BYTES, OtlpTls
from support import assert_one_line_error

GENERIC = "OTEL_EXPORTER_OTLP_ENDPOINT"
PROFILES = "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT"


def otlp(settings: dict | None = None, **environ: str):
    return build_options(settings or {}, environ=environ).otlp


def test_off_without_an_endpoint() -> None:
    assert otlp(OTEL_SERVICE_NAME="checkout", OTEL_EXPORTER_OTLP_HEADERS="a=b") is None  # other exporters' settings


@pytest.mark.parametrize("environ,settings,protocol,target", [
    # http/protobuf: the generic endpoint is a base URL, the profiles one is used as it is ("/" when no path)
    ({GENERIC: "http://collector:4318"}, {}, "http/protobuf", "http://collector:4318/v1development/profiles"),
    ({GENERIC: "http://collector:4318/mycollector/"}, {}, "http/protobuf",
     "http://collector:4318/mycollector/v1development/profiles"),
    ({GENERIC: "https://collector/base"}, {}, "http/protobuf", "https://collector/base/v1development/profiles"),
    ({PROFILES: "http://collector:4318"}, {}, "http/protobuf", "http://collector:4318/"),
    ({PROFILES: "https://c.example.com/custom/path?x=1"}, {}, "http/protobuf", "https://c.example.com/custom/path?x=1"),
    ({GENERIC: "http://a:4318", PROFILES: "http://b:4318/p"}, {}, "http/protobuf", "http://b:4318/p"),
    # flags and the config file come first, the profiles endpoint first within them
    ({PROFILES: "http://env:4318/p"}, {"otlp_endpoint": "http://flag:4318"}, "http/protobuf",
     "http://flag:4318/v1development/profiles"),
    ({}, {"otlp_endpoint": "http://a:4318", "otlp_profiles_endpoint": "http://b:1/x"}, "http/protobuf", "http://b:1/x"),
    # gRPC: HOST:PORT, default ports from the scheme
    ({GENERIC: "http://collector:4317"}, {}, "grpc", "collector:4317"),
    ({GENERIC: "https://collector"}, {}, "grpc", "collector:443"),
    ({PROFILES: "http://[::1]:4317/"}, {}, "grpc", "[::1]:4317"),
    ({GENERIC: "collector:4317"}, {}, "grpc", "collector:4317"),
])
def test_endpoints(environ: dict, settings: dict, protocol: str, target: str) -> None:
    if protocol == "http/protobuf":
        settings = {**settings, "otlp_protocol": "http/protobuf"}
    options = otlp(settings, **environ)
    assert (options.protocol, options.target) == (protocol, target)


def test_protocol_and_every_other_setting_follow_the_precedence() -> None:
    environ = {GENERIC: "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
               "OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_HEADERS": "a=generic",
               "OTEL_EXPORTER_OTLP_PROFILES_HEADERS": "Authorization=Bearer%20tok%2C1, x-Tenant = t1 ,",
               "OTEL_EXPORTER_OTLP_TIMEOUT": "2500", "OTEL_EXPORTER_OTLP_COMPRESSION": "none",
               "OTEL_SERVICE_NAME": "checkout", "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=prod,team=a%3Db"}
    options = otlp(**environ)
    assert options.protocol == "http/protobuf" and options.target == "http://c:4317/v1development/profiles"
    assert options.headers == (("authorization", "Bearer tok,1"), ("x-tenant", "t1"))
    assert (options.timeout_s, options.compression, options.service_name) == (2.5, "none", "checkout")
    assert options.resource_attributes == (("deployment.environment.name", "prod"), ("team", "a=b"))
    assert (options.interval_s, options.queue_bytes, options.tls) == (DEFAULT_INTERVAL_S, DEFAULT_QUEUE_BYTES, None)
    flags = otlp({"otlp_protocol": "grpc", "otlp_headers": "k=v", "otlp_timeout": 0, "service_name": "flag",
                  "otlp_interval": 1, "otlp_queue_bytes": 1 << 20}, **environ)
    assert (flags.protocol, flags.headers, flags.timeout_s, flags.service_name) == ("grpc", (("k", "v"),), None, "flag")
    assert (flags.interval_s, flags.queue_bytes) == (1, 1 << 20)
    assert otlp(**{GENERIC: "http://c:4317"}).compression == "gzip"  # the default, as the OTel profiler


def test_grpc_tls_follows_the_scheme_then_insecure(self_signed) -> None:
    assert otlp(**{GENERIC: "http://c:4317"}).tls is None
    assert otlp(**{GENERIC: "https://c:4317"}).tls == OtlpTls()
    assert otlp(**{GENERIC: "c:4317"}).tls == OtlpTls()  # no scheme: secure unless insecure
    assert otlp(**{GENERIC: "c:4317", "OTEL_EXPORTER_OTLP_INSECURE": "true"}).tls is None
    assert otlp({"otlp_insecure": True}, **{GENERIC: "c:4317"}).tls is None
    assert otlp(**{GENERIC: "https://c:4317", "OTEL_EXPORTER_OTLP_INSECURE": "TRUE"}).tls == OtlpTls()  # the scheme wins
    secure = otlp(**{GENERIC: "https://c:4317", "OTEL_EXPORTER_OTLP_CERTIFICATE": self_signed.cert,
                     "OTEL_EXPORTER_OTLP_PROFILES_CLIENT_KEY": self_signed.key,
                     "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": self_signed.cert})
    assert secure.tls == OtlpTls(self_signed.cert, self_signed.key, self_signed.cert)


@pytest.mark.parametrize("environ,settings,fragment", [
    ({GENERIC: "http://c:99999"}, {}, "Port out of range"),
    ({GENERIC: "ftp://c:4317"}, {}, "HOST:PORT, http://HOST:PORT or https://HOST:PORT"),
    ({GENERIC: "c"}, {}, "HOST:PORT"),
    ({GENERIC: "http://c:4317/v1development/profiles"}, {}, "a gRPC endpoint has no path"),
    ({GENERIC: "collector:4318"}, {"otlp_protocol": "http/protobuf"}, "an http:// or https:// URL"),
    ({GENERIC: "http://user:secret@c:4318"}, {"otlp_protocol": "http/protobuf"}, "credentials go in"),
    ({GENERIC: "http://:4318"}, {"otlp_protocol": "http/protobuf"}, "no host"),
    ({GENERIC: "http://c:4317", "OTEL_EXPORTER_OTLP_HEADERS": "a=b,secret-token"}, {}, "entry 2 is not KEY=VALUE"),
    ({GENERIC: "http://c:4317", "OTEL_EXPORTER_OTLP_HEADERS": "bad key=x"}, {}, "a header name"),
    ({GENERIC: "http://c:4317", "OTEL_EXPORTER_OTLP_HEADERS": "a=%0d%0aInjected: 1"}, {}, "control characters"),
    ({GENERIC: "http://c:4317", "OTEL_RESOURCE_ATTRIBUTES": "=x"}, {}, "OTEL_RESOURCE_ATTRIBUTES: entry 1"),
    ({GENERIC: "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, {}, "grpc or http/protobuf"),
    ({GENERIC: "http://c:4317", "OTEL_EXPORTER_OTLP_TIMEOUT": "10s"}, {}, "milliseconds"),
    ({GENERIC: "c:4317", "OTEL_EXPORTER_OTLP_INSECURE": "yes"}, {}, "true or false"),
    ({GENERIC: "https://c:4317", "OTEL_EXPORTER_OTLP_CLIENT_KEY": "/etc/hostname"}, {}, "needs its pair"),
    ({GENERIC: "https://c:4317", "OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent.pem"}, {}, "cannot read"),
    ({GENERIC: "https://c:4317", "OTEL_EXPORTER_OTLP_CERTIFICATE": "/etc/hostname"}, {}, "OTLP TLS files"),
    ({}, {"otlp_headers": "a=b"}, "--otlp-headers needs an OTLP endpoint"),
    ({GENERIC: "http://c:4317"}, {"otlp_interval": 0}, "--otlp-interval 0: 1 to 3600 seconds"),
    ({GENERIC: "http://c:4317"}, {"otlp_queue_bytes": 1000}, "--otlp-queue-bytes"),
])
def test_bad_settings_are_one_clear_error(environ: dict, settings: dict, fragment: str) -> None:
    with pytest.raises(OptraceError) as error:
        otlp(settings, **environ)
    assert fragment in str(error.value) and "\n" not in str(error.value)
    assert "secret" not in str(error.value) and "Injected" not in str(error.value)  # values are not repeated


@pytest.mark.parametrize("args,environ,fragment", [
    (["--otlp-endpoint", "http://c:70000"], {}, "bad --otlp-endpoint 'http://c:70000': Port out of range"),
    (["--otlp-headers", "x"], {GENERIC: "http://c:4317"}, "bad --otlp-headers: entry 1 is not KEY=VALUE"),
    ([], {PROFILES: "https://c/p", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
          "OTEL_EXPORTER_OTLP_HEADERS": "api-key=123,oops"}, "bad OTEL_EXPORTER_OTLP_HEADERS: entry 2"),
    (["--otlp-protocol", "http/json", "--otlp-endpoint", "http://c:4317"], {}, "'--otlp-protocol'"),
])
def test_the_cli_says_it_in_one_line(optrace, args: list[str], environ: dict, fragment: str, monkeypatch) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    proc = optrace("serve", "--listen", "127.0.0.1:0", *args, timeout=60)
    assert_one_line_error(proc, fragment)
    assert "123" not in proc.stderr


def test_the_config_file_takes_the_same_keys(optrace, tmp_path: Path) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text('otlp_endpoint: "http://c:4318"\notlp_protocol: http/protobuf\notlp_interval: 10\n'
                      'service_name: web\nresource_attributes: "k8s.cluster.name=prod"\n')
    from optrace.frontend.serve.config import load_config_file

    options = build_options(load_config_file(str(config)), environ={})
    assert options.otlp.target == "http://c:4318/v1development/profiles" and options.otlp.interval_s == 10
    assert (options.otlp.service_name, options.otlp.resource_attributes) == ("web", (("k8s.cluster.name", "prod"),))
    config.write_text('otlp_endpoint: "http://c:4318"\notlp_interval: "ten"\n')
    assert_one_line_error(optrace("serve", "--config", str(config), timeout=60), "otlp_interval must be an integer")
