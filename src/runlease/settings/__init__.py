"""Settings: one object per process kind, from options, then RUNLEASE_* env, then defaults.

    mechanism.py  declare a setting; load, click options, docs reference
    reaper.py     the leader-election fields the worker and operator share
    worker.py, api.py, operator.py   one process's fields each
"""

from __future__ import annotations

from runlease.settings.api import ApiSettings
from runlease.settings.mechanism import (
    ENV_PREFIX,
    click_options,
    describe,
    env_names,
    import_object,
    load,
    option_name,
    reference,
    setting,
)
from runlease.settings.operator import OperatorSettings
from runlease.settings.reaper import ReaperSettings
from runlease.settings.worker import WorkerSettings

__all__ = [
    "ENV_PREFIX",
    "ApiSettings",
    "OperatorSettings",
    "ReaperSettings",
    "WorkerSettings",
    "click_options",
    "describe",
    "env_names",
    "import_object",
    "load",
    "option_name",
    "reference",
    "setting",
]
