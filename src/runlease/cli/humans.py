"""`runlease runs input|message|messages|rerun`: people and runs (issue 28).

    runlease runs input <id>                             what the run asks
    runlease runs input <id> --name approve --value true answer it
    runlease runs message <id> "use the staging cluster" into its inbox
    runlease runs messages <id>                          its inbox
    runlease runs rerun <id> --from-step 2               again, steps before 2 copied
"""

from __future__ import annotations

import json
from typing import Any

import click

from runlease.cli import output as printing
from runlease.cli.runs import runs
from runlease.cli.terminal import api_options, client, emit_json, out
from runlease.cli.terminal import run_id as terminal_run_id


def _json_value(text: str) -> Any:
    """--value as JSON (true, 3, {"a": 1}); any other text is a string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _json_object(text: str | None, option: str) -> dict[str, Any] | None:
    """An option's JSON object (None when not given); a usage error otherwise."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint=option) from None
    if not isinstance(value, dict):
        raise click.BadParameter("must be a JSON object", param_hint=option)
    return value


INPUT_COLUMNS = (
    printing.Column("NAME", lambda r: r["name"]),
    printing.Column("OPEN", lambda r: "yes" if r["open"] else "no"),
    printing.Column("OUTCOME", lambda r: r["outcome"]),
    printing.Column("PROMPT", lambda r: (r["prompt"] or "")[:80]),
    printing.Column("TIMEOUT", lambda r: r["timeout_at"]),
    printing.Column("RESUME URL", lambda r: r.get("resume_url")),
)


@runs.command("input")
@api_options
@click.argument("run_id")
@click.option("--name", help="Answer the request of this name (with --value).")
@click.option("--value", help="The answer: JSON (true, 3, {\"a\": 1}), else a string.")
def give_input(api_url: str, token: str, as_json: bool, run_id: str, name: str | None,
               value: str | None) -> None:
    """What a waiting run asks (with single-use resume links), or with
    --name and --value, the answer: the run resumes with it, once."""
    if (name is None) != (value is None):
        raise click.UsageError("give --name and --value together")
    with client(api_url, token) as api:
        rid = terminal_run_id(api, run_id)
        if name is None:
            requests = api.input_requests(rid)
            if as_json:
                emit_json(requests)
            elif requests:
                printing.table(requests, INPUT_COLUMNS)
            else:
                out("The run has asked for no input.")
            return
        assert value is not None
        answered = api.give_input(rid, name, _json_value(value))
    if as_json:
        emit_json(answered)
    elif answered["resumed"]:
        out(f"Answered {name!r}: run {rid} resumes.")
    else:
        out(f"{name!r} already had this answer: nothing changed.")


@runs.command("message")
@api_options
@click.argument("run_id")
@click.argument("text")
@click.option("--data", help="A JSON object sent with the text.")
def message(api_url: str, token: str, as_json: bool, run_id: str, text: str,
            data: str | None) -> None:
    """Send a running run a message: its agent gets it at its next turn. A
    run waiting for free-text input takes it as the answer and resumes."""
    extra = _json_object(data, "--data")
    with client(api_url, token) as api:
        rid = terminal_run_id(api, run_id)
        sent = api.send_message(rid, text, extra)
    if as_json:
        emit_json(sent)
    elif sent.get("answered_input"):
        out(f"Answered the run's request {sent['answered_input']!r}: it resumes.")
    else:
        out(f"Sent as message {sent['seq']} of run {rid}.")


MESSAGE_COLUMNS = (
    printing.Column("SEQ", lambda m: m["seq"]),
    printing.Column("SENT", lambda m: m["sent_at"]),
    printing.Column("TAKEN", lambda m: "yes" if m["taken"] else "no"),
    printing.Column("TEXT", lambda m: m["text"][:100]),
)


@runs.command("messages")
@api_options
@click.argument("run_id")
@click.option("--after", default=0, show_default=True, help="After this seq.")
def messages(api_url: str, token: str, as_json: bool, run_id: str, after: int) -> None:
    """A run's inbox: each message, and whether its agent took it."""
    with client(api_url, token) as api:
        items = api.messages(terminal_run_id(api, run_id), after=after)
    if as_json:
        emit_json(items)
    elif items:
        printing.table(items, MESSAGE_COLUMNS)
    else:
        out("No messages.")


@runs.command("rerun")
@api_options
@click.argument("run_id")
@click.option("--from-step", help="Copy the steps committed before this step (all, if it "
                                  "never committed); without it the run starts over.")
@click.option("--input", "input_json", help="A new input, a JSON object.")
def rerun(api_url: str, token: str, as_json: bool, run_id: str, from_step: str | None,
          input_json: str | None) -> None:
    """Run a run again as a new run (same tenant, pool and thread)."""
    new_input = _json_object(input_json, "--input")
    with client(api_url, token) as api:
        run = api.rerun(terminal_run_id(api, run_id), from_step=from_step, input=new_input)
    if as_json:
        emit_json(run)
    else:
        out(f"Rerun {run.id} of {run.rerun_of} submitted.")
