"""Hearth's engine: inspect, plan, load and run language models. Never imports Qt."""
from .engine import Engine, Finished, GenerationStats, ModelHandle, TextDelta
from .checkpoint import inspect
from .progress import ProgressEvent
from .sampling import SamplingParams

__all__ = ["Engine", "Finished", "GenerationStats", "ModelHandle", "ProgressEvent", "SamplingParams",
           "TextDelta", "inspect"]
