"""What a tool process may see of the worker's environment: almost nothing.

A tool is a command a model chose, so it is treated as hostile. Its
environment is built from scratch for every call:

    allowlist   PATH, HOME, LANG, LANGUAGE, LC_*, TZ, TMPDIR, taken from the
                environment the worker started with
    run         RUNLEASE_RUN_ID, RUNLEASE_ATTEMPT, RUNLEASE_LEASE_EPOCH (set by
                the worker) and RUNLEASE_STEP (when the agent passes it)
    grant       the names the pool grants (`tool_env`), taken from the worker's
                start environment; the database URL variables cannot be granted
    explicit    what the agent code passes as `env`, with two exceptions:
                - an entry that merely repeats the worker's own environment
                  (same name, same value: `env=dict(os.environ)`) adds nothing
                  that the allowlist and the grant did not already decide;
                - an entry on the deny side never passes: a name of the
                  worker's own secrets or configuration (RUNLEASE_*, every
                  setting's variable such as DATABASE_URL, and each
                  secret-looking variable the worker was started with), or a
                  value that contains one of the worker's secret values.

`seal()` runs once at worker start: it records the start environment (the
OpenAI agent reads its key from it), removes the worker's secrets from
`os.environ` so that no child process can inherit them whatever spawns it,
and makes the process non-dumpable so that a process of the same uid cannot
read the worker's start environment through /proc/<pid>/environ.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields

from runlease.settings import WorkerSettings, env_names

log = logging.getLogger(__name__)

ALLOWED = frozenset({"PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR"})
ALLOWED_PREFIXES = ("LC_",)
RUN_VARS = frozenset({"RUNLEASE_RUN_ID", "RUNLEASE_STEP", "RUNLEASE_ATTEMPT",
                      "RUNLEASE_LEASE_EPOCH"})
# Names whose value is a credential in every deployment we know of.
SECRET_NAME = re.compile(
    r"KEY|TOKEN|SECRET|PASSW|PASSPHRASE|CREDENTIAL|PRIVATE|COOKIE|SESSION|DSN|DATABASE_URL"
    r"|(^|_)AUTH(_|$)|AUTHORIZATION|(^|_)PASS(_|$)", re.IGNORECASE)
# libpq reads these on every (re)connect of the worker's own pool: they stay in
# the worker's os.environ (tools still never get them: they are on the deny side).
LIBPQ_PREFIX = "PG"
# A shorter value is too likely to occur by chance to refuse text containing it.
SECRET_VALUE_MIN_CHARS = 8
PR_SET_DUMPABLE = 4
# The variables that carry the worker's database: never grantable to a tool.
DATABASE_VARS = frozenset(
    name for f in fields(WorkerSettings) if f.name.endswith("database_url")
    for name in env_names(f.name, f.metadata["env"]))
SETTING_VARS = frozenset(name for f in fields(WorkerSettings)
                         for name in env_names(f.name, f.metadata["env"]))


@dataclass(frozen=True)
class _Sealed:
    environ: Mapping[str, str]
    deny_names: frozenset[str]
    secrets: frozenset[str]  # values
    database: frozenset[str]  # the database URLs: secret even when granted


_sealed: _Sealed | None = None


def is_runlease_name(name: str) -> bool:
    """RUNLEASE_* is the worker's configuration, but for the run variables."""
    return name.startswith("RUNLEASE_") and name not in RUN_VARS


def is_worker_name(name: str) -> bool:
    """A variable of the worker's own configuration or secrets."""
    return is_runlease_name(name) or name in SETTING_VARS or bool(SECRET_NAME.search(name))


def _long(values: Iterable[str | None]) -> frozenset[str]:
    return frozenset(v for v in values if v and len(v) >= SECRET_VALUE_MIN_CHARS)


def _classify(environ: Mapping[str, str], database_urls: Iterable[str | None]) -> _Sealed:
    deny = frozenset(name for name in environ if is_worker_name(name)) | SETTING_VARS
    database = _long([*database_urls, *(environ.get(name) for name in DATABASE_VARS)])
    secrets = _long(value for name, value in environ.items() if SECRET_NAME.search(name))
    return _Sealed(dict(environ), deny, secrets | database, database)


def seal(database_urls: Iterable[str | None] = ()) -> None:
    """At worker start: remember the environment, take the worker's secrets
    out of os.environ, and make the process non-dumpable. `database_urls` are
    the worker's own, which may not have come from the environment
    (--database-url)."""
    global _sealed
    if _sealed is None:
        _sealed = _classify(os.environ, database_urls)
    else:  # a second Worker in one process: add its URLs, keep the first record
        more = _long(database_urls)
        _sealed = _Sealed(_sealed.environ, _sealed.deny_names, _sealed.secrets | more,
                          _sealed.database | more)
    removed = [name for name in list(os.environ)
               if name in _sealed.deny_names and not name.startswith(LIBPQ_PREFIX)]
    for name in removed:
        del os.environ[name]
    dumpable = non_dumpable()
    log.info("worker_environ_sealed removed=%d non_dumpable=%s", len(removed), dumpable)


def non_dumpable() -> bool:
    """/proc/<pid>/environ still holds the start environment (unsetenv does not
    erase it): a non-dumpable process's /proc files can be read by root only."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
    except (OSError, AttributeError):  # not Linux
        return False


def worker_environ() -> Mapping[str, str]:
    """The environment the worker started with (os.environ until sealed):
    where agents read their own settings, such as a model key."""
    return _sealed.environ if _sealed is not None else os.environ


def _state() -> _Sealed:
    return _sealed if _sealed is not None else _classify(os.environ, ())


_warned: set[frozenset[str]] = set()


def check_grant(grant: Iterable[str]) -> frozenset[str]:
    """The granted names a tool may get: the database URL variables are refused
    (logged once per grant, not once per run)."""
    names = frozenset(grant)
    refused = names & DATABASE_VARS
    if refused and refused not in _warned:
        _warned.add(refused)
        log.warning("tool_env_grant_refused names=%s: the worker's database URL is never "
                    "given to tools", ",".join(sorted(refused)))
    return names - refused


def build(
    explicit: Mapping[str, str] | None,
    *,
    grant: frozenset[str] = frozenset(),
    run_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of one tool process (see the module docstring)."""
    state = _state()
    start = state.environ
    grant = frozenset(name for name in grant - DATABASE_VARS
                      if not any(url in start.get(name, "") for url in state.database))
    granted_values = {start[name] for name in grant if name in start}
    secrets = [s for s in state.secrets if s not in granted_values or s in state.database]
    env = {name: value for name, value in start.items()
           if name in ALLOWED or name.startswith(ALLOWED_PREFIXES) or name in grant}
    env.update(run_env or {})
    refused = []
    for name, value in (explicit or {}).items():
        if name not in grant and start.get(name) == value:
            continue  # the worker's own environment, passed along: decided above
        denied = name in state.deny_names or is_runlease_name(name)
        if (denied and name not in grant) or any(s in value for s in secrets):
            refused.append(name)
            continue
        env[name] = value
    if refused:
        log.warning("tool_env_refused names=%s: the worker's secrets and settings are not "
                    "passed to tools", ",".join(sorted(refused)))
    return env


def run_vars(run_id: object, attempt: int, lease_epoch: int) -> dict[str, str]:
    """What every tool of an attempt is told about it."""
    return {"RUNLEASE_RUN_ID": str(run_id), "RUNLEASE_ATTEMPT": str(attempt),
            "RUNLEASE_LEASE_EPOCH": str(lease_epoch)}
