"""Request building and answer reading, shared by both clients: only the
I/O differs between Client and AsyncClient."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date
from typing import Any
from uuid import UUID

import httpx

from runlease.client.errors import ApiError, Conflict, NotFound, Unauthorized
from runlease.client.views import RunPage, RunView, StepPage, StepView


class Calls:
    """Request building and answer reading, shared by both clients."""

    def __init__(self, api_url: str, token: str | None) -> None:
        self.base = api_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    @staticmethod
    def check(response: httpx.Response) -> Any:
        if response.status_code < 400:
            return response.json() if response.content else None
        try:
            error = response.json()["error"]
        except (ValueError, KeyError, TypeError):
            error = {"code": "http_error", "message": response.text[:500]}
        kind = {404: NotFound, 401: Unauthorized, 409: Conflict}.get(response.status_code,
                                                                   ApiError)
        raise kind(response.status_code, error.get("code", "error"),
                   error.get("message", ""), error.get("field"))

    @staticmethod
    def submit_body(input: Mapping[str, Any], pool: str | None, priority: int | None,  # noqa: A002
                    max_attempts: int | None, budget: Mapping[str, Any] | None,
                    tenant_id: str | None, parent_run_id: UUID | str | None = None,
                    webhook_url: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"input": dict(input)}
        for key, value in (("pool", pool), ("priority", priority), ("max_attempts", max_attempts),
                           ("budget", budget), ("tenant_id", tenant_id),
                           ("parent_run_id", None if parent_run_id is None
                            else str(parent_run_id)), ("webhook_url", webhook_url)):
            if value is not None:
                body[key] = value
        return body

    @staticmethod
    def list_params(status: str | None, pool: str | None, limit: int,
                    cursor: str | None, parent_run_id: UUID | str | None = None
                    ) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if parent_run_id is not None:
            params["parent_run_id"] = str(parent_run_id)
        if status:
            params["status"] = status
        if pool:
            params["pool"] = pool
        if cursor:
            params["cursor"] = cursor
        return params

    @staticmethod
    def page(data: Mapping[str, Any]) -> RunPage:
        return RunPage([RunView.from_json(i) for i in data["items"]], data.get("next_cursor"))

    @staticmethod
    def steps_params(limit: int, cursor: str | None) -> dict[str, Any]:
        return {"limit": limit, **({"cursor": cursor} if cursor else {})}

    @staticmethod
    def step_page(data: Mapping[str, Any]) -> StepPage:
        return StepPage([StepView.from_json(i) for i in data["items"]], data.get("next_cursor"))

    @staticmethod
    def usage_params(start: date | str | None, end: date | str | None, group_by: str,
                     tenant_id: str | None, pool: str | None) -> dict[str, Any]:
        params: dict[str, Any] = {"group_by": group_by}
        for key, value in (("from", start), ("to", end), ("tenant_id", tenant_id),
                           ("pool", pool)):
            if value is not None:
                params[key] = str(value)
        return params

    def stream_headers(self, after: int) -> dict[str, str]:
        return {**self.headers, "Accept": "text/event-stream", "Last-Event-ID": str(after)}
