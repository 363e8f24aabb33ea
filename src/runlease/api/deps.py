"""What routes depend on: the store, the feed hub, and who is calling.

The dependencies are coroutines although they never await: FastAPI runs a
plain function dependency in a worker thread, a thread hop per dependency
per request for what is a dictionary lookup."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request

from runlease.api.auth import Principal, StreamTokens, TokenRegistry
from runlease.api.errors import ErrorAnswer, unauthorized
from runlease.api.feeds import FeedHub
from runlease.api.submit_group import SubmitGroups
from runlease.api.wakeups import PoolWaker
from runlease.db.store import RunStore
from runlease.settings import ApiSettings


@dataclass(frozen=True, slots=True)
class Live:
    """What the app's lifespan opens at once, over one connection pool, and
    closes when the app stops."""

    store: RunStore
    hub: FeedHub
    waker: PoolWaker
    groups: SubmitGroups


@dataclass
class ApiState:
    settings: ApiSettings
    tokens: TokenRegistry
    stream_tokens: StreamTokens
    live: Live | None = None  # None until the lifespan starts
    fast_submits: int = 0  # answered by api/fast_submit.py (tests, the bench)
    fast_batches: int = 0  # read by api/fast_batch.py (tests)
    resume_links: Any = None  # api/humans.py: made on first use (ResumeLinks)

    def opened(self) -> Live:
        assert self.live is not None, "the app's lifespan has not started"
        return self.live


def api_state(request: Request) -> ApiState:
    state: ApiState = request.app.state.runlease
    return state


async def store(request: Request) -> RunStore:
    return api_state(request).opened().store


def bearer(request: Request) -> Principal | None:
    return principal_of(api_state(request), request.headers.get("authorization", ""))


def principal_of(state: ApiState, authorization: str) -> Principal | None:
    """Who an Authorization header names: a known bearer token's principal, or None."""
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return state.tokens.authenticate(token.strip())


async def principal(request: Request) -> Principal:
    who = bearer(request)
    if who is None:
        raise unauthorized()
    return who


async def admin(who: Annotated[Principal, Depends(principal)]) -> Principal:
    if not who.admin:
        raise ErrorAnswer(403, "forbidden", "admin only")
    return who


async def json_content(request: Request) -> None:
    """A body must say it is JSON: without the header FastAPI would guess, and
    a form post (curl -d) would read as a body with no fields (a misleading 422)."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json" and not (media.startswith("application/")
                                            and media.endswith("+json")):
        got = f"got {media!r}" if media else "none was sent"
        raise ErrorAnswer(415, "unsupported_media_type",
                       f"Content-Type: send application/json ({got})", "Content-Type")


async def waker(request: Request) -> PoolWaker:
    return api_state(request).opened().waker


async def groups(request: Request) -> SubmitGroups:
    return api_state(request).opened().groups


Store = Annotated[RunStore, Depends(store)]
Groups = Annotated[SubmitGroups, Depends(groups)]
Waker = Annotated[PoolWaker, Depends(waker)]
JsonBody = Depends(json_content)
Who = Annotated[Principal, Depends(principal)]
Admin = Annotated[Principal, Depends(admin)]
