"""The model library as the app shows it: manifests, what each checkpoint holds, what is loaded.

Qt-free. Filled from the worker's `library_changed`, `inspected`, `loaded` and `unloaded` signals.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .observable import Observable


def human_bytes(n: Optional[int]) -> str:
    """One unit system everywhere (the app and `hearth`): binary units, 256.6 MiB."""
    if n is None or n < 0:
        return "—"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def human_duration(seconds: Optional[float]) -> str:
    """850 ms under a second; 41.5 s, then 2 min 5 s: never "41537 ms"."""
    if seconds is None or seconds < 0:
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes} min {rest} s"


def human_count(n: Optional[int]) -> str:
    """135000000 -> '135M'; 7240000000 -> '7.2B'."""
    if not n:
        return "—"
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            value = n / div
            return f"{value:.0f}{suffix}" if value >= 100 else f"{value:.1f}{suffix}".replace(".0" + suffix, suffix)
    return str(n)


def weights_digest(sha) -> str:
    """A manifest's sha256 ({file name: hex digest}, or one hex digest) as one stored string."""
    if not sha:
        return ""
    if isinstance(sha, dict):
        if len(sha) == 1:
            return str(next(iter(sha.values())))
        import json
        return json.dumps(sha, sort_keys=True)
    return str(sha)


@dataclass
class LibraryRow:
    id: str
    name: str
    path: str
    architecture: str
    quantization: str
    context_length: int
    bytes: int
    sha256: str            # the weights' digest (one file), or a JSON {file: digest} for several
    source: str
    parameter_count: Optional[int] = None    # from inspect (the manifest does not carry it)
    loaded: bool = False
    stored_quantization: str = ""            # what the library copy holds (from inspect): bf16 for a GGUF import

    @property
    def quantization_label(self) -> str:
        """One truth: what is stored, and where it came from when that differs ("bf16 (from Q4_1)")."""
        stored, source = self.stored_quantization, self.quantization
        if stored and source and stored.lower() != source.lower():
            return f"{stored} (from {source})"
        return stored or source

    @classmethod
    def from_manifest(cls, m) -> "LibraryRow":
        d = m.to_dict() if hasattr(m, "to_dict") else dict(m)
        return cls(id=str(d.get("id", "")), name=str(d.get("name") or d.get("id", "")),
                   path=str(d.get("path", "")), architecture=str(d.get("architecture") or ""),
                   quantization=str(d.get("quantization") or ""),
                   context_length=int(d.get("context_length") or 0), bytes=int(d.get("bytes") or 0),
                   sha256=weights_digest(d.get("sha256")), source=str(d.get("source") or ""),
                   parameter_count=d.get("parameter_count"))


@dataclass
class LibraryState(Observable):
    rows: list = field(default_factory=list)          # [LibraryRow]
    loaded: set = field(default_factory=set)           # model ids
    _parameter_counts: dict = field(default_factory=dict)
    _stored_quantizations: dict = field(default_factory=dict)
    _listeners: list = field(default_factory=list)

    def set_manifests(self, manifests) -> None:
        rows = [LibraryRow.from_manifest(m) for m in manifests]
        for row in rows:
            row.loaded = row.id in self.loaded
            if row.parameter_count is None:
                row.parameter_count = self._parameter_counts.get(row.id)
            row.stored_quantization = self._stored_quantizations.get(row.id, "")
        self.rows = rows
        self._emit("reset", rows)

    def set_parameter_count(self, model_id: str, count: int) -> None:
        self._parameter_counts[model_id] = count
        self._update(model_id, parameter_count=count)

    def set_stored_quantization(self, model_id: str, quantization: str) -> None:
        self._stored_quantizations[model_id] = quantization
        self._update(model_id, stored_quantization=quantization)

    def set_loaded(self, model_id: str, loaded: bool) -> None:
        (self.loaded.add if loaded else self.loaded.discard)(model_id)
        self._update(model_id, loaded=loaded)

    def row(self, model_id: str) -> Optional[LibraryRow]:
        return next((r for r in self.rows if r.id == model_id), None)

    def loaded_rows(self) -> list:
        return [r for r in self.rows if r.loaded]

    def _update(self, model_id: str, **changes) -> None:
        for i, row in enumerate(self.rows):
            if row.id == model_id:
                for key, value in changes.items():
                    setattr(row, key, value)
                self._emit("row-changed", i)
