"""The engine's and the app's log, kept in memory for the Logs & diagnostics page.

A logging.Handler on the "engine" and "hearth" loggers keeps the last MAX_LINES records and re-emits
each one as a Qt signal. Records come from any thread (the engine logs in the worker thread); the
signal is queued into the GUI thread because the LogCapture object lives there.
"""
from __future__ import annotations

import collections
import logging
import time

from PySide6.QtCore import QObject, Signal

MAX_LINES = 5000
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class LogCapture(QObject):
    record_added = Signal(object)        # (time, level name, logger name, message)

    def __init__(self, level: int = logging.INFO, parent=None):
        super().__init__(parent)
        self.records: collections.deque = collections.deque(maxlen=MAX_LINES)
        capture = self

        class _Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                try:
                    message = record.getMessage()
                    if record.exc_info:
                        message += "\n" + logging.Formatter().formatException(record.exc_info)
                    entry = (record.created, record.levelname, record.name, message)
                    capture.records.append(entry)
                    capture.record_added.emit(entry)
                except Exception:   # a log line must never take the app down
                    self.handleError(record)

        self.handler = _Handler(level)
        for name in ("engine", "hearth"):
            logger = logging.getLogger(name)
            logger.addHandler(self.handler)
            if logger.getEffectiveLevel() > level:
                logger.setLevel(level)

    def close(self) -> None:
        for name in ("engine", "hearth"):
            logging.getLogger(name).removeHandler(self.handler)


def format_record(entry) -> str:
    created, level, name, message = entry
    stamp = time.strftime("%H:%M:%S", time.localtime(created)) + f".{int(created * 1000) % 1000:03d}"
    return f"{stamp} {level:<7} {name}: {message}"
