"""One redaction function for everything stored from a run, and for log lines.

Error messages, event data, step results and run results can carry what a
tool printed: API keys, bearer tokens, cookies, database URLs with
passwords, private keys. They pass through here before they reach the
database (and log lines before they reach stderr); error messages are
truncated too.

Two kinds of rule:

* known shapes: PEM private keys, `Bearer xxx`, `scheme://user:password@`,
  and key formats that say what they are (`sk-...`, `ghp_...`, `AKIA...`, JWTs);
* a key that says secret (`password`, `token`, `api_key`, `cookie`,
  `authorization`, ...), as `key=value`, `key: value`, an HTTP header line or
  a JSON key: its value goes, whatever it looks like. Keys that only count
  or describe tokens (`max_tokens=1000`, `token_type`, `tokenizer`) keep
  their values.

Streamed text is redacted on the assembled message, not piece by piece:
`redact_stream.StreamHoldback` says how much of the text received so far can
be stored without cutting a secret in two (see RunContext.delta).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

MASK = "[REDACTED]"

# A word inside a key that says its value is secret. `auth` and `sig` count
# only as a whole part of the key (`auth=`, `x-auth-token`), not in `author`.
_SECRET_WORDS = (
    r"api[_-]?key|apikey|secret(?!ary)|passw(?:or)?d|passphrase|token(?!i[sz])"
    r"|credential|cookie|authorization|private[_-]?key"
    r"|(?:access|account|signing|master|encryption|client|shared|consumer)[_-]?key"
    r"|session[_-]?key|dsn"
    r"|(?<![a-z])(?:auth|sig)(?![a-z])|(?<=[_-])pwd(?![a-z])"
)
_SECRET_KEY_RE = re.compile(f"(?i)(?:{_SECRET_WORDS})")
# Keys that count, describe or index model tokens (`max_tokens`, `tokens_used`,
# `completion_tokens_details`, `token_type`): their values are not secrets.
# `tokens` is matched with its case so that `tokenSecret` is not taken for it.
_BENIGN_KEY_RE = re.compile(
    r"(?:[tT]okens|TOKENS)(?![a-z])"
    r"|(?i:max[_-]?token|token[_-]?(?:count|limit|len|length|type|ids?|usage|budget|index"
    r"|position|logprobs?)(?![a-z])|secret[_-]?(?:name|ref)(?![a-z]))"
)
# HTTP headers whose whole value is a credential, spaces and `;` included.
_LINE_KEYS = r"(?:proxy-)?authorization|(?:set-)?cookies?"

_SEP = r"""\\?["']?[ \t]*(?::=|=>|[:=])[ \t]*"""
# A key: a run of key characters, starting where such a run starts (the
# look-behind keeps the regex from retrying at every character of a long word).
_KEY = r"(?<![\w.-])[\w.-]{1,128}"
# A quoted value: "...", '...', or \"...\" (JSON inside a JSON string).
_QUOTED = (r"""\\"(?:[^\\\r\n]|\\[^"\r\n])*\\"|"(?:[^"\\\r\n]|\\.)*"|'(?:[^'\\\r\n]|\\.)*'""")
_BARE = r"""[^\s"',;&}\\]+(?:\\(?!["'])[^\s"',;&}\\]*)*"""

_PEM_RE = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----.*?"
    r"(?:-----END [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----|\Z)",
    re.DOTALL,
)
# A credential header at the start of a line (as HTTP and `curl -v` print
# it, `> Cookie: ...`) loses the rest of the line.
_LINE_HEADER_RE = re.compile(
    rf"(?im)^([ \t]*(?:[<>][ \t]*)?(?:[\w.-]{{0,64}}?[_-])?(?:{_LINE_KEYS})[ \t]*:[ \t]*)"
    r"([^\r\n]+)"
)
# Inside a line (`curl -H 'Cookie: a=1; b=2' ...`, prose, a dict) it loses its
# value: a quoted one, or an optional scheme word and tokens joined by `,`/`;`
# (`Bearer x`, `a=1; b=2`, `Digest user="b", response="..."`), so that the
# prose after it stays. A quote not closed runs to the end of the line.
_TOKEN = r"""(?:[^\s"',;]|"[^"\r\n]*"?)+"""
_HEADER_VALUE = (rf"(?:[A-Za-z][\w-]*[ \t]+(?=[^\s,;]))?{_TOKEN}"
                 rf"(?:[,;][ \t]*{_TOKEN})*")
_HEADER_KEY = (rf"(?<![\w.-])((?:[\w.-]{{0,64}}?[_-])?(?:{_LINE_KEYS})"
               rf"\\?[\"']?[ \t]*[:=][ \t]*)")
