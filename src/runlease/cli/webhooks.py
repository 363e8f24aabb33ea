"""`runlease webhooks hosts|secret`: the admin's webhook allowlist and a
tenant's signing key; `runlease runs children RUN_ID`: a run's children."""

from __future__ import annotations

from typing import Any

import click

from runlease.cli import terminal as cli


@click.group()
def webhooks() -> None:
    """Completion webhooks: allowed hosts (admin), the signing key."""


@webhooks.command("hosts")
@cli.api_options
@click.option("--set", "hosts", multiple=True, metavar="HOST[:private][@PORT,...]",
              help="Make the allowlist exactly these hosts (repeatable; `*.example.com` for "
                   "subdomains; `:private` lets a host resolve to private addresses; "
                   "`@8080,8443` allows those ports beside 80 and 443).")
@click.option("--clear", is_flag=True, help="Allow no host.")
def hosts(api_url: str, token: str, as_json: bool, hosts: tuple[str, ...],
          clear: bool) -> None:
    """Show (or set, with --set or --clear) the hosts webhook URLs may name."""
    with cli.client(api_url, token) as api:
        given = [_host(h) for h in hosts]
        result: Any = api.webhook_hosts(given if hosts or clear else None)
    if as_json:
        cli.emit_json(result)
        return
    for h in result["hosts"]:
        note = "  (private addresses allowed)" if h["allow_private"] else ""
        ports = f"  ports 80, 443, {', '.join(map(str, h['ports']))}" if h.get("ports") else ""
        cli.console.print(f"{h['host']}{note}{ports}")


def _host(given: str) -> dict[str, Any]:
    host, _, ports = given.partition("@")
    try:
        numbers = [int(p) for p in ports.split(",") if p]
    except ValueError:
        raise click.BadParameter(f"{given!r}: ports are numbers, HOST@8080,8443") from None
    return {"host": host.removesuffix(":private"), "allow_private": host.endswith(":private"),
            "ports": numbers}


@webhooks.command("secret")
@cli.api_options
@click.option("--rotate", is_flag=True, help="Make a new key (deliveries use it from now on).")
@click.option("--tenant", "tenant_id", help="Admin only: whose key.")
def secret(api_url: str, token: str, as_json: bool, rotate: bool,
           tenant_id: str | None) -> None:
    """The key that signs your deliveries (Runlease-Signature, HMAC-SHA256)."""
    with cli.client(api_url, token) as api:
        key = api.webhook_secret(rotate=rotate, tenant_id=tenant_id)
    if as_json:
        cli.emit_json({"secret": key})
    else:
        click.echo(key)


@click.command("children")
@cli.api_options
@click.argument("run_id")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 500))
def children(api_url: str, token: str, as_json: bool, run_id: str, limit: int) -> None:
    """A run's child runs, newest first."""
    with cli.client(api_url, token) as api:
        page = api.list(parent_run_id=cli.run_id(api, run_id), limit=limit)
    if as_json:
        cli.emit_json(page)
    else:
        cli.runs_table(page.items)
