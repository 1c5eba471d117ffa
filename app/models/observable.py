"""The one observer mechanism of the Qt-free models: views subscribe, models emit (event, payload)."""
from __future__ import annotations

from typing import Callable


class Observable:
    """Mixin: the class provides a `_listeners` list (a dataclass field)."""

    _listeners: list

    def subscribe(self, listener: Callable[[str, object], None]) -> None:
        self._listeners.append(listener)

    def _emit(self, event: str, payload=None) -> None:
        for listener in list(self._listeners):
            listener(event, payload)
