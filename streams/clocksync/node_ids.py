"""Stable small integer ids for node names, so per-node state is plain array rows (an id is never reused)."""

from __future__ import annotations


class NodeIds:
    def __init__(self) -> None:
        self.names: list[str] = []          # the name of each id
        self._index: dict[str, int] = {}

    def id(self, name: str) -> int:
        """The name's id, given it now if it has none."""
        i = self._index.get(name)
        if i is None:
            i = self._index[name] = len(self.names)
            self.names.append(name)
        return i

    def get(self, name: str) -> int | None:
        """The name's id, or None if it has none."""
        return self._index.get(name)
