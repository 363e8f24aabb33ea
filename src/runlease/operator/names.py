"""Kubernetes object names a pool's spec may give, checked before use.

A spec names other objects (its database Secret, a service account, image
pull secrets). Each name is checked as Kubernetes checks it — a DNS-1123
subdomain — so none can carry a path ("../../kube-system/secrets/db",
"a/b", "..") that would turn an API call of the operator against another
namespace or resource. The CRD declares the same patterns (a test keeps
them equal), so the API server refuses such a pool first; this is the check
that runs everywhere, even where no schema is enforced.
"""

from __future__ import annotations

import re

SUBDOMAIN_MAX_CHARS = 253
LABEL_MAX_CHARS = 63
# RFC 1123 subdomain: dot-separated labels of [a-z0-9-], alphanumeric at each end.
SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# RFC 1123 label: one such part (metadata.name becomes label values).
LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# A key of a Secret's data (IsConfigMapKey); "." and ".." are refused separately.
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"

_SUBDOMAIN = re.compile(SUBDOMAIN_PATTERN)
_LABEL = re.compile(LABEL_PATTERN)
# The same, but not "." or ".." (which the pattern allows).
_SECRET_KEY = re.compile(r"^(?!\.\.?$)" + SECRET_KEY_PATTERN.removeprefix("^"))


class InvalidName(ValueError):
    """Not a name Kubernetes would accept there; the message says why."""


def _describe(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _checked(value: object, max_chars: int, pattern: re.Pattern[str], shape: str) -> str:
    """`value` if it is a non-empty string of at most max_chars that matches
    `pattern`; else InvalidName saying it `must be <shape>`."""
    if not isinstance(value, str) or not value:
        raise InvalidName(f"must be a non-empty string, got {_describe(value)}")
    if len(value) > max_chars:
        raise InvalidName(f"must be at most {max_chars} characters, got {len(value)}")
    if not pattern.match(value):
        raise InvalidName(f"must be {shape}, got {_describe(value)}")
    return value


def subdomain(value: object) -> str:
    """A DNS-1123 subdomain (most object names: Secrets, service accounts)."""
    return _checked(value, SUBDOMAIN_MAX_CHARS, _SUBDOMAIN,
                    "a DNS-1123 subdomain (lower-case letters, digits, '-' and '.'; no '/')")


def label(value: object, max_chars: int = LABEL_MAX_CHARS) -> str:
    """A DNS-1123 label (a name that also becomes label values)."""
    return _checked(value, max_chars, _LABEL,
                    "a DNS-1123 label (lower-case letters, digits and '-')")


def secret_key(value: object) -> str:
    """A key of a Secret's data."""
    return _checked(value, SUBDOMAIN_MAX_CHARS, _SECRET_KEY,
                    "letters, digits, '-', '_' or '.' (not '.' or '..')")
