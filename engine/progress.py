"""Progress events reported while a model is inspected, loaded and warmed up."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

# Stages in the order a load passes through them.
INSPECTING = "inspecting"
LOADING_WEIGHTS = "loading weights"
PREPARING_RUNNER = "preparing runner"
WARMING_UP = "warming up"
RESIDENT = "resident"
IMPORTING = "importing"

LOAD_STAGES = (INSPECTING, LOADING_WEIGHTS, PREPARING_RUNNER, WARMING_UP, RESIDENT)


@dataclass(frozen=True)
class ProgressEvent:
    stage: str
    current_bytes: int
    total_bytes: int
    detail: str = ""

    @property
    def fraction(self) -> float:
        return 1.0 if self.total_bytes <= 0 else min(1.0, self.current_bytes / self.total_bytes)


ProgressCallback = Callable[[ProgressEvent], None]


def no_progress(_: ProgressEvent) -> None:
    return None


class ByteCounter:
    """Reports monotonically growing byte counts for one stage, never past the total."""

    def __init__(self, callback: Optional[ProgressCallback], stage: str, total: int):
        self.callback = callback or no_progress
        self.stage = stage
        self.total = total
        self.current = 0

    def start(self, detail: str = "") -> None:
        self.callback(ProgressEvent(self.stage, 0, self.total, detail))

    def advance(self, nbytes: int, detail: str = "") -> None:
        self.current = min(self.total, self.current + nbytes)
        self.callback(ProgressEvent(self.stage, self.current, self.total, detail))
