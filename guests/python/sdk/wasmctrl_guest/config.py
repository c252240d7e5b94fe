"""The plugin's own configuration: its name and its ``[settings]`` table (the same JSON
``init`` receives)."""

from __future__ import annotations

from typing import Any, Dict

from wit_world.imports import config as _wit

from .objects import decode


def plugin_name() -> str:
    """The plugin's name (its TOML's ``name``)."""
    return _wit.plugin_name()


def settings() -> Dict[str, Any]:
    """The ``[settings]`` table as a dict."""
    return decode(_wit.settings())
