"""Work around a PySide6 6.12.0 bug on Python 3.11.

There, every call of a void Qt method from Python (processEvents, QTimer.start, setText, ...)
returns None without taking a reference to it, and SignalInstance.emit() does the same with True.
Each call drops one reference, so a long-running app (or a test session) eventually aborts with
"Fatal Python error: none_dealloc / bool_dealloc". Python 3.12+ made these objects immortal, which
is why the bug goes unnoticed there. We do what 3.12 does: give None, True and False a reference
count no run can exhaust. Detected once; a no-op where the bug is absent.
"""
from __future__ import annotations

import ctypes
import sys

BIG = 1 << 48


def _leaks() -> bool:
    from PySide6.QtCore import QObject
    probe = QObject()
    before = sys.getrefcount(None)
    for _ in range(64):
        probe.setObjectName("probe")      # a void method
    return before - sys.getrefcount(None) >= 64


def _immortalize(obj) -> None:
    ctypes.c_ssize_t.from_address(id(obj)).value += BIG


PATCHED = False
if sys.version_info < (3, 12) and sys.implementation.name == "cpython" and _leaks():
    for _obj in (None, True, False):
        _immortalize(_obj)
    PATCHED = True
