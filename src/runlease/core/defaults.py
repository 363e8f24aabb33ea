"""A new pool's defaults, said once.

The migrations' column DEFAULTs and the CRD's defaults say them again in their
own languages; tests/unit/test_constants.py keeps them equal to these.
"""

from __future__ import annotations

DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_LEASE_S = 45
DEFAULT_PRIORITY_AGING_S = 60
DEFAULT_RETENTION_S = 7 * 24 * 3600
