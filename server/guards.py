"""Small pure checks the server applies to every client: Origin, bearer token, error budget.

No sockets and no clock here: callers pass the headers and the time, so each rule is tested alone.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from urllib.parse import parse_qs, urlsplit

from streamdec.errors import ConfigError

__all__ = ["ErrorBudget", "origin_allowed", "token_offered"]


def origin_allowed(origin: str | None, host: str | None, allowed: Iterable[str]) -> bool:
    """Whether a handshake's ``Origin`` may open a stream.

    Allowed: no Origin at all (not a browser: a program chose to connect), the server's own page (an
    http(s) Origin whose host and port are the ``Host`` the request was sent to), and every origin listed
    in ``allowed`` (exact match, case-insensitive). Anything else is a page elsewhere trying to use a
    server the browser can reach, which is what the check is for.
    """
    if origin is None:
        return True
    wanted = origin.strip().lower()
    if wanted in (a.lower().rstrip("/") for a in allowed):
        return True
    parts = urlsplit(wanted)
    return parts.scheme in ("http", "https") and host is not None and parts.netloc == host.strip().lower()


def token_offered(token: str, authorization: str | None, query: str) -> bool:
    """Whether ``Authorization: Bearer T`` (scheme case-insensitive, RFC 7235) or ``?token=T`` carries
    ``token``; compared in constant time."""
    offered = parse_qs(query).get("token", [])
    scheme, _, value = (authorization or "").strip().partition(" ")
    if scheme.lower() == "bearer":
        offered.append(value.strip())
    return any(hmac.compare_digest(t.encode(), token.encode()) for t in offered)


class ErrorBudget:
    """A leaky bucket of rejected messages: each costs 1, the bucket drains ``refill`` per second, and a
    connection whose bucket passes ``budget`` is closed (1008). A client with an occasional error never
    runs out; a flood of garbage does within ``budget`` messages, so it cannot cost the server a core.
    """

    def __init__(self, budget: int, refill: float) -> None:
        if budget < 1 or refill < 0:
            raise ConfigError(f"error budget {budget} must be >= 1 and refill {refill} >= 0 per second")
        self.budget, self.refill = budget, refill
        self.level = 0.0
        self._at: float | None = None

    def spend(self, now: float) -> bool:
        """Count one rejected message at time ``now`` (seconds); False once the budget is exhausted."""
        if self._at is not None:
            self.level = max(0.0, self.level - (now - self._at) * self.refill)
        self._at = now
        self.level += 1.0
        return self.level <= self.budget
