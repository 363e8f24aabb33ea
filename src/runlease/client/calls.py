"""Request building and answer reading, shared by both clients: only the
I/O differs between Client and AsyncClient."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import httpx

from runlease.client.errors import ApiError, Conflict, NotFound, Unauthorized
from runlease.client.views import RunPage, RunView, StepPage, StepView

MAX_BATCH = 1000  # runs per POST /v1/runs/batch


def chunks(runs: Iterable[Mapping[str, Any]], size: int) -> Iterator[list[Mapping[str, Any]]]:
    if not 1 <= size <= MAX_BATCH:
        raise ValueError(f"chunk must be between 1 and {MAX_BATCH}, got {size}")
    part: list[Mapping[str, Any]] = []
    for run in runs:
        part.append(run)
        if len(part) == size:
            yield part
            part = []
    if part:
        yield part


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
                    tenant_id: str | None, labels: Mapping[str, str] | None = None,
                    run_at: datetime | str | None = None,
                    delay_s: float | None = None, **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"input": dict(input)}
        for key, value in (("pool", pool), ("priority", priority), ("max_attempts", max_attempts),
                           ("budget", budget), ("tenant_id", tenant_id), ("labels", labels),
                           ("run_at", run_at), ("delay_s", delay_s), *extra.items()):
            if value is not None:
                body[key] = value.isoformat() if isinstance(value, datetime) else value
        return body

    @staticmethod
    def batch_body(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """A batch's body: each run a single submit's body (`input`, `pool`,
        `labels`, `run_at`...) and its `idempotency_key`."""
        return {"runs": [{k: v.isoformat() if isinstance(v, datetime) else v
                          for k, v in run.items() if v is not None} for run in runs]}

    @staticmethod
    def list_params(status: str | Sequence[str] | None, pool: str | None, limit: int,
                    cursor: str | None, *, label: Sequence[str] | Mapping[str, str] | None = None,
                    created_after: datetime | None = None,
                    created_before: datetime | None = None,
                    finished_after: datetime | None = None,
                    finished_before: datetime | None = None,
                    idempotency_key: str | None = None,
                    tenant: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = [status] if isinstance(status, str) else list(status)
        if label:
            params["label"] = ([f"{k}:{v}" for k, v in label.items()]
                               if isinstance(label, Mapping) else list(label))
        for key, value in (("pool", pool), ("cursor", cursor), ("created_after", created_after),
                           ("created_before", created_before),
                           ("finished_after", finished_after),
                           ("finished_before", finished_before),
                           ("idempotency_key", idempotency_key), ("tenant", tenant)):
            if value:
                params[key] = value.isoformat() if isinstance(value, datetime) else value
        return params

    @staticmethod
    def batch(data: Mapping[str, Any]) -> list[RunView]:
        created = data.get("created") or [True] * len(data["runs"])
        return [RunView.from_json(r, c) for r, c in zip(data["runs"], created, strict=True)]

    @staticmethod
    def page(data: Mapping[str, Any]) -> RunPage:
        return RunPage([RunView.from_json(i) for i in data["items"]], data.get("next_cursor"))

    @staticmethod
    def steps_params(limit: int, cursor: str | None) -> dict[str, Any]:
        return {"limit": limit, **({"cursor": cursor} if cursor else {})}

    @staticmethod
    def step_page(data: Mapping[str, Any]) -> StepPage:
        return StepPage([StepView.from_json(i) for i in data["items"]], data.get("next_cursor"))

    def stream_headers(self, after: int) -> dict[str, str]:
        return {**self.headers, "Accept": "text/event-stream", "Last-Event-ID": str(after)}
