"""The settings mechanism: declare a setting once; load it from options, then
RUNLEASE_* env, then defaults; render it as click options and as docs.

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
import types
from collections.abc import Callable, Mapping
from dataclasses import MISSING, field, fields
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

import click

from runlease.errors import SettingsError

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


def describe(name: str, extra: tuple[str, ...] = ()) -> str:
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
    where = describe(name, meta["env"])
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
    if values.get("database_url_file"):
        values["database_url"] = _read_url_file(values)
    instance = cls(**values)
    check = getattr(instance, "check", None)
    if check is not None:
        check()
    return instance


def _read_url_file(values: Mapping[str, Any]) -> str:
    """--database-url-file: the URL from a file (a mounted Secret), so it is on
    no command line and in no environment a child could inherit."""
    path = values["database_url_file"]
    where = describe("database_url_file")
    if values.get("database_url"):
        raise SettingsError(f"{where} and {describe('database_url')} exclude each other")
    try:
        with open(path) as f:
            url = f.read().strip()
    except OSError as exc:
        raise SettingsError(f"{where}: {path}: {exc.strerror or exc}") from None
    if not url:
        raise SettingsError(f"{where}: {path} is empty")
    return url


def shown_fields(cls: type[Any]) -> list[dataclasses.Field[Any]]:
    """The settings in the order --help and the docs list them: the process's
    own first, then those it shares (the reaper's)."""
    own = inspect.get_annotations(cls)
    return sorted(fields(cls), key=lambda f: f.name not in own)


def click_options(cls: type[Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Click options for every setting; values left unset fall through to env/default."""
    hints = get_type_hints(cls)

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for f in reversed(shown_fields(cls)):
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
    for f in shown_fields(cls):
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
