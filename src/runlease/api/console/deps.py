"""Who is looking at the console, and what guards its forms.

A request without a valid session (none, forged, expired) is sent to the
sign-in page: a redirect for a page, an `HX-Redirect` for a live fragment.
A form post must carry the session's CSRF token and, when the browser says
where it comes from, come from this origin; otherwise 403.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated
from urllib.parse import parse_qs, urlsplit
from uuid import UUID

from fastapi import Depends, Request

from runlease.api.auth import Principal, TokenRegistry
from runlease.api.console.render import Renderer
from runlease.api.console.session import COOKIE, Session, Sessions
from runlease.api.console.throttle import SignInThrottle
from runlease.api.deps import api_state
from runlease.db.models import Run
from runlease.db.store import RunStore
from runlease.errors import RunNotFound

MAX_FORM_FIELDS = 1000


class SignIn(Exception):
    """No valid session: answered by a redirect to /ui/login."""


class Refused(Exception):
    """A form that fails its CSRF or origin check, or a page for admins only."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class BadRequest(Exception):
    """A filter or form field the console cannot use; shown, never a 500."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class ConsoleState:
    sessions: Sessions
    renderer: Renderer = field(default_factory=Renderer)
    throttle: SignInThrottle = field(default_factory=SignInThrottle)
    _tokens: dict[str, Principal] | None = None

    def principal_of(self, registry: TokenRegistry, token_id: str) -> Principal | None:
        """The principal of the configured token a session came from; None
        once that token is gone (the registry is fixed for the process's
        life, so the map is built once)."""
        if self._tokens is None:
            self._tokens = {self.sessions.token_id(d): p
                            for d, p in registry.by_digest().items()}
        return self._tokens.get(token_id)


@dataclass(frozen=True)
class Viewer:
    session: Session
    csrf: str

    @property
    def admin(self) -> bool:
        return self.session.principal.admin

    @property
    def scope(self) -> str | None:
        return self.session.principal.scope

    @property
    def name(self) -> str:
        return "admin" if self.admin else (self.session.principal.tenant_id or "")


def console_state(request: Request) -> ConsoleState:
    state: ConsoleState = request.app.state.console
    return state


async def store(request: Request) -> RunStore:
    return api_state(request).opened().store


async def viewer(request: Request) -> Viewer:
    sessions = console_state(request).sessions
    session = sessions.read(request.cookies.get(COOKIE))
    if session is None or console_state(request).principal_of(
            api_state(request).tokens, session.token_id) != session.principal:
        raise SignIn
    if await api_state(request).opened().store.signed_out(session.nonce):
        raise SignIn  # signed out: the cookie is dead before it expires (issue 32)
    return Viewer(session, sessions.csrf(session))


async def admin_viewer(who: Annotated[Viewer, Depends(viewer)]) -> Viewer:
    if not who.admin:
        raise Refused(403, "This page is for admins: sign in with an admin token.")
    return who


def same_origin(request: Request) -> bool:
    """The browser's Origin (or Referer) names this host, or it sent neither."""
    source = request.headers.get("origin") or request.headers.get("referer")
    if not source or source == "null":
        return source is None
    return urlsplit(source).netloc == request.headers.get("host", "")


async def form_fields(request: Request) -> dict[str, list[str]]:
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/x-www-form-urlencoded":
        raise BadRequest("send the form as application/x-www-form-urlencoded")
    body = (await request.body()).decode("utf-8", errors="replace")
    try:
        return parse_qs(body, keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS)
    except ValueError:
        raise BadRequest(f"a form has at most {MAX_FORM_FIELDS} fields") from None


@dataclass(frozen=True)
class Posted:
    """A checked form post: who sent it and its fields."""

    viewer: Viewer
    fields: dict[str, list[str]]

    def get(self, name: str, default: str = "") -> str:
        values = self.fields.get(name)
        return values[0] if values else default


async def posted(request: Request, who: Annotated[Viewer, Depends(viewer)]) -> Posted:
    if not same_origin(request):
        raise Refused(403, "This form came from another site.")
    try:
        fields = await form_fields(request)
    except BadRequest:  # not a form: it carries no CSRF token either
        fields = {}
    token = (fields.get("csrf") or [""])[0]
    if not console_state(request).sessions.csrf_ok(who.session, token):
        raise Refused(403, "This form has no valid CSRF token: reload the page and retry.")
    return Posted(who, fields)


async def admin_posted(form: Annotated[Posted, Depends(posted)]) -> Posted:
    if not form.viewer.admin:
        raise Refused(403, "Only an admin may do this.")
    return form


async def scoped_run(store: RunStore, run_id: UUID, who: Viewer) -> Run:
    """The run, if the viewer may see it; another tenant's is a 404 like a missing one."""
    try:
        return await store.get(run_id, tenant_id=who.scope)
    except RunNotFound:
        raise Refused(404, "No such run (or it is not yours).") from None


Store = Annotated[RunStore, Depends(store)]
Who = Annotated[Viewer, Depends(viewer)]
AdminWho = Annotated[Viewer, Depends(admin_viewer)]
Form = Annotated[Posted, Depends(posted)]
AdminForm = Annotated[Posted, Depends(admin_posted)]
