"""Bodies of the bulk actions and of re-prioritising, as the OpenAPI spec
shows them."""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StringConstraints,
    field_validator,
)

from runlease.api.schemas import (
    POOL_PATTERN,
    Priority,
    Status,
    Strict,
    TenantId,
    not_a_number,
)
from runlease.api.search import LABEL_FILTER_MAX_CHARS, LABEL_FILTER_PATTERN
from runlease.core import bounds, run_options
from runlease.db.bulk import BULK_IDS_MAX, BULK_MAX_RUNS, REPORTED_IDS_MAX, BulkResult

# RFC 3339 only, as the listing's query parameters (not a number read as Unix time).
Time = Annotated[AwareDatetime, BeforeValidator(not_a_number)]


def _ids_or_filter(schema: dict[str, Any]) -> None:
    # Exactly one of the two, and neither may be null: say so in the schema.
    props = schema["properties"]
    for name in ("ids", "filter"):
        options = props[name].pop("anyOf")
        props[name].update(next(o for o in options if o.get("type") != "null"))
        props[name].pop("default", None)
    schema["oneOf"] = [{"required": ["ids"]}, {"required": ["filter"]}]


class RunFilterIn(Strict):
    """Which runs: every field given must match (left out: any), as the
    listing's query parameters (`GET /v1/runs`) do."""

    status: list[Status] | None = Field(None, min_length=1, max_length=6,
                                        examples=[["pending", "leased"]])
    pool: str | None = Field(None, min_length=1, max_length=bounds.POOL_MAX_CHARS,
                             pattern=POOL_PATTERN, examples=["default"])
    label: list[Annotated[str, StringConstraints(
        min_length=3, max_length=LABEL_FILTER_MAX_CHARS, pattern=LABEL_FILTER_PATTERN)]] | None = (
        Field(None, max_length=run_options.LABELS_MAX, description="`key=value` (or "
                                                                  "`key:value`) labels, all "
                                                                  "must match.",
              examples=[["agent_version=1.4.2"]]))
    created_after: Time | None = Field(None, examples=["2026-12-01T00:00:00Z"])
    created_before: Time | None = None
    finished_after: Time | None = None
    finished_before: Time | None = None
    tenant_id: TenantId | None = Field(
        None, description="Admin: only this tenant's runs. A tenant token's filter is "
                          "always its own tenant (another tenant's is refused with 403).")


class BulkIn(Strict):
    """Either `ids` or `filter`. `dry_run` counts the runs the action would
    change and changes none."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_ids_or_filter)

    ids: list[UUID] | None = Field(None, min_length=1, max_length=BULK_IDS_MAX,
                                   description=f"At most {BULK_IDS_MAX} run ids.")
    filter: RunFilterIn | None = None
    dry_run: StrictBool = False

    @field_validator("ids", "filter", mode="before")
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        # Left out is fine; an explicit null is not what the document allows.
        if value is None:
            raise ValueError("must be left out, not null")
        return value


class BulkOut(BaseModel):
    op_id: UUID = Field(description="The operation's id, in each changed run's audit event.")
    action: str = Field(examples=["cancel"])
    dry_run: bool
    matched: int = Field(description="Runs the action applies to (what a dry run counts).")
    affected: int = Field(description="Runs it changed (0 for a dry run).")
    ids: list[UUID] = Field(description=f"The changed runs' ids (at most {REPORTED_IDS_MAX}).")
    truncated: bool = Field(description=f"Stopped after {BULK_MAX_RUNS} runs: send it again "
                                        "for the rest.")

    @classmethod
    def of(cls, result: BulkResult) -> BulkOut:
        return cls(op_id=result.op_id, action=result.action, dry_run=result.dry_run,
                   matched=result.matched, affected=result.affected, ids=list(result.ids),
                   truncated=result.truncated)


class RunPatch(Strict):
    """What may change on a pending run."""

    priority: Priority = Field(description="The run's new priority, within the tenant's "
                                           "band in the run's pool.", examples=[10])
