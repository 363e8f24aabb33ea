"""Hypothesis strategies: text with secrets of every supported kind planted in it.

A planted secret is a (text, bodies) pair: `text` is how it appears (`Bearer
<body>`, `password = "<body>"`, a key block...), `bodies` what must never be
stored, whole or in part. Bodies have a digit every third character (a
base64 one has them where it has them) and filler text has no digits, so 6
characters of a body with a digit among them that show up in stored text
came from the body (see leaked).
"""

from __future__ import annotations

import base64
import itertools
import string
from collections.abc import Callable

from hypothesis import strategies as st

_WORDS = ("the", "model", "said", "run", "tool", "output", "ok", "a", "basic", "token",
          "tokens", "key", "with", "Authorization", "password", "and", "max_tokens", "of",
          "note:", "see", "value", "is", "done.", "cookie", "secret", "bearer")
_SPACE = st.sampled_from([" ", " ", " ", "\n", "  ", "\t", " \n"])


@st.composite
def body(draw: st.DrawFn, letters: str = string.ascii_letters, min_size: int = 12,
         max_size: int = 40) -> str:
    size = draw(st.integers(min_size, max_size))
    chars = draw(st.lists(st.sampled_from(letters), min_size=size, max_size=size))
    digits = draw(st.lists(st.sampled_from(string.digits), min_size=size, max_size=size))
    return "".join(d if i % 3 == 2 else c for i, (c, d) in enumerate(zip(chars, digits,
                                                                          strict=True)))


def _bearer(draw: st.DrawFn, b: str) -> tuple[str, list[str]]:
    return f"Bearer {b}", [b]


def _authorization(draw: st.DrawFn, b: str) -> tuple[str, list[str]]:
    scheme = draw(st.sampled_from(["Bearer", "Basic", "Token", "token"]))
    return f"Authorization: {scheme} {b}", [b]


def _basic(draw: st.DrawFn, b: str) -> tuple[str, list[str]]:
    user, pw = draw(body(max_size=16)), draw(body(max_size=16))
    b64 = base64.b64encode(f"{user}:{pw}".encode()).decode()
    return f"Authorization: Basic {b64}", [b64]


def _github(draw: st.DrawFn, b: str) -> tuple[str, list[str]]:
    return draw(st.sampled_from(["ghp_", "github_pat_"])) + b + "x" * 20, [b]


def _aws(draw: st.DrawFn, b: str) -> tuple[str, list[str]]:
    key = draw(body(string.ascii_uppercase, 16, 16))
    return f"AKIA{key}", [key]


def _url(draw: st.DrawFn, b: str) -> tuple[str, list[str]]:
    pw = draw(body(string.ascii_letters + "/", 8, 24))
    scheme = draw(st.sampled_from(["postgresql", "postgres", "redis", "https"]))
    return f"{scheme}://app:{pw}@db.internal/x", [pw]


def _digits_url(draw: st.DrawFn, b: str) -> tuple[str, list[str]]:
    pw = draw(body(string.digits, 8, 12))
    return f"postgres://u:{pw}@h", [pw]


def _kv(draw: st.DrawFn, b: str) -> tuple[str, list[str]]:
    key = draw(st.sampled_from(["password", "token", "github_token", "id_token", "api_key",
                                "X-Api-Key", "client_secret", "ACCESS_TOKEN"]))
    sep = draw(st.sampled_from(["=", ": ", " = ", ":"]))
    return f"{key}{sep}{b}", [b]


def _json(draw: st.DrawFn, b: str) -> tuple[str, list[str]]:
    key = draw(st.sampled_from(["token", "api_key", "password", "x-api-key", "cookie"]))
    return f'{{"{key}": "{b}", "n": 1}}', [b]


def _quoted(draw: st.DrawFn, b: str) -> tuple[str, list[str]]:
    b2 = draw(body())
    return f'password = "{b} {b2}"', [b, b2]


def _cookie(draw: st.DrawFn, b: str) -> tuple[str, list[str]]:
    b2 = draw(body())
    header = draw(st.sampled_from(["Cookie", "Set-Cookie", "cookie"]))
    return f"{header}: sid={b}; theme=dark; csrf={b2}", [b, b2]


