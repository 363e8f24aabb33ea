"""GET and PUT /v1/pools/{name}/key-limits (issue 27): a pool's limits per
concurrency key (admin). `default` caps every key (null: unlimited), `keys`
a key's own limit or a key pattern's ("user-*"); each at least 1. A raise hands the freed slots to
parked runs in the same call."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path
from pydantic import BaseModel, Field, StringConstraints

from runlease.api.deps import Admin, JsonBody, Store
from runlease.api.schemas import INTEGRAL, POOL_PATTERN, ErrorBody, Strict
from runlease.core import bounds
from runlease.db.keys import KEY_LIMIT_MAX, MAX_KEY_LIMITS, KeyLimits

router = APIRouter(prefix="/v1")

PoolPath = Annotated[str, Path(min_length=1, max_length=bounds.POOL_MAX_CHARS,
                               pattern=POOL_PATTERN)]
# A key, or a pattern of keys (`*` any characters; not `*` alone: `default`).
Key = Annotated[str, StringConstraints(min_length=1, max_length=bounds.THREAD_MAX_CHARS,
                                       pattern=bounds.KEY_PATTERN_PATTERN)]
# A float with no fraction is the integer it is (JSON Schema's `integer`).
Limit = Annotated[int, Field(strict=True, ge=1, le=KEY_LIMIT_MAX), INTEGRAL]


def _key_names(schema: dict[str, Any]) -> None:
    # pydantic writes a constrained key as patternProperties, which leaves
    # keys that do not match unconstrained: say every key must match.
    values = schema.pop("patternProperties", None)
    if values:
        schema["additionalProperties"] = next(iter(values.values()))
        schema["propertyNames"] = {"minLength": 1, "maxLength": bounds.THREAD_MAX_CHARS,
                                   "pattern": bounds.KEY_PATTERN_PATTERN,
                                   "not": {"pattern": r"^\*+$"}}


class KeyLimitsIn(Strict):
    default: Limit | None = Field(None, description="Every key's limit (null: unlimited).",
                                  examples=[2])
    keys: dict[Key, Limit] = Field(default_factory=dict, max_length=MAX_KEY_LIMITS,
                                   description="A key's own limit, or a pattern's (`*` any "
                                               "characters: each key it matches has that "
                                               "limit); a key's own beats the longest "
                                               "pattern it matches, which beats the default.",
                                   examples=[{"repo-main": 1, "user-*": 2}],
                                   json_schema_extra=_key_names)


class KeyLimitsOut(BaseModel):
    pool: str
    default: int | None
    keys: dict[str, int]
    unparked: int = Field(0, description="Runs that took a slot the change freed (PUT).")


NO_POOL: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "No such pool."}}
PUT_ANSWERS: dict[int | str, dict[str, Any]] = {
    **NO_POOL, 415: {"model": ErrorBody, "description": "No `Content-Type: application/json`."}}


async def _known(store: Store, pool: str) -> None:
    if await store.get_pool(pool) is None:
        raise HTTPException(404, f"no pool {pool!r}")


@router.get("/pools/{pool_name}/key-limits", response_model=KeyLimitsOut, responses=NO_POOL)
async def get_key_limits(pool_name: PoolPath, who: Admin, store: Store) -> KeyLimitsOut:
    """The pool's limits per concurrency key (admin)."""
    await _known(store, pool_name)
    limits = await store.key_limits(pool_name)
    return KeyLimitsOut(pool=pool_name, default=limits.default, keys=limits.keys, unparked=0)


@router.put("/pools/{pool_name}/key-limits", response_model=KeyLimitsOut, responses=PUT_ANSWERS,
            dependencies=[JsonBody])
async def put_key_limits(pool_name: PoolPath, body: KeyLimitsIn, who: Admin,
                         store: Store) -> KeyLimitsOut:
    """The pool's limits per concurrency key become exactly these (admin)."""
    await _known(store, pool_name)
    moved = await store.replace_key_limits(pool_name, KeyLimits(body.default, dict(body.keys)))
    limits = await store.key_limits(pool_name)
    return KeyLimitsOut(pool=pool_name, default=limits.default, keys=limits.keys,
                        unparked=moved)
