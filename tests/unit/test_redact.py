from __future__ import annotations

import pytest

from runlease.core.redact import MASK, Redactor

SECRETS = [
    ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig", "eyJhbGciOiJIUzI1NiJ9"),
    ("openai key sk-proj-abcdefghijklmnopqrstuvwxyz012345", "sk-proj-abcdefghij"),
    ("connect postgresql://app:s3cr3t-pw@db.internal:5432/x failed", "s3cr3t-pw"),
    ("token ghp_ABCDEFGHIJKLMNOPQRSTUVWXYZabcd1234", "ghp_ABCDEFGHIJ"),
    ("aws AKIAIOSFODNN7EXAMPLE used", "AKIAIOSFODNN7EXAMPLE"),
    ("slack xoxb-123456789012-abcdefghijkl", "xoxb-123456789012"),
    ("password=hunter2hunter2 user=bob", "hunter2hunter2"),
    ('{"api_key": "live_abcdef123456"}', "live_abcdef123456"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\nabc\n-----END RSA PRIVATE KEY-----", "MIIEow"),
]


@pytest.mark.parametrize(("text", "secret"), SECRETS)
def test_known_secrets_are_masked(text: str, secret: str) -> None:
    out = Redactor().text(text)
    assert secret not in out
    assert MASK in out


def test_ordinary_text_and_counts_survive() -> None:
    text = "tool ls returned 3 files; max_tokens=1000; see https://example.com/a?b=c"
    assert Redactor().text(text) == text


def test_configured_patterns_apply() -> None:
    redactor = Redactor([r"ACME-\d{6}"])
    assert redactor.text("id ACME-123456 leaked") == f"id {MASK} leaked"


def test_json_values_under_secret_keys_are_masked() -> None:
    data = {"delta": "hi", "headers": {"Authorization": "Basic abc", "x-api-key": "k1"},
            "items": ["sk-abcdefghijklmnopqrstuvwx"], "tokens": 12}
    out = Redactor().json(data)
    assert out == {"delta": "hi", "headers": {"Authorization": MASK, "x-api-key": MASK},
                   "items": [MASK], "tokens": 12}


def test_message_is_redacted_before_it_is_truncated() -> None:
    message = "x" * 90 + " password=supersecretvalue " + "y" * 100
    out = Redactor().message(message, 100)
    assert len(out) == 100
    assert "supersecret" not in out
    assert out.endswith("... [truncated]")
