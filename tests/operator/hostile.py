"""Names a hostile pool spec might give to reach outside its namespace."""

from __future__ import annotations

HOSTILE_NAMES = [
    "../../kube-system/secrets/db",
    "a/b",
    "..",
    "x" * 300,
    "db?watch=true",
    "Db",
    "%2e%2e",
]
