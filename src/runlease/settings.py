"""Settings: one object per process kind, from options, then RUNLEASE_* env, then defaults.

Each setting is a dataclass field with its help text, unit in its name
(`lease_s`, `heartbeat_interval_s`) and bounds. The same declaration makes
the click options, reads the environment and renders the configuration
reference in docs/, so the three cannot drift. Everything is validated at
start, with a message that names the option and its environment variable.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import re
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

import click

from runlease.core.bounds import check_pool
from runlease.errors import SettingsError, ValidationError

ENV_PREFIX = "RUNLEASE_"
S = TypeVar("S")


def setting(
    default: Any = MISSING,
    help: str = "",  # noqa: A002 - the option's help text, as click names it
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    env: tuple[str, ...] = (),
) -> Any:
    """Declare one setting. `env` adds environment names besides RUNLEASE_<NAME>."""
    meta = {"help": help, "minimum": minimum, "maximum": maximum, "env": env}
    if default is MISSING:
        return field(metadata=meta)
    if isinstance(default, list | dict | set):
        raise TypeError("mutable defaults are not settings")
    return field(default=default, metadata=meta)


def env_names(name: str, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    return (ENV_PREFIX + name.upper(), *extra)


def option_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def _describe(name: str, extra: tuple[str, ...] = ()) -> str:
    return f"{option_name(name)} ({' or '.join(env_names(name, extra))})"


def _base_type(hint: Any) -> tuple[type, bool]:
    """(the type, whether None is allowed) of a field annotation."""
    if get_origin(hint) in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        return args[0], True
    return hint, False


def _bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {raw!r}")


def _parse(name: str, hint: Any, raw: Any, meta: Mapping[str, Any]) -> Any:
    base, optional = _base_type(hint)
    where = _describe(name, meta["env"])
    if raw is None or (optional and raw == ""):
        if optional:
            return None
        raise SettingsError(f"{where} is required")
    try:
        if get_origin(base) is tuple:
            # Comma-separated in the environment, and in each use of a
            # repeatable option too: --namespaces a,b means a and b.
            items = [raw] if isinstance(raw, str) else list(raw)
            parts = (p.strip() for item in items for p in str(item).split(","))
            return tuple(p for p in parts if p)
        if base is bool:
            return _bool(raw)
        if base is int:
            value: Any = int(raw)
        elif base is float:
            value = float(raw)
        else:
            value = str(raw)
    except ValueError as exc:
        raise SettingsError(f"{where}: {exc}") from None
    lo, hi = meta["minimum"], meta["maximum"]
    if lo is not None and value < lo:
        raise SettingsError(f"{where} must be at least {lo}, got {value}")
    if hi is not None and value > hi:
        raise SettingsError(f"{where} must be at most {hi}, got {value}")
    return value


def load(cls: type[S], given: Mapping[str, Any] | None = None,
         environ: Mapping[str, str] | None = None) -> S:
    """Build settings: an explicit value wins, then the environment, then the default."""
    given = given or {}
    environ = os.environ if environ is None else environ
    hints = get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        raw = given.get(f.name)
        if raw is None or raw == ():
            raw = next((environ[e] for e in env_names(f.name, f.metadata["env"])
                        if environ.get(e)), None)
        if raw is None:
            if f.default is not MISSING:
                values[f.name] = f.default
                continue
            raw = None
        values[f.name] = _parse(f.name, hints[f.name], raw, f.metadata)
    instance = cls(**values)
    check = getattr(instance, "check", None)
    if check is not None:
        check()
    return instance


def click_options(cls: type[Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Click options for every setting; values left unset fall through to env/default."""
    hints = get_type_hints(cls)

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for f in reversed(fields(cls)):
            base, _ = _base_type(hints[f.name])
            default = None if f.default is MISSING else f.default
            env = ", ".join(env_names(f.name, f.metadata["env"]))
            shown = "" if default in (None, ()) else f" [default: {default}]"
            help_text = f"{f.metadata['help']}{shown} [env: {env}]"
            if base is bool:
                flag = option_name(f.name)
                decl = f"{flag}/--no-{flag[2:]}"
                command = click.option(decl, f.name, default=None, help=help_text)(command)
            elif get_origin(base) is tuple:
                command = click.option(option_name(f.name), f.name, multiple=True,
                                       help=help_text)(command)
            else:
                command = click.option(option_name(f.name), f.name, default=None,
                                       type=base if base in (int, float) else str,
                                       help=help_text)(command)
        return command

    return decorate


