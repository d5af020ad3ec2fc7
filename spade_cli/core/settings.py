"""One declaration per setting: a stage's config dataclass is where each of its settings is declared.

A field made with ``setting(default, help, ...)`` carries its help text, its help panel and its
option's bounds beside its default, and the command line is built from the dataclass
(``spade_cli.cli.config_options``), as TRL builds its CLI from ``GRPOConfig``'s field metadata. So a
setting has one name everywhere: the field ``tis`` is the flag ``--tis/--no-tis``, the ``--config``
key ``tis:`` and the manifest's ``config.tis``. Fixed choices are ``Literal`` types, which help lists
and click checks. A field made without ``setting`` (or with ``help=None``) is fixed in code and has
no option. This module only describes; it imports nothing of the command line.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any, Literal


def setting(default: Any = dataclasses.MISSING, help: str | None = "", *, panel: str | None = None,
            factory: Callable[[], Any] | None = None, required: bool = False, **option: Any) -> Any:
    """A dataclass field that is also a command-line option.

    ``panel``: the help panel it is listed under. ``required``: the command asks for it even though
    library callers get the default. ``option``: passed to ``typer.Option`` (``min``, ``max``,
    ``file_okay``, ``metavar``...). ``factory``: a ``default_factory`` (a list option's ``[]``).
    """
    meta = {"help": help, "panel": panel, "required": required, "option": option}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def declared(config: type) -> list[dataclasses.Field]:
    """The fields of ``config`` that are options, in declaration order."""
    return [f for f in dataclasses.fields(config) if f.metadata.get("help") is not None]


def default_of(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def outside_choices(cfg: Any) -> str | None:
    """The first setting of ``cfg`` whose value is not among its ``Literal`` choices, as a sentence.

    The command line refuses such a value itself (a usage error); this is for library callers.
    """
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        allowed = typing.get_args(hints[f.name]) if typing.get_origin(hints[f.name]) is Literal else ()
        value = getattr(cfg, f.name)
        if allowed and value not in allowed:
            return f"{f.name} must be one of {', '.join(map(str, allowed))}, got {value!r}"
    return None
