"""`runlease pools ...`: list pools and create or change them, tenant limits
and priority bands included (admin)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from runlease.cli import output as printing
from runlease.cli.terminal import api_options, client, emit_json, out
from runlease.client import ApiError


@click.group()
def pools() -> None:
    """Pools and tenant limits (admin)."""


@pools.command("list")
@api_options
def pools_list(api_url: str, token: str, as_json: bool) -> None:
    """Pools, their settings and tenant limits (-o wide: every setting)."""
    with client(api_url, token) as api:
        items = api.pools()
    if as_json:
        emit_json(items)
        return
    printing.table(items, POOL_COLUMNS)
    for p in items:
        if (p.get("service") or {}).get("unserved"):
            click.echo(f"warning: pool {p['name']} has runs ready to claim and no live "
                       "worker: they wait until one starts (runlease worker --pool "
                       f"{p['name']}, or an AgentRunPool)", err=True)


def _workers(p: dict[str, Any]) -> str:
    """Live workers; `0!` when runs are ready and none is there to claim them."""
    service = p.get("service") or {}
    live = service.get("live_workers")
    if live is None:
        return ""
    return f"{live}!" if service.get("unserved") else str(live)


POOL_COLUMNS = (
    printing.Column("NAME", lambda p: p["name"]),
    printing.Column("PAUSED", lambda p: bool(p.get("paused"))),
    printing.Column("WORKERS", _workers),
    printing.Column("MAX ATTEMPTS", lambda p: p["max_attempts"]),
    printing.Column("LEASE S", lambda p: p["lease_s"]),
    printing.Column("DEFAULT LIMIT", lambda p: p["default_max_in_flight"]),
    printing.Column("LIMITS", lambda p: ",".join(f"{t}={n}" for t, n in
                                                 p["tenant_limits"].items())),
    printing.Column("RETENTION S", lambda p: p.get("retention_s"), wide=True),
    printing.Column("AGING S", lambda p: p.get("priority_aging_s"), wide=True),
    printing.Column("PRIORITY BANDS", lambda p: ",".join(
        f"{t}={b['min']}:{b['max']}" for t, b in p.get("tenant_priority", {}).items()),
        wide=True),
    printing.Column("TOOL ENV", lambda p: ",".join(p.get("tool_env", [])), wide=True),
)


def _pairs(items: tuple[str, ...], option: str, parse: Callable[[str], Any]) -> dict[str, Any]:
    """TENANT=VALUE items; VALUE `none` removes the tenant's setting (None)."""
    out: dict[str, Any] = {}
    for item in items:
        tenant, sep, raw = item.rpartition("=")
        if not sep or not tenant:
            raise click.BadParameter(f"{item!r}: expected TENANT=VALUE", param_hint=option)
        try:
            out[tenant] = None if raw == "none" else parse(raw)
        except ValueError:
            raise click.BadParameter(f"{item!r}: bad value {raw!r}", param_hint=option) from None
    return out


def _band(raw: str) -> dict[str, int]:
    lo, sep, hi = raw.partition(":")
    if not sep:
        raise ValueError(raw)
    return {"min": int(lo), "max": int(hi)}


def _count(raw: str) -> int:
    if not raw.isdigit():
        raise ValueError(raw)
    return int(raw)


def _rate(raw: str) -> dict[str, int]:
    """SUBMITS/TOKENS per minute; `-` for no such rate."""
    submits, sep, tokens = raw.partition("/")
    if not sep:
        raise ValueError(raw)
    rate = {k: _count(v) for k, v in (("submits_per_minute", submits),
                                      ("tokens_per_minute", tokens)) if v != "-"}
    if not rate:
        raise ValueError(raw)
    return rate


def merge_pool(current: dict[str, Any] | None, given: dict[str, Any],
               limits: dict[str, int | None], bands: dict[str, dict[str, int] | None],
               rates: dict[str, dict[str, int] | None] | None = None) -> dict[str, Any]:
    """The PUT body: the pool as it is (or the defaults, for a new pool), with
    only what was given changed. A tenant named with `none` loses that setting."""
    body = {k: v for k, v in (current or {}).items() if k not in ("name", "service")}
    body.update(given)
    for key, changes in (("tenant_limits", limits), ("tenant_priority", bands),
                         ("tenant_rates", rates or {})):
        merged = dict(body.get(key) or {})
        for tenant, value in changes.items():
            if value is None:
                merged.pop(tenant, None)
            else:
                merged[tenant] = value
        body[key] = merged
    return body