def _escaped(draw: st.DrawFn, b: str) -> tuple[str, list[str]]:
    b2 = draw(body())
    key = draw(st.sampled_from(["password", "cookie", "Authorization", "token"]))
    return f'{{\\"{key}\\": \\"{b} {b2}\\", \\"n\\": 1}}', [b, b2]


def _quoted_header(draw: st.DrawFn, b: str) -> tuple[str, list[str]]:
    b2 = draw(body())
    form = draw(st.sampled_from(['{{"cookie": "sid={b}; x={b2}", "n": 1}}',
                                 'Cookie: "x" sid={b} and={b2}',
                                 "headers: {{'Authorization': 'Basic {b} {b2}'}}"]))
    return form.format(b=b, b2=b2), [b, b2]


def _jwt(draw: st.DrawFn, b: str) -> tuple[str, list[str]]:
    b2, b3 = draw(body()), draw(body())
    return f"eyJ{b}.eyJ{b2}.{b3}", [b, b2, b3]


def _pem(draw: st.DrawFn, b: str) -> tuple[str, list[str]]:
    lines = [draw(body(string.ascii_letters + "+/", 20, 64))
             for _ in range(draw(st.integers(1, 4)))]
    name = draw(st.sampled_from(["RSA PRIVATE KEY", "PRIVATE KEY", "OPENSSH PRIVATE KEY",
                                 "EC PRIVATE KEY"]))
    return "\n".join([f"-----BEGIN {name}-----", *lines, f"-----END {name}-----"]), lines


KINDS: dict[str, Callable[[st.DrawFn, str], tuple[str, list[str]]]] = {
    "bearer": _bearer, "authorization": _authorization, "basic": _basic,
    "openai": lambda draw, b: (f"sk-proj-{b}", [b]), "github": _github, "aws": _aws,
    "url": _url, "digits_url": _digits_url, "kv": _kv, "json": _json, "quoted": _quoted,
    "cookie": _cookie, "flag": lambda draw, b: (f"psql --password {b}", [b]), "jwt": _jwt,
    "pem": _pem, "escaped": _escaped, "quoted_header": _quoted_header,
}


@st.composite
def planted(draw: st.DrawFn) -> tuple[str, list[str]]:
    """One secret as it appears in text, and the bodies that must not be stored."""
    return KINDS[draw(st.sampled_from(sorted(KINDS)))](draw, draw(body()))


BENIGN_WORDS = ("the", "model", "said", "run", "tool", "output", "ok", "a", "basic", "tokens",
                "max_tokens=1000", "of", "note:", "see", "is", "done.", "token_count: 3")


@st.composite
def filler(draw: st.DrawFn, vocabulary: tuple[str, ...] = _WORDS) -> str:
    words = draw(st.lists(st.sampled_from(vocabulary), max_size=12))
    out = ""
    for w in words:
        out += w + draw(_SPACE)
    return out


@st.composite
def message(draw: st.DrawFn) -> tuple[str, list[str]]:
    """Filler text with 1-3 planted secrets; returns (text, bodies)."""
    text = draw(filler())
    bodies: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        secret, parts = draw(planted())
        text += secret + draw(_SPACE) + draw(filler())
        bodies += parts
    return text, bodies


@st.composite
def split(draw: st.DrawFn, text: str) -> list[str]:
    """text cut at random points into deltas."""
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=min(40, len(text)))))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def leaked(stored: str, bodies: list[str]) -> list[str]:
    """Pieces of any body (6 characters with a digit among them) found in stored."""
    return [b[i:i + 6] for b in bodies for i in range(len(b) - 5)
            if any(c.isdigit() for c in b[i:i + 6]) and b[i:i + 6] in stored]


JUNK = st.text(alphabet="abcxyzABC :=\"'\n\t-{}.,;\\/@&#*[]()<>", max_size=30)


@st.composite
def odd_message(draw: st.DrawFn) -> tuple[str, list[str]]:
    """Secrets among punctuation, quotes and brackets: the neighbours that
    decide where a key, a quoted value or a header line ends."""
    text = draw(JUNK)
    bodies: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        secret, parts = draw(planted())
        text += (draw(st.sampled_from([" ", "\n", "\t"])) + secret
                 + draw(st.sampled_from([" ", "\n", "", '"', ","])) + draw(JUNK))
        bodies += parts
    return text, bodies
