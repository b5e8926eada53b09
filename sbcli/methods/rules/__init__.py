"""Inference rules, one file each, registered by name (:mod:`sbcli.methods.rules.rule` says what a rule is).

Imported explicitly so the registry is complete; torch-free at import.
"""

from sbcli.methods.rules import bic, icarl, lda, nme, none, prototype, ridge, wa  # noqa: F401  (registration)
from sbcli.methods.rules.rule import RULES, InferenceRule, register_rule

ORDER = ("wa", "none", "bic", "icarl", "nme", "prototype", "ridge", "lda")  # how the help lists them


def rules_help() -> str:
    """The ``--inference`` help: every offered rule with its summary, in :data:`ORDER`."""
    rules = [RULES.get(name) for name in ORDER]
    return "Inference rule: " + ", ".join(f"{r.name} ({r.summary})" for r in rules if r.offered)


__all__ = ["RULES", "InferenceRule", "register_rule", "rules_help"]