@pools.command("upsert")
@api_options
@click.argument("name")
@click.option("--max-attempts", type=int, help="Attempts before a run is dead [new pool: 3].")
@click.option("--lease-s", type=int, help="Lease length workers use [new pool: 45].")
@click.option("--retention-s", type=int,
              help="Finished runs older than this are deleted; 0 keeps them [new pool: 7 days].")
@click.option("--paused/--resumed", default=None,
              help="A paused pool's runs are not claimed (submits are accepted).")
@click.option("--default-max-in-flight",
              help="Per-tenant cap for tenants without their own; `none` for no cap.")
@click.option("--priority-aging-s", type=int, help="Waiting worth one priority point.")
@click.option("--tool-env", help="Comma-separated names of worker environment variables "
                                 "the pool's tools may see; '' for none.")
@click.option("--limit", "limits", multiple=True, metavar="TENANT=N",
              help="A tenant's cap (repeatable); TENANT=none removes it.")
@click.option("--priority", "bands", multiple=True, metavar="TENANT=MIN:MAX",
              help="A tenant's priority band (repeatable); TENANT=none removes it.")
@click.option("--rate", "rates", multiple=True, metavar="TENANT=SUBMITS/TOKENS",
              help="A tenant's runs submitted and model tokens per minute, `-` for none "
                   "(repeatable; docs/limits.md); TENANT=none removes both.")
def pools_upsert(api_url: str, token: str, as_json: bool, name: str,
                 max_attempts: int | None, lease_s: int | None, retention_s: int | None,
                 paused: bool | None, default_max_in_flight: str | None,
                 priority_aging_s: int | None, tool_env: str | None,
                 limits: tuple[str, ...], bands: tuple[str, ...],
                 rates: tuple[str, ...] = ()) -> None:
    """Create or update a pool (`pools set` and `pools upsert` are one command).
    Only what is given changes:
    settings and tenants left out keep their current values (a new pool starts
    from the defaults); TENANT=none removes a tenant's setting."""
    given: dict[str, Any] = {k: v for k, v in (
        ("max_attempts", max_attempts), ("lease_s", lease_s), ("retention_s", retention_s),
        ("paused", paused), ("priority_aging_s", priority_aging_s)) if v is not None}
    if default_max_in_flight is not None:
        try:
            given["default_max_in_flight"] = (None if default_max_in_flight == "none"
                                              else _count(default_max_in_flight))
        except ValueError:
            raise click.BadParameter(f"{default_max_in_flight!r}: a count or none",
                                     param_hint="--default-max-in-flight") from None
    if tool_env is not None:
        given["tool_env"] = [n.strip() for n in tool_env.split(",") if n.strip()]
    tenant_limits = _pairs(limits, "--limit", _count)
    tenant_bands = _pairs(bands, "--priority", _band)
    with client(api_url, token) as api:
        try:
            current: dict[str, Any] | None = api.pool(name)
        except ApiError as exc:
            if exc.status != 404:
                raise
            current = None
        pool = api.upsert_pool(name, **merge_pool(current, given, tenant_limits, tenant_bands,
                                                  _pairs(rates, "--rate", _rate)))
    if as_json:
        emit_json(pool)
    else:
        out(f"pool {pool['name']}: {'saved' if current else 'created'}")


pools.add_command(pools_upsert, "set")


@pools.command("key-limits")
@api_options
@click.argument("name")
@click.option("--default", "default_limit", metavar="N|none",
              help="Every concurrency key's limit (none: unlimited).")
@click.option("--key", "keys", multiple=True, metavar="KEY=N",
              help="A key's own limit, or a pattern's ('user-*=2': each key it matches; "
                   "repeatable; KEY=none removes it).")
def pools_key_limits(api_url: str, token: str, as_json: bool, name: str,
                     default_limit: str | None, keys: tuple[str, ...]) -> None:
    """Show a pool's limits per concurrency key, or change them (admin): the
    options given change those settings, the others are kept."""
    with client(api_url, token) as api:
        current = api.key_limits(name)
        if default_limit is not None or keys:
            wanted = dict(current["keys"])
            for key, value in _pairs(keys, "--key", _count).items():
                if value is None:
                    wanted.pop(key, None)
                else:
                    wanted[key] = value
            default = current["default"]
            if default_limit is not None:
                try:
                    default = None if default_limit == "none" else _count(default_limit)
                except ValueError:
                    raise click.BadParameter(f"{default_limit!r}: a count or none",
                                             param_hint="--default") from None
            current = api.set_key_limits(name, default=default, keys=wanted)
    if as_json:
        emit_json(current)
        return
    out(f"pool {current['pool']}: default {current['default'] or 'unlimited'}")
    for key, limit in sorted(current["keys"].items()):
        out(f"  {key}: {limit}")
