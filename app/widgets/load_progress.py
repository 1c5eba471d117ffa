"""Load progress: the stage, bytes loaded of the total, a bar, and Cancel."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout

from ..models.library import human_bytes

STAGES = ("inspecting", "loading weights", "preparing runner", "warming up", "resident")
STAGE_LABELS = {"inspecting": "Inspecting", "loading weights": "Loading weights",
                "preparing runner": "Preparing runner", "warming up": "Warming up", "resident": "Ready",
                "importing": "Importing"}


class LoadProgress(QFrame):
    cancel_requested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("progressStrip")
        self.setAccessibleName("Load progress")
        outer = QHBoxLayout(self)
        outer.setContentsMargins(16, 12, 12, 12)
        outer.setSpacing(16)
        col = QVBoxLayout()
        col.setSpacing(6)
        top = QHBoxLayout()
        self.title = QLabel("Loading")
        self.title.setObjectName("sectionTitle")
        self.bytes_label = QLabel("")
        self.bytes_label.setObjectName("muted")
        self.bytes_label.setAccessibleName("Bytes loaded")
        top.addWidget(self.title)
        top.addStretch(1)
        top.addWidget(self.bytes_label)
        col.addLayout(top)
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.bar.setTextVisible(False)
        self.bar.setFixedHeight(10)
        self.bar.setAccessibleName("Load progress bar")
        col.addWidget(self.bar)
        self.stages = QLabel("")
        self.stages.setObjectName("caption")
        self.stages.setTextFormat(Qt.RichText)
        self.stages.setAccessibleName("Load stage")
        col.addWidget(self.stages)
        outer.addLayout(col, 1)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setAccessibleName("Cancel loading")
        self.cancel_button.clicked.connect(self._cancel)
        outer.addWidget(self.cancel_button, 0, Qt.AlignVCenter)
        self.stage = ""
        self.hide()

    def begin(self, title: str, importing: bool = False) -> None:
        self.title.setText(title)
        self.stage = ""
        self.bar.setValue(0)
        self.bytes_label.setText("")
        self.cancel_button.setEnabled(not importing)
        self.cancel_button.setVisible(not importing)
        self._render_stages("importing" if importing else "inspecting")
        self.show()

    def update_event(self, event) -> None:
        self.stage = event.stage
        self.bar.setValue(int(1000 * event.fraction))
        if event.total_bytes > 0:
            self.bytes_label.setText(f"{human_bytes(event.current_bytes)} of {human_bytes(event.total_bytes)}")
        self._render_stages(event.stage, event.detail)

    def _render_stages(self, current: str, detail: str = "") -> None:
        from .. import theme
        t = theme.current()
        if current in ("importing", "quantizing"):
            text = f"<b style='color:{t.accent}'>{current.capitalize()}</b>"
        else:
            parts = []
            index = STAGES.index(current) if current in STAGES else -1
            for i, stage in enumerate(STAGES):
                label = STAGE_LABELS[stage]
                if i == index:
                    parts.append(f"<b style='color:{t.accent}'>{label}</b>")
                elif i < index:
                    parts.append(f"<span style='color:{t.text}'>✓ {label}</span>")
                else:
                    parts.append(f"<span style='color:{t.muted}'>{label}</span>")
            text = " &nbsp;›&nbsp; ".join(parts)
        if detail:
            from html import escape
            text += f" &nbsp;<span style='color:{t.muted}'>· {escape(detail[:80])}</span>"
        self.stages.setText(text)

    def _cancel(self) -> None:
        self.cancel_button.setEnabled(False)
        self.cancel_button.setText("Cancelling…")
        self.cancel_requested.emit()

    def end(self) -> None:
        self.cancel_button.setText("Cancel")
        self.cancel_button.setEnabled(True)
        self.hide()
