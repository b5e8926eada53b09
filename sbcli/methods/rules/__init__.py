"""Inference rules, one file each, registered by name (:mod:`sbcli.methods.rules.rule` says what a rule is).

Imported explicitly so the registry is complete; torch-free at import.
"""

from sbcli.methods.rules import bic, icarl, lda, nme, none, prototype, ridge, wa  # noqa: F401  (registration)
from sbcli.methods.rules.rule import RULES, InferenceRule, register_rule


def rules_help() -> str:
    """The ``--inference`` help: every offered registered rule with its summary, by name (a new rule is its
    file and its name in the import above: no list to keep beside them)."""
    rules = [RULES.get(name) for name in RULES.names()]
    return "Inference rule: " + ", ".join(f"{r.name} ({r.summary})" for r in rules if r.offered)


__all__ = ["RULES", "InferenceRule", "register_rule", "rules_help"]
