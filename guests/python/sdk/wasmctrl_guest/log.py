"""Structured logs into the host's tracing, tagged with the plugin's name and the request
being reconciled: ``log.info("mirrored default/x", created="team-a")``.

Field values that are not strings are written as JSON (lists of strings comma-joined).
"""

from __future__ import annotations

import json
from typing import Any

from wit_world.imports import log as _wit

_LEVELS = {
    "trace": _wit.Level.TRACE,
    "debug": _wit.Level.DEBUG,
    "info": _wit.Level.INFO,
    "warn": _wit.Level.WARN,
    "error": _wit.Level.ERROR,
}


def _text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, BaseException):
        return str(v)
    if isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
        return ",".join(v)
    try:
        return json.dumps(v)
    except (TypeError, ValueError):
        return repr(v)


def enabled(level: str) -> bool:
    """Whether a line at ``level`` would be recorded (skip building costly messages)."""
    return _wit.enabled(_LEVELS[level])


def log(level: str, message: str, **fields: Any) -> None:
    """Logs ``message`` at ``level`` (trace, debug, info, warn, error) with ``fields``."""
    _wit.log(_LEVELS[level], message, [(k, _text(v)) for k, v in fields.items()])


def trace(message: str, **fields: Any) -> None:
    log("trace", message, **fields)


def debug(message: str, **fields: Any) -> None:
    log("debug", message, **fields)


def info(message: str, **fields: Any) -> None:
    log("info", message, **fields)


def warn(message: str, **fields: Any) -> None:
    log("warn", message, **fields)


def error(message: str, **fields: Any) -> None:
    log("error", message, **fields)
