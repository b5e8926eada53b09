"""Name -> constructor registries (timm style): one obvious way in, a name per thing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from sbcli.errors import ConfigError, UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    """A mapping from names to things, where registering a name twice is an error."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(item: T) -> T:
            if name in self._items:
                raise ConfigError(f"{self.kind} '{name}' is registered twice; give the second one another name.")
            self._items[name] = item
            return item

        return add

    def get(self, name: str) -> T:
        if name not in self._items:
            raise UnknownNameError(self.kind, name, list(self._items))
        return self._items[name]

    def find(self, name: str) -> T | None:
        """The thing under ``name``, or None when nothing is registered under it."""
        return self._items.get(name)

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
