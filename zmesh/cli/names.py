"""Click callbacks that check a topic or group name given to a command before it runs
(a node would find nothing under a name no topic or group can have)."""

from __future__ import annotations

from typing import Any

import click

from .._subjects import check_subject
from ..config import check_name
from ..errors import ConfigError


def topic_name(_ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
    """A topic's name, as given (None: none given); bad usage otherwise."""
    return _topic(value, False)


def topic_or_pattern(_ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
    """A topic's name or a pattern, as given (None: none given); bad usage otherwise."""
    return _topic(value, True)


def _topic(value: Any, patterns: bool) -> Any:
    if value is None:
        return None
    try:
        return check_subject("topic", value, wildcards=patterns)
    except ConfigError as exc:
        if ":" in value:  # (an address where the topic goes)
            raise click.BadParameter(
                f"{value!r} looks like a node's address, not a topic"
            ) from None
        raise click.BadParameter(str(exc)) from None


def group_name(_ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
    """A group's name, as given (None: none given); bad usage otherwise."""
    if value is None:
        return None
    try:
        return check_name("group", value)
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from None
