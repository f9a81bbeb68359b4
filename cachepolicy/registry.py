"""One shape for every name registry: the cache policies (``cachepolicy.policies``), the
agent profiles (``runtime.profiles``) and ``kvagent run``'s envs (``runtime.run.envs``).

A ``Registry`` maps names to things (a policy class, a profile class, an env) with the same
verbs everywhere: ``register(item)`` (also a decorator; the name is ``item.name`` unless
given), ``get(name)`` (also ``registry[name]``), ``names()``, ``name in registry``,
iteration over the names.  An unknown name raises the registry's ``UnknownNameError``
subclass, whose message lists the known names; a second registration of a name raises
``DuplicateNameError``.  It lives here, in the lowest layer the three share (it imports
nothing), so ``runtime`` can build on it without ``cachepolicy`` knowing of ``runtime``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """No item of a registry has that name.  A ``KeyError`` (``registry[name]``) and a
    ``ValueError`` (a bad configuration value) alike; the message lists the known names."""

    def __init__(self, kind: str, name: str, known: tuple[str, ...]) -> None:
        super().__init__(f"unknown {kind} {name!r}; known: {', '.join(known)}")
        self.kind, self.name, self.known = kind, name, known

    def __str__(self) -> str:  # KeyError's own would quote the message
        return str(self.args[0])


class DuplicateNameError(ValueError):
    """A name registered twice: the first registration stands."""


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


class Registry(Generic[T]):
    """Named items of one ``kind`` (a word for messages: "cache policy", "env").

    ``error``: the ``UnknownNameError`` subclass unknown names raise (each registry has its
    own, so callers catch exactly theirs or the base for any).  ``sort``: ``names()`` sorted
    (else in registration order).  Not thread-safe: items register at import time.
    """

    def __init__(self, kind: str, *, error: type[UnknownNameError] = UnknownNameError,
                 sort: bool = False) -> None:
        self.kind, self.error, self.sort = kind, error, sort
        self._items: dict[str, T] = {}

    def register(self, item: T, name: str | None = None) -> T:
        """Make ``item`` available as ``name`` (default: ``item.name``); returns ``item``, so
        it decorates a class.  Mutates; ``DuplicateNameError`` if the name is taken."""
        key: str = name if name is not None else getattr(item, "name")
        if key in self._items:
            raise DuplicateNameError(
                f"{_article(self.kind)} {self.kind} named {key!r} is registered already")
        self._items[key] = item
        return item

    def get(self, name: str) -> T:
        """The item ``name``; the registry's ``UnknownNameError`` (known names listed) if
        there is none."""
        try:
            return self._items[name]
        except KeyError:
            raise self.error(self.kind, name, self.names()) from None

    __getitem__ = get

    def names(self) -> tuple[str, ...]:
        """Every registered name: sorted, or in registration order (see ``sort``)."""
        return tuple(sorted(self._items)) if self.sort else tuple(self._items)

    def items(self) -> tuple[tuple[str, T], ...]:
        """(name, item) pairs in ``names()`` order."""
        return tuple((n, self._items[n]) for n in self.names())

    def values(self) -> tuple[T, ...]:
        """The items in ``names()`` order."""
        return tuple(self._items[n] for n in self.names())

    def copy(self) -> Registry[T]:
        """An independent registry with the same items (tests register into a copy)."""
        twin: Registry[T] = Registry(self.kind, error=self.error, sort=self.sort)
        twin._items = dict(self._items)
        return twin

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"