def reference(cls: type[Any]) -> list[dict[str, Any]]:
    """The settings as rows for the configuration reference in docs/."""
    hints = get_type_hints(cls)
    rows = []
    for f in fields(cls):
        base, optional = _base_type(hints[f.name])
        rows.append({
            "option": option_name(f.name),
            "env": ", ".join(env_names(f.name, f.metadata["env"])),
            "type": getattr(base, "__name__", str(base)) + (" or unset" if optional else ""),
            "default": "(required)" if f.default is MISSING else f.default,
            "help": f.metadata["help"],
        })
    return rows


def import_object(spec: str, what: str = "agent") -> Any:
    """Import `module:attribute`, with a clear error naming what failed."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise SettingsError(f"{what} must look like module:callable, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SettingsError(f"cannot import {what} module {module_name!r}: {exc}") from None
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise SettingsError(f"{what} {spec!r}: {module_name} has no {attr!r}") from None
    return obj


def load_agent(spec: str, app_dir: str = ".") -> Any:
    """The --agent callable, imported with app_dir first on the path (as
    uvicorn's --app-dir: `runlease worker --agent mymodule:agent` works from
    the module's folder) and refused at start unless it is async."""
    where = _describe("agent")
    if app_dir and (path := os.path.abspath(app_dir)) not in sys.path:
        sys.path.insert(0, path)
    try:
        agent = import_object(spec)
    except SettingsError as exc:
        raise SettingsError(f"{where}: {exc} (searched {app_dir or 'nothing'!s} from "
                            f"--app-dir, then the installed packages)") from None
    if not (inspect.iscoroutinefunction(agent)
            or inspect.iscoroutinefunction(getattr(agent, "__call__", None))):  # noqa: B004
        raise SettingsError(f"{where}: {spec} is not an async function; an agent is "
                            "`async def agent(ctx): ...` (the worker awaits it)")
    return agent


@dataclass(frozen=True)
class WorkerSettings:
    """`runlease worker`: one per pod."""

    agent: str = setting(help="The agent to run, as module:callable (an async function "
                              "taking a RunContext).")
    app_dir: str = setting(".", "Folder put first on the import path before --agent is "
                                "imported (as uvicorn's --app-dir); '' adds none.")
    database_url: str | None = setting(
        None, "PostgreSQL URL for claims, heartbeats and agent writes.", env=("DATABASE_URL",))
    listen_database_url: str | None = setting(
        None, "Separate URL for the LISTEN session (a direct or session-mode PgBouncer "
              "URL when database_url goes through PgBouncer in transaction mode); "
              "defaults to database_url.")
    listen: bool = setting(True, "Wake on NOTIFY; with --no-listen the worker only polls.")
    prepared_statements: bool = setting(
        True, "Server-side prepared statements on pooled connections; turn off behind "
              "PgBouncer in transaction mode.")
    pool: str = setting("default", "The pool whose runs this worker claims.")
    concurrency: int = setting(10, "Runs executed at once (slots).", minimum=1, maximum=10_000)
    claim_batch: int | None = setting(
        None, "Most runs claimed in one statement; defaults to concurrency.", minimum=1,
        maximum=1000)
    lease_s: int = setting(
        0, "Lease length: a run whose worker stops renewing is reaped this long after the "
           "last renewal. 0 (the default): the pool's lease_s, read at start (the pool row "
           "is the one source; set it with the AgentRunPool, `runlease pools` or the API); "
           "any other value overrides the pool for this worker (tests, experiments).",
        minimum=0, maximum=3600)
    heartbeat_interval_s: float = setting(
        0.0, "Seconds between lease renewals; must be below lease_s / 2. 0 (the default): "
             "a third of the lease, at most 15 s.", minimum=0)
    fence_margin_s: float | None = setting(
        None, "Safety margin of self-fencing: a run is stopped when lease_s minus this "
              "has passed since its last renewal; defaults to min(5, lease_s / 5).",
        minimum=0.01)
    poll_interval_s: float = setting(
        2.0, "Seconds between claims when nothing is notified (jittered +-25%).",
        minimum=0.01, maximum=3600)
    cancel_grace_s: float = setting(
        10.0, "After a cancel request, how long the agent may take to stop before its "
              "task is cancelled.", minimum=0)
    tool_kill_grace_s: float = setting(
        5.0, "After SIGTERM to a tool's process group, how long before SIGKILL.", minimum=0)
    drain_grace_s: float = setting(
        25.0, "On SIGTERM, how long running runs may finish before they are cancelled and "
              "released; keep it below the pod's terminationGracePeriodSeconds.", minimum=0)
    reaper: bool = setting(True, "Take part in the leader election that runs the reaper "
                                 "and retention.")
    reaper_interval_s: float = setting(5.0, "Seconds between reaper passes of the leader.",
                                       minimum=0.05)
    leader_ttl_s: float = setting(
        15.0, "Leadership lapses this long after the leader's last renewal.", minimum=0.3)
    metrics_port: int = setting(9464, "Port of /metrics, /healthz and /readyz; 0 turns it off.",
                                minimum=0, maximum=65535)
    metrics_host: str = setting("0.0.0.0", "Address /metrics listens on.")
    log_json: bool = setting(False, "Log one JSON object per line.")
    redact_patterns: tuple[str, ...] = setting(
        (), "Extra regular expressions whose matches are redacted from stored error "
            "messages and events (comma-separated in the environment).")

    def check(self) -> None:
        if self.lease_s:
            self.check_lease()
        if self.reaper and self.leader_ttl_s <= self.reaper_interval_s / 2:
            raise SettingsError(f"{_describe('leader_ttl_s')} must be above half of "
                                "reaper_interval_s")
        for pattern in self.redact_patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise SettingsError(
                    f"{_describe('redact_patterns')}: {pattern!r}: {exc}") from None
        try:
            check_pool(self.pool)
        except ValidationError as exc:
            raise SettingsError(f"{_describe('pool')}: {exc.message}") from None
        load_agent(self.agent, self.app_dir)

    def with_pool_lease(self, pool_lease_s: int) -> WorkerSettings:
        """These settings with the lease resolved: lease_s 0 takes the pool's,
        heartbeat_interval_s 0 a third of the lease (at most 15 s); checked."""
        lease_s = self.lease_s or pool_lease_s
        heartbeat = self.heartbeat_interval_s or min(15.0, lease_s / 3)
        resolved = dataclasses.replace(self, lease_s=lease_s, heartbeat_interval_s=heartbeat)
        resolved.check_lease()
        return resolved

    def check_lease(self) -> None:
        heartbeat = self.heartbeat_interval_s or min(15.0, self.lease_s / 3)
        if heartbeat >= self.lease_s / 2:
            raise SettingsError(
                f"{_describe('heartbeat_interval_s')} must be below half of lease_s "
                f"({self.lease_s} s): got {heartbeat}; a lease must survive "
                "a missed renewal"
            )
        if self.margin_s >= self.lease_s - heartbeat:
            raise SettingsError(
                f"{_describe('fence_margin_s')} must be below lease_s - heartbeat_interval_s "
                f"({self.lease_s - heartbeat:g} s): got {self.margin_s}"
            )

    @property
    def margin_s(self) -> float:
        return self.fence_margin_s if self.fence_margin_s is not None else min(5.0,
                                                                                self.lease_s / 5)

    @property
    def batch(self) -> int:
        return min(self.claim_batch or self.concurrency, self.concurrency)


@dataclass(frozen=True)
class ApiSettings:
    """`runlease api`: the HTTP control plane."""

    database_url: str | None = setting(
        None, "PostgreSQL URL.", env=("DATABASE_URL",))
    listen_database_url: str | None = setting(
        None, "Separate URL for the LISTEN session that follows event streams; defaults "
              "to database_url.")
    prepared_statements: bool = setting(True, "Server-side prepared statements.")
    host: str = setting("127.0.0.1", "Address to listen on.")
    port: int = setting(8080, "Port to listen on.", minimum=0, maximum=65535)
    tokens: str | None = setting(
        None, "Tenant tokens as tenant=token pairs, comma-separated; a token may be given "
              "as sha256:<hex> so the secret itself is not in the configuration.")
    admin_tokens: tuple[str, ...] = setting(
        (), "Admin tokens (comma-separated; sha256:<hex> allowed).")
    tokens_file: str | None = setting(
        None, "A file of tokens, one per line: `<tenant> <token>` or `admin <token>`; "
              "# starts a comment.")
    stream_token_secret: str | None = setting(
        None, "Key that signs short-lived event-stream tokens; set the same on every "
              "replica (a random one is made at start otherwise).")
    stream_token_ttl_s: int = setting(300, "Lifetime of an event-stream token.", minimum=10,
                                      maximum=86_400)
    cors_origins: tuple[str, ...] = setting(
        (), "Origins allowed by CORS (comma-separated), for browsers on other origins.")
    max_request_bytes: int = setting(1024 * 1024, "Largest request body accepted.",
                                     minimum=1024, maximum=64 * 1024 * 1024)
    max_input_bytes: int = setting(256 * 1024, "Largest run input (JSON) accepted.",
                                   minimum=2, maximum=16 * 1024 * 1024)
    sse_keepalive_s: float = setting(15.0, "Seconds between keepalive comments on an idle "
                                           "event stream.", minimum=0.1)
    sse_poll_s: float = setting(1.0, "Event streams also poll this often, in case a "
                                     "NOTIFY is lost.", minimum=0.05)
    log_json: bool = setting(False, "Log one JSON object per line.")

    def check(self) -> None:
        if self.max_input_bytes > self.max_request_bytes:
            raise SettingsError(f"{_describe('max_input_bytes')} must not exceed "
                                "max_request_bytes")


@dataclass(frozen=True)
class OperatorSettings:
    """`runlease operator`: AgentRunPools -> workers; hosts the reaper too."""

    database_url: str | None = setting(
        None, "PostgreSQL URL the operator's reaper serves; pools name their own database "
              "through a Secret.", env=("DATABASE_URL",))
    namespaces: tuple[str, ...] = setting(
        (), "Namespaces to watch (comma-separated); see --all-namespaces.")
    all_namespaces: bool = setting(False, "Watch every namespace (cluster-wide).")
    standalone: bool = setting(
        False, "Run without kopf peering (a single replica, or tests). With peering, "
               "replicas elect one active operator by priority; the others stand by.")
    peering_name: str = setting("runlease", "The kopf peering object replicas share.")
    priority: int | None = setting(
        None, "This replica's peering priority; random when unset, so replicas differ.",
        minimum=0, maximum=2**31 - 1)
    interval_s: float = setting(10.0, "Seconds between a pool's status, drift and "
                                      "autoscaling passes.", minimum=0.1, maximum=3600)
    lease_window_s: float = setting(300.0, "The window of the lease-health condition: "
                                           "expiries in the last this many seconds.",
                                    minimum=1)
    reaper: bool = setting(True, "Take part in the reaper's leader election.")
    reaper_interval_s: float = setting(5.0, "Seconds between reaper passes of the leader.",
                                       minimum=0.05)
    leader_ttl_s: float = setting(15.0, "Leadership lapses this long after the last "
                                        "renewal.", minimum=0.3)
    metrics_port: int = setting(9465, "Port of /metrics, /healthz and /readyz; 0 turns it "
                                      "off.", minimum=0, maximum=65535)
    metrics_host: str = setting("0.0.0.0", "Address /metrics listens on.")
    log_json: bool = setting(False, "Log one JSON object per line.")

    def check(self) -> None:
        if self.all_namespaces and self.namespaces:
            raise SettingsError(f"{_describe('namespaces')} and --all-namespaces exclude "
                                "each other")
        if not self.all_namespaces and not self.namespaces:
            raise SettingsError(f"name the namespaces to watch ({_describe('namespaces')}) "
                                "or pass --all-namespaces")
