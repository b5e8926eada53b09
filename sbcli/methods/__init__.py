"""Methods, one file each, registered by name. Imported explicitly so the registry is complete."""

from sbcli.methods import dd, finetune, joint, ranpac, simplecil, split_bridge, std  # noqa: F401  (registration)
from sbcli.methods.base import METHODS, TaskContext, TaskResult, build_config, register_method


def list_methods() -> list[str]:
    return METHODS.names()


__all__ = ["METHODS", "TaskContext", "TaskResult", "build_config", "list_methods", "register_method"]
