"""Webhook URLs, host patterns and signatures (core/webhooks.py)."""

from __future__ import annotations

import pytest

from runlease.core.webhooks import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    allowed,
    check_host_pattern,
    host_of,
    signature,
    verify,
)
from runlease.errors import ValidationError


@pytest.mark.parametrize("pattern", ["abc\n", "ABC.com", "*", "*.", "a b", "", "x" * 300,
                                     "evil.com/path", 5])
def test_bad_host_patterns_are_refused(pattern: object) -> None:
    with pytest.raises(ValidationError):
        check_host_pattern(pattern)


def test_hosts_match_exactly_or_by_subdomain() -> None:
    hosts = [("hooks.example.com", False), ("*.corp.example", True)]
    assert allowed("hooks.example.com", hosts) == (True, False)
    assert allowed("a.corp.example", hosts) == (True, True)
    assert allowed("corp.example", hosts) == (False, False)
    assert allowed("evilcorp.example", hosts) == (False, False)
    assert allowed("hooks.example.com.evil.net", hosts) == (False, False)
    assert host_of("https://Hooks.Example.com:8443/x?y=1") == "hooks.example.com"


def test_a_signature_is_over_the_timestamp_and_the_body() -> None:
    body = b'{"run_id":"x"}'
    headers = {TIMESTAMP_HEADER: "1000", SIGNATURE_HEADER: signature("k", 1000, body)}
    assert verify("k", headers, body, now=1000)
    assert verify("k", {k.lower(): v for k, v in headers.items()}, body, now=1200)
    assert not verify("k", headers, body, now=1000 + 301)  # replayed too late
    assert not verify("k", {**headers, TIMESTAMP_HEADER: "1001"}, body, now=1001)
    assert not verify("k", {SIGNATURE_HEADER: headers[SIGNATURE_HEADER]}, body, now=1000)
