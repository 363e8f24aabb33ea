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


# -- gaps found by reading the rules as an attacker would ---------------------------

GAPS = [
    # Keys that say secret, as key=value, key: value and header lines.
    ("token=abc123def", "abc123def"),
    ("token: abc123def", "abc123def"),
    ("GITHUB_TOKEN=gho16charsxyz987", "gho16charsxyz987"),
    ("github_token: abcd1234efgh", "abcd1234efgh"),
    ("id_token=eyJabc.def.ghi", "eyJabc.def.ghi"),
    ("Cookie: session=abc123; csrf=zz99yy88", "zz99yy88"),
    ("Cookie: session=abc123; csrf=zz99yy88", "abc123"),
    ("Set-Cookie: sid=s3cr3tsid; Path=/; HttpOnly", "s3cr3tsid"),
    ("X-Api-Key: k3y-value-1", "k3y-value-1"),
    ("x-api-key=k3y-value-1", "k3y-value-1"),
    ("Authorization: Digest username=bob, response=6629fae49393a05397450978507c4ef1",
     "6629fae4"),
    ("Authorization: Basic dXNlcjpwYXNz", "dXNlcjpwYXNz"),  # no digit, still a credential
    ("Proxy-Authorization: Negotiate YIIabc", "YIIabc"),
    # Values that are only digits are secrets under a secret key.
    ("password=12345678", "12345678"),
    ('{"pin_password": 4242}', "4242"),
    # URL passwords with `/`, only digits, a stray `@`.
    ("postgresql://u:pa/ss@h/db", "pa/ss"),
    ("postgres://u:12345678@h", "12345678"),
    ("mongodb+srv://app:hunter2@cluster0/x", "hunter2"),
    # A quoted value runs to its closing quote, spaces included.
    ('password = "correct horse battery"', "battery"),
    ("{'secret': 'two words'}", "two words"),
    # A key that does not say secret does not hide the pair after it.
    ("note: password=hunter2x", "hunter2x"),
    ("bearer password: hunter2x", "hunter2x"),
    # Found by fuzzing odd neighbours.
    ("Bearer abcdef123456 : next", "abcdef123456"),
    ("id=AKIAIOSFODNN7EXAMPLEabc", "IOSFODNN7EXAMPLE"),
    # CLI flags.
    ("mysql --password hunter2x -h db", "hunter2x"),
    ("curl -u admin:hunter2x https://x", "hunter2x"),
    # Known formats.
    ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", "11ABCDEFG0123"),
    ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJl", "eyJzdWIiOiIxMjM0In0"),
    ("stripe sk_live_51Habcdefghijk", "51Habcdefghijk"),
    ("hf_abcdefghijklmnopqrstuvwxyz0123456789", "abcdefghijklmnop"),
    ("-----BEGIN PGP PRIVATE KEY BLOCK-----\nlQdGBF\n-----END PGP PRIVATE KEY BLOCK-----",
     "lQdGBF"),
    ("AccountKey=abc/def+ghi==;EndpointSuffix=core", "abc/def"),
    ("SENTRY_DSN=https://0123abcd@o1.ingest.sentry.io/1", "0123abcd"),
]


@pytest.mark.parametrize(("text", "secret"), GAPS)
def test_gaps_are_masked(text: str, secret: str) -> None:
    out = Redactor().text(text)
    assert secret not in out
    assert MASK in out


BENIGN = [
    "max_tokens=1000 prompt_tokens: 12 tokens=5 token_count=3 max_new_tokens=64",
    "tokenizer=cl100k_base token_type=bearer",
    "a basic understanding of token limits; the bearer of news",
    "author: Jane, secretary: Bob, PWD=/home/app",
    "see https://example.com/a?b=c and https://example.com:8443/x",
    "secretName: db-credentials",
    "nothing to hide: password is set in the vault",
]


@pytest.mark.parametrize("text", BENIGN)
def test_benign_text_survives(text: str) -> None:
    assert Redactor().text(text) == text


@pytest.mark.parametrize("key", ["token", "github_token", "id_token", "cookie", "set-cookie",
                                 "x-api-key", "Authorization", "client_secret", "sessionToken"])
def test_json_keys_that_say_secret_lose_their_value(key: str) -> None:
    out = Redactor().json({"headers": {key: "value one"}, "n": [{key: 12345678}]})
    assert out == {"headers": {key: MASK}, "n": [{key: MASK}]}


def test_json_counts_and_objects() -> None:
    usage = {"prompt_tokens": 10, "max_tokens": 1000, "tokens_used": 12, "maxTokens": 3,
             "completion_tokens_details": {"reasoning_tokens": 2}, "token_type": "bearer"}
    assert Redactor().json({"usage": usage, "tokenSecret": "x"}) == {"usage": usage,
                                                                    "tokenSecret": MASK}
    data = {"usage": {"prompt_tokens": 10, "max_tokens": 1000, "total_tokens": 12},
            "tokens": ["Hel", "lo"], "credentials": {"user": "bob", "pass": "x"},
            "password": None, "use_token": True}
    assert Redactor().json(data) == {
        "usage": {"prompt_tokens": 10, "max_tokens": 1000, "total_tokens": 12},
        "tokens": ["Hel", "lo"], "credentials": MASK, "password": None, "use_token": True}


@pytest.mark.parametrize("text", [t for t, _ in SECRETS + GAPS] + BENIGN)
def test_redaction_is_idempotent(text: str) -> None:
    # The store redacts what RunContext already cut and the lead's ack path
    # may redact a result twice: a second pass must change nothing.
    once = Redactor().text(text)
    assert Redactor().text(once) == once


def test_url_password_runs_to_the_last_at() -> None:
    assert Redactor().text("redis://:p@ss@cache:6379/0 up") == f"redis://:{MASK}@cache:6379/0 up"


def test_escaped_json_and_quoted_headers() -> None:
    r = Redactor()
    assert r.text(r'{\"password\": \"hunter2 x\", \"a\": 1}') == (
        rf'{{\"password\": \"{MASK}\", \"a\": 1}}')
    assert r.text('{"cookie": "a=1; b=2", "n": 1}') == f'{{"cookie": "{MASK}", "n": 1}}'
    # A quoted header value that does not end the line does not end the header.
    assert r.text('Cookie: "x" sid=abc123') == f"Cookie: {MASK}"
