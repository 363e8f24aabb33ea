"""The retry policy options of `runlease runs submit`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def retry_options(command: F) -> F:
    """The retry policy of a submit: --backoff-base-s, --backoff-cap-s and
    --non-retryable (repeatable), passed on as the SDK's keywords."""
    wrapped: Any = command
    wrapped = click.option("--non-retryable", "non_retryable_codes", multiple=True,
                           help="An error code after which the run is dead at once "
                                "(repeatable).")(wrapped)
    wrapped = click.option("--backoff-cap-s", type=click.IntRange(0),
                           help="The longest wait between attempts (default 300).")(wrapped)
    return click.option("--backoff-base-s", type=click.IntRange(0),  # type: ignore[no-any-return]
                        help="Seconds before the first retry, doubling after (default 5)."
                        )(wrapped)


def retry_kwargs(backoff_base_s: int | None, backoff_cap_s: int | None,
                 non_retryable_codes: tuple[str, ...]) -> dict[str, Any]:
    return {"backoff_base_s": backoff_base_s, "backoff_cap_s": backoff_cap_s,
            "non_retryable_codes": list(non_retryable_codes) or None}
