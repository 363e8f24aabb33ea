"""Sign-in throttling for the console (issue 32: none; tokens could be
guessed at the speed of the server).

Per client address, in this process: after `failures` failed sign-ins
within `window_s`, every sign-in from that address (a right token too) is
answered 429 with Retry-After until the oldest failure leaves the window.
Each API replica counts its own, so a fleet of N allows N times as many;
behind a proxy that hides client addresses, all clients share one count
(the console then throttles everyone while someone guesses: say so to the
proxy's owner, or give it the client address). Memory is bounded: at most
`max_clients` addresses are remembered, the stalest dropped first.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable


class SignInThrottle:
    def __init__(self, failures: int = 5, window_s: float = 60.0, max_clients: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.failures = failures
        self.window_s = window_s
        self.max_clients = max_clients
        self._clock = clock
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, client: str) -> deque[float]:
        now = self._clock()
        found = self._seen.get(client)
        if found is None:
            return deque()
        while found and found[0] <= now - self.window_s:
            found.popleft()
        if not found:
            del self._seen[client]
        return found

    def wait_s(self, client: str) -> float:
        """0 if the client may try to sign in now; else the seconds to wait."""
        recent = self._recent(client)
        if len(recent) < self.failures:
            return 0.0
        return max(0.001, recent[0] + self.window_s - self._clock())

    def failed(self, client: str) -> None:
        recent = self._recent(client)
        recent.append(self._clock())
        self._seen[client] = recent
        self._seen.move_to_end(client)
        while len(self._seen) > self.max_clients:
            self._seen.popitem(last=False)
