"""Time-ordered run ids (UUID version 7, RFC 9562).

Ids minted here sort by creation time, which keeps the primary key's B-tree
appending at its right edge and makes keyset pagination by id follow
creation order. Python 3.11 has no `uuid.uuid7`, hence this small function.
"""

from __future__ import annotations

import os
import threading
import time
from uuid import UUID

_lock = threading.Lock()
_last_ms = 0
_seq = 0


def uuid7() -> UUID:
    """A UUIDv7: 48-bit Unix milliseconds, then a 12-bit counter, then random bits.

    The counter (method 1 of RFC 9562, 6.2) keeps ids minted in the same
    millisecond by this process strictly increasing.
    """
    global _last_ms, _seq
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            _seq += 1
            if _seq > 0xFFF:  # counter exhausted: borrow the next millisecond
                _last_ms += 1
                _seq = 0
            ms = _last_ms
        else:
            _last_ms = ms
            _seq = int.from_bytes(os.urandom(2), "big") & 0x3FF  # leave room to count up
        seq = _seq
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | seq << 64 | 0b10 << 62 | rand
    return UUID(int=value)
