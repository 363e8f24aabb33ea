"""`runlease usage`: tokens and cost by tenant, pool or day (GET /v1/usage)."""

from __future__ import annotations

from datetime import datetime

import click

from runlease.cli import output as printing
from runlease.cli import terminal as cli


@click.command("usage")
@cli.api_options
@click.option("--from", "start", type=click.DateTime(["%Y-%m-%d"]),
              help="First UTC day [default: --to].")
@click.option("--to", "end", type=click.DateTime(["%Y-%m-%d"]),
              help="Last UTC day, inclusive [default: today].")
@click.option("--group-by", type=click.Choice(["day", "tenant", "pool"]), default="day",
              show_default=True)
@click.option("--tenant", "tenant_id", help="Admin only: one tenant's usage.")
@click.option("--pool")
def usage(api_url: str, token: str, as_json: bool, start: datetime | None,
          end: datetime | None, group_by: str, tenant_id: str | None,
          pool: str | None) -> None:
    """Model usage the agents reported, summed by day, tenant or pool. A
    tenant's token shows its own usage only."""
    with cli.client(api_url, token) as api:
        report = api.usage(start=start.date() if start else None,
                           end=end.date() if end else None, group_by=group_by,
                           tenant_id=tenant_id, pool=pool)
    if as_json:
        cli.emit_json(report)
        return
    click.echo(f"usage {report['from']} .. {report['to']} by {group_by}", err=True)
    printing.table(report["items"], (
        printing.Column(group_by.upper(), lambda i: i["key"]),
        printing.Column("INPUT TOKENS", lambda i: i["input_tokens"]),
        printing.Column("OUTPUT TOKENS", lambda i: i["output_tokens"]),
        printing.Column("COST", lambda i: f"{i['cost']:.6g}"),
        printing.Column("REPORTS", lambda i: i["records"])))
