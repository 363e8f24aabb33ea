"""The methods both clients share, each sending a call of `calls.py` (mixed
into Client and AsyncClient; each gives `_send`, and a coroutine's for the
async one)."""

from __future__ import annotations

from runlease.client.calls import Calls, sends


class RunMethods:
    submit = sends(Calls.submit)
    get = sends(Calls.get)
    list = sends(Calls.list)
    cancel = sends(Calls.cancel)
    steps = sends(Calls.steps)
    give_input = sends(Calls.give_input)
    input_requests = sends(Calls.input_requests)
    send_message = sends(Calls.send_message)
    messages = sends(Calls.messages)
    rerun = sends(Calls.rerun)
    thread = sends(Calls.thread)
    thread_runs = sends(Calls.thread_runs)

    # -- admin ------------------------------------------------------------------------------

    dead_letters = sends(Calls.dead_letters)
    redrive = sends(Calls.redrive)
    webhook = sends(Calls.webhook)
    webhook_hosts = sends(Calls.webhook_hosts)
    webhook_secret = sends(Calls.webhook_secret)
    usage = sends(Calls.usage)
    key_limits = sends(Calls.key_limits)
    set_key_limits = sends(Calls.set_key_limits)
