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
_VARIANT = {d: "89ab"[int(d, 16) & 3] for d in "0123456789abcdef"}
_last_ms = 0
_seq = 0


def uuid7() -> UUID:
    """A UUIDv7 (see uuid7_texts)."""
    (one,) = uuid7_texts(1)
    return UUID(one)


def uuid7_texts(n: int) -> list[str]:
    """n UUIDv7s as text, in order: 48-bit Unix milliseconds, then a 12-bit
    counter, then random bits. One lock and one read of random bytes for all
    n, and text without UUID objects: a batch of 1,000 runs sends and
    answers with its ids as text (one by one, as objects, they took 4 ms).

    The counter (method 1 of RFC 9562, 6.2) keeps ids minted in the same
    millisecond by this process strictly increasing.
    """
    global _last_ms, _seq
    stamps: list[tuple[int, int]] = []
    with _lock:
        now_ms = time.time_ns() // 1_000_000
        for _ in range(n):
            if now_ms <= _last_ms:
                _seq += 1
                if _seq > 0xFFF:  # counter exhausted: borrow the next millisecond
                    _last_ms += 1
                    _seq = 0
            else:
                _last_ms = now_ms
                _seq = int.from_bytes(os.urandom(2), "big") & 0x3FF  # leave room to count up
            stamps.append((_last_ms, _seq))
    # The 62 random bits as hex: the variant's digit (10 then 2 random bits),
    # then 15 random digits.
    rand = os.urandom(8 * n).hex()
    texts = []
    shown_ms, prefix = -1, ""
    for i, (ms, seq) in enumerate(stamps):
        if ms != shown_ms:  # the millisecond and the version, once per millisecond
            shown_ms, stamp = ms, ms & ((1 << 48) - 1)
            prefix = f"{stamp >> 16:08x}-{stamp & 0xFFFF:04x}-7"
        j = 16 * i
        texts.append(f"{prefix}{seq:03x}-{_VARIANT[rand[j]]}{rand[j + 1:j + 4]}-"
                     f"{rand[j + 4:j + 16]}")
    return texts
