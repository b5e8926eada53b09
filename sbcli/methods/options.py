"""The `sb train` options of the registered methods, read from their ``Config`` fields (torch-free).

Every field of a method's ``Config`` declared with :func:`sbcli.methods.base.option` is an option
``--NAME`` (a bool one ``--NAME/--no-NAME``) whose help is the field's help and whose default is
stated per method where methods differ (``wa for dd, sb, std; none for finetune, joint``). Fields
that several methods share are one option. Fields declared ``together`` are one comma-separated
option (``--phase-epochs A,B,C``). A new method's options appear by registering it.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Optional

from sbcli.defaults import show
from sbcli.errors import ConfigError
from sbcli.methods.base import METHODS
from sbcli.methods.rules import rules_help


@dataclass(frozen=True)
class MethodOption:
    """One option of `sb train` that sets method fields."""

    name: str  # the parameter and recipe key: a field's name, or the ``together`` name
    flags: tuple[str, ...]
    type: Any
    help: str
    fields: tuple[str, ...]  # the Config fields it sets
    defaults: dict[str, Any]  # per method that takes it: the field's default (a tuple for ``together``)
    default_texts: dict[str, str]  # per method: the default as the help states it


def _flag(name: str, kind: Any) -> tuple[str, ...]:
    dashed = name.replace("_", "-")
    return (f"--{dashed}/--no-{dashed}",) if kind is bool else (f"--{dashed}",)


def _base_type(hint: Any) -> Any:
    """``float | None`` -> ``float``."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def _fields() -> dict[str, list[tuple[str, dataclasses.Field, Any]]]:
    """Field name -> [(method, field, type)] over every registered method, in registry order."""
    found: dict[str, list[tuple[str, dataclasses.Field, Any]]] = {}
    for method in METHODS.names():
        config = METHODS.get(method).config
        hints = typing.get_type_hints(config)
        for f in dataclasses.fields(config):
            found.setdefault(f.name, []).append((method, f, hints[f.name]))
    return found


def _grouped(per_method: dict[str, str]) -> list[tuple[str, list[str]]]:
    groups: dict[str, list[str]] = {}
    for method, text in per_method.items():
        groups.setdefault(text, []).append(method)
    return list(groups.items())


def _or(rules: str) -> str:
    """``wa, none`` as ``wa or none``."""
    head, _, last = rules.rpartition(", ")
    return f"{head} or {last}" if head else last


def _help(per_method: dict[str, str]) -> str:
    """One help text, prefixed with the methods that take the option unless every method does."""
    groups = _grouped(per_method)
    if len(groups) == 1 and len(groups[0][1]) == len(METHODS.names()):
        return groups[0][0]
    return " ".join(f"{', '.join(methods)}: {text}" for text, methods in groups)


def default_statement(option: MethodOption) -> str:
    """``1`` or ``wa for dd, sb, std; none for finetune, joint``."""
    groups = _grouped(option.default_texts)
    if len(groups) == 1:
        return groups[0][0]
    return "; ".join(f"{text} for {', '.join(methods)}" for text, methods in groups)


def method_options() -> list[MethodOption]:
    """Every method option of `sb train`, in the order of the first method that declares each."""
    options: dict[str, MethodOption] = {}
    together: dict[str, list[tuple[str, dataclasses.Field, Any]]] = {}
    for name, owners in _fields().items():
        meta = owners[0][1].metadata  # a field declared without option(): offered all the same, its help empty
        if meta.get("together"):
            together.setdefault(meta["together"], []).extend(owners)
            continue
        kind = _base_type(owners[0][2])
        helps = {m: f.metadata.get("help", "") for m, f, _ in owners}
        if name == "inference":  # every rule registered by now (a method's own file may add one), then each method's
            helps = {m: f"{rules_help()}; " + "; ".join(f"{', '.join(ms)} take{'s' if len(ms) == 1 else ''} {_or(rules)}" for rules, ms in
                                                   _grouped({m: ", ".join(METHODS.get(m).inferences) for m in helps}))
                     + "." for m in helps}
        texts = {m: f.metadata.get("default_text") or show(f.default) for m, f, _ in owners}
        options[name] = MethodOption(name, _flag(name, kind), Optional[kind], _help(helps),
                                     (name,), {m: f.default for m, f, _ in owners}, texts)
    for name, owners in together.items():
        fields = tuple(dict.fromkeys(f.name for _, f, _ in owners))
        first = {m: f for m, f, _ in owners if f.name == fields[0]}
        texts = {m: f.metadata.get("default_text") or show(f.default) for m, f in first.items()}
        options[name] = MethodOption(name, _flag(name, str), Optional[str],
                                     _help({m: f.metadata["help"] for m, f in first.items()}), fields,
                                     {m: tuple(None for _ in fields) for m in first}, texts)
    return list(options.values())


def together_fields() -> dict[str, tuple[str, ...]]:
    """Options that give several fields at once (``phase_epochs``: ``epochs_a``, ``epochs_b``, ``epochs_c``)."""
    return {o.name: o.fields for o in method_options() if o.fields != (o.name,)}


def split_together(name: str, value: Any) -> dict[str, int]:
    """``--phase-epochs 4,3,3`` as ``{"epochs_a": 4, "epochs_b": 3, "epochs_c": 3}`` (None: nothing given).

    Raises:
        ConfigError: not one whole number per field.
    """
    fields = together_fields()[name]
    if value is None:
        return {}
    parts = [p.strip() for p in str(value).split(",")]
    if len(parts) != len(fields) or not all(p.isdigit() for p in parts):
        example = ",".join(["200"] * len(fields))
        raise ConfigError(f"--{name.replace('_', '-')} takes {len(fields)} whole numbers separated by commas, "
                          f"e.g. {example}.")
    return dict(zip(fields, map(int, parts), strict=True))


def markdown() -> str:
    """The method options as docs/cli.md lists them: option, methods, help, default."""
    lines = ["| option | methods | what it does | default |", "|---|---|---|---|"]
    for o in method_options():
        flag = o.flags[0].split("/")[0] + ("/--no-" + o.flags[0].split("/--no-")[1] if "/" in o.flags[0] else "")
        help_text = o.help.split(": ", 1)[1] if o.help.split(": ", 1)[0] == ", ".join(o.defaults) else o.help
        lines.append(f"| `{flag}` | {', '.join(o.defaults)} | {help_text} | {default_statement(o)} |")
    return "\n".join(lines)
