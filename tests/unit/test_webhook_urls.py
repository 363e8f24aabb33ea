"""Webhook URLs, host patterns and signatures (core/webhooks.py)."""

from __future__ import annotations

import pytest

from runlease.core.webhooks import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    HostRule,
    allowed,
    check_host_pattern,
    check_ports,
    host_of,
    port_allowed,
    port_of,
    signature,
    verify,
)
from runlease.errors import ValidationError
from runlease.services.webhooks import error_class, public


@pytest.mark.parametrize("pattern", ["abc\n", "ABC.com", "*", "*.", "a b", "", "x" * 300,
                                     "evil.com/path", 5])
def test_bad_host_patterns_are_refused(pattern: object) -> None:
    with pytest.raises(ValidationError):
        check_host_pattern(pattern)


def test_hosts_match_exactly_or_by_subdomain() -> None:
    hosts = [HostRule("hooks.example.com"), HostRule("*.corp.example", True)]
    assert allowed("hooks.example.com", hosts) == hosts[0]
    assert allowed("a.corp.example", hosts) == hosts[1]
    assert allowed("corp.example", hosts) is None
    assert allowed("evilcorp.example", hosts) is None
    assert allowed("hooks.example.com.evil.net", hosts) is None
    assert host_of("https://Hooks.Example.com:8443/x?y=1") == "hooks.example.com"


def test_a_signature_is_over_the_timestamp_and_the_body() -> None:
    body = b'{"run_id":"x"}'
    headers = {TIMESTAMP_HEADER: "1000", SIGNATURE_HEADER: signature("k", 1000, body)}
    assert verify("k", headers, body, now=1000)
    assert verify("k", {k.lower(): v for k, v in headers.items()}, body, now=1200)
    assert not verify("k", headers, body, now=1000 + 301)  # replayed too late
    assert not verify("k", {**headers, TIMESTAMP_HEADER: "1001"}, body, now=1001)
    assert not verify("k", {SIGNATURE_HEADER: headers[SIGNATURE_HEADER]}, body, now=1000)


@pytest.mark.parametrize("address", [
    # Issue 32: these counted as public before.
    "100.64.0.1", "100.127.255.254", "fec0::1", "2002:7f00:1::1", "2002:a9fe:a9fe::1",
    # The rest of what leads inside, or nowhere.
    "127.0.0.1", "10.0.0.1", "172.16.0.1", "192.168.1.1", "169.254.169.254", "0.0.0.0",
    "::1", "::", "fe80::1", "fc00::1", "fd00::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1",
    "::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe", "2001::1", "2001:db8::1", "192.0.0.8",
    "198.18.0.1", "224.0.0.1", "ff02::1", "240.0.0.1", "255.255.255.255", "fe80::1%eth0",
])
def test_addresses_that_lead_inside_are_not_public(address: str) -> None:
    assert not public(address)


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700::1111",
                                     "::ffff:93.184.216.34", "2a00:1450:4001::200e"])
def test_public_addresses_are(address: str) -> None:
    assert public(address)


def test_only_80_443_or_a_listed_port_is_allowed() -> None:
    rule = HostRule("127.0.0.1", True, (8080,))
    assert [port_allowed(p, rule) for p in (80, 443, 8080, 22, 5432, 6379)] == [
        True, True, True, False, False, False]
    assert port_of("http://h/x") == 80
    assert port_of("https://h/x") == 443
    assert port_of("http://h:8080/x") == 8080
    assert check_ports([8443, 8080, 8080]) == (8080, 8443)
    for bad in ([0], [65536], [True], ["80"], list(range(1, 18)), "80"):
        with pytest.raises(ValidationError):
            check_ports(bad)


def test_a_tenant_is_told_the_class_of_an_error_only() -> None:
    import httpx

    assert error_class(TimeoutError()) == "timeout"
    assert error_class(httpx.ConnectError("[Errno 111] Connection refused 10.1.2.3:22")) \
        == "connect"
    assert error_class(httpx.RemoteProtocolError("SSH-2.0-OpenSSH_9.2")) == "protocol"
    assert error_class(OSError("whatever")) == "network"