_HEADER_RE = re.compile(
    rf"(?i){_HEADER_KEY}((?:{_QUOTED})(?=[ \t]*(?:[,;}}\]\r\n]|\Z))|{_HEADER_VALUE})"
)
_SCHEME_WORD_RE = re.compile(
    r"(?i)(?<![\w-])(bearer|basic|token)[ \t]+([A-Za-z0-9._~+/=-]{8,})"
)
_URL_RE = re.compile(
    # scheme://user:password@ ; the password runs to the last `@` before a
    # space or quote, so `/`, digits and stray `@`s in it are covered. The
    # bounds keep a long line of `a://b:` from costing quadratic time.
    r"(?i)(?<![\w+.-])([a-z][a-z0-9+.-]{0,30}://[^/\s:@\"'<>]{0,256}):([^\s\"'<>]{1,512})@"
)
_KNOWN_RE = re.compile(
    r"\bsk-[A-Za-z0-9_-]{16,}"                      # OpenAI, Anthropic
    r"|\b[sr]k_(?:live|test)_[A-Za-z0-9]{10,}"      # Stripe
    r"|\bgh[pousr]_[A-Za-z0-9]{20,}"                # GitHub
    r"|\bgithub_pat_[A-Za-z0-9_]{22,}"
    r"|\bglpat-[A-Za-z0-9_-]{20,}"                  # GitLab
    r"|\bhf_[A-Za-z0-9]{30,}"                       # Hugging Face
    r"|\bnpm_[A-Za-z0-9]{36}\b"
    r"|\b(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Z])"      # AWS access key id
    r"|\bxox[abprse]-[A-Za-z0-9-]{10,}|\bxapp-[A-Za-z0-9-]{10,}"  # Slack
    r"|\bAIza[0-9A-Za-z_-]{35}\b"                   # Google
    r"|\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"  # JWT
)
_KEY_SEP_RE = re.compile(rf"({_KEY})({_SEP})")
_VALUE_RE = re.compile(rf"{_QUOTED}|[\"']?(?:{_BARE})")
# CLI flags: `--password hunter2`, `curl -u user:pass`.
_FLAG_RE = re.compile(
    rf"(?i)(?<![\w.-])(--[\w-]*(?:{_SECRET_WORDS})[\w-]*|-u|--user)[ \t]+"
    rf"(?!-)({_QUOTED}|{_BARE})"
)


def is_secret_key(key: str) -> bool:
    """A key (JSON, `key=value`, a header) whose value is a secret."""
    return bool(_SECRET_KEY_RE.search(key)) and not _BENIGN_KEY_RE.search(key)


def _scheme_word(m: re.Match[str]) -> str:
    word, value = m.group(1), m.group(2)
    if word.lower() != "bearer" and (
            re.search(r"=[^=]", value) or re.match(r"[\"']?[ \t]*:", m.string[m.end():])):
        return m.group(0)  # `basic max_tokens=10`, `basic note: x`: a key, not base64
    # `Bearer x` is always a credential; after `basic` or `token` prose is
    # common ("a basic understanding"), so the value must look like one:
    # a digit, a symbol, or an upper-case letter past the first.
    if word.lower() == "bearer" or re.search(r"[0-9._~+/=-]|.[A-Z]", value):
        return f"{word} {MASK}"
    return m.group(0)


_QUOTE_RE = re.compile(r"""\\?["']""")


def _kv_sub(text: str) -> str:
    """Mask the value of every `key=value` whose key says secret. The value
    is read only after a secret key, so `note: password=x` is seen as the
    pair it holds, and a long line of pairs costs linear time."""
    out: list[str] = []
    pos = 0
    while (m := _KEY_SEP_RE.search(text, pos)) is not None:
        value = _VALUE_RE.match(text, m.end()) if is_secret_key(m.group(1)) else None
        if value is None or value.group(0) in ('""', "''"):
            out.append(text[pos:m.end()])
            pos = m.end()
            continue
        v = value.group(0)
        q = _QUOTE_RE.match(v)
        quote = q.group(0) if q else ""
        closed = quote and len(v) >= 2 * len(quote) and v.endswith(quote)
        out.append(f"{text[pos:m.end()]}{quote}{MASK}{quote if closed else ''}")
        pos = value.end()
    out.append(text[pos:])
    return "".join(out)


def _flag(m: re.Match[str]) -> str:
    flag = m.group(1)
    if flag in ("-u", "--user") and ":" not in m.group(2):
        return m.group(0)  # a user name alone is not a secret
    return f"{flag} {MASK}"


def _header(m: re.Match[str]) -> str:
    quote = _QUOTE_RE.match(m.group(2))
    q = quote.group(0) if quote and m.group(2).endswith(quote.group(0)) else ""
    return f"{m.group(1)}{q}{MASK}{q}"


class Redactor:
    """Applies the default rules plus any configured patterns, in order."""

    def __init__(self, extra_patterns: Iterable[str] = ()) -> None:
        self._extra = [re.compile(p) for p in extra_patterns]

    def text(self, value: str) -> str:
        value = _PEM_RE.sub(MASK, value)
        value = _LINE_HEADER_RE.sub(lambda m: m.group(1) + MASK, value)
        value = _HEADER_RE.sub(_header, value)
        value = _URL_RE.sub(lambda m: f"{m.group(1)}:{MASK}@", value)
        value = _KNOWN_RE.sub(MASK, value)
        value = _FLAG_RE.sub(_flag, value)
        value = _kv_sub(value)
        # Last: `bearer` must not take a key (`bearer password: x`) for its value.
        value = _SCHEME_WORD_RE.sub(_scheme_word, value)
        for pattern in self._extra:
            value = pattern.sub(MASK, value)
        return value

    def message(self, value: str, max_chars: int) -> str:
        """Redact, then truncate (redacting first so truncation cannot split a secret)."""
        value = self.text(value)
        if len(value) > max_chars:
            value = value[: max_chars - 15] + "... [truncated]"
        return value

    def json(self, value: Any) -> Any:
        """Redact every string (keys included) in a JSON-like structure: a run
        result, a step result, event data."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            # {"api_key": ...}: the key says secret, so the whole value goes,
            # whatever its type (a PIN is a number, credentials an object).
            return {
                self.text(str(k)): MASK
                if is_secret_key(str(k)) and v is not None and not isinstance(v, bool)
                else self.json(v)
                for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return [self.json(v) for v in value]
        return value


DEFAULT_REDACTOR = Redactor()
