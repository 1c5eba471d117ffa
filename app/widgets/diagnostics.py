"""Logs & diagnostics: the engine's log (filter by level, copy, save), the build, the GPU and driver,
and one button that copies all of it for a bug report."""
from __future__ import annotations

import platform
import sys

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (QComboBox, QFileDialog, QFormLayout, QFrame, QHBoxLayout, QLabel, QPlainTextEdit,
                               QPushButton, QVBoxLayout, QWidget)

from ..log_capture import LEVELS, format_record


def gpu_summary(build: dict) -> str:
    """The GPU line of the diagnostics, in plain words when there is none."""
    if not build:
        return "unknown (the engine has not started)"
    if not build.get("cuda_compiled"):
        return "this build of Hearth has no GPU support; replies run on the CPU"
    if not build.get("device_count"):
        return "no NVIDIA GPU found; replies run on the CPU"
    names = ", ".join(build.get("device_names") or []) or f"{build['device_count']} NVIDIA GPU(s)"
    driver = build.get("driver_version") or 0
    return f"{names}; driver CUDA {driver // 1000}.{driver % 1000 // 10}" if driver else names


class Diagnostics(QWidget):
    refresh_requested = Signal()

    def __init__(self, capture, parent=None):
        super().__init__(parent)
        self.setObjectName("page")
        self.capture = capture
        self.info: dict = {}
        layout = QVBoxLayout(self)
        layout.setContentsMargins(24, 20, 24, 20)
        layout.setSpacing(12)
        head = QHBoxLayout()
        title = QLabel("Logs & diagnostics")
        title.setObjectName("title")
        head.addWidget(title)
        head.addStretch(1)
        self.copy_diagnostics_button = QPushButton("Copy diagnostics")
        self.copy_diagnostics_button.setObjectName("primary")
        self.copy_diagnostics_button.setAccessibleName("Copy diagnostics for a bug report")
        self.copy_diagnostics_button.setToolTip("Build, GPU, driver and the recent log, ready to paste into a bug report")
        self.copy_diagnostics_button.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.report()))
        head.addWidget(self.copy_diagnostics_button)
        layout.addLayout(head)

        card = QFrame()
        card.setObjectName("card")
        form = QFormLayout(card)
        form.setContentsMargins(16, 12, 16, 12)
        form.setHorizontalSpacing(16)
        self.fields: dict[str, QLabel] = {}
        for key, label in (("gpu", "GPU"), ("backend", "Backend"), ("cuda", "CUDA build"),
                           ("architectures", "Compiled for"), ("cublaslt", "cuBLASLt"), ("versions", "Versions"),
                           ("home", "Data folder")):
            value = QLabel("—")
            value.setWordWrap(True)
            value.setTextInteractionFlags(Qt.TextSelectableByMouse)
            value.setAccessibleName(label)
            caption = QLabel(label)
            caption.setObjectName("muted")
            form.addRow(caption, value)
            self.fields[key] = value
        layout.addWidget(card)

        bar = QHBoxLayout()
        log_title = QLabel("Engine log")
        log_title.setObjectName("sectionTitle")
        bar.addWidget(log_title)
        bar.addStretch(1)
        self.level = QComboBox()
        self.level.setAccessibleName("Lowest log level shown")
        for name in LEVELS:
            self.level.addItem(name.capitalize(), name)
        self.level.setCurrentIndex(1)
        self.level.currentIndexChanged.connect(lambda _: self.rebuild())
        self.copy_button = QPushButton("Copy")
        self.copy_button.setAccessibleName("Copy the log")
        self.copy_button.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.log.toPlainText()))
        self.save_button = QPushButton("Save…")
        self.save_button.setAccessibleName("Save the log to a file")
        self.save_button.clicked.connect(self._save_dialog)
        for w in (QLabel("Show"), self.level, self.copy_button, self.save_button):
            bar.addWidget(w)
        layout.addLayout(bar)
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setLineWrapMode(QPlainTextEdit.NoWrap)
        self.log.setAccessibleName("Engine log")
        self.log.setTabChangesFocus(True)
        self.log.setMaximumBlockCount(5000)
        layout.addWidget(self.log, 1)
        capture.record_added.connect(self._add)
        self.rebuild()

    def _shown(self, entry) -> bool:
        return LEVELS.index(entry[1]) >= self.level.currentIndex() if entry[1] in LEVELS else True

    def _add(self, entry) -> None:
        if self._shown(entry):
            self.log.appendPlainText(format_record(entry))

    def rebuild(self) -> None:
        self.log.setPlainText("\n".join(format_record(e) for e in self.capture.records if self._shown(e)))

    def set_info(self, info: dict) -> None:
        self.info = dict(info)
        build = info.get("build") or {}
        self.fields["gpu"].setText(gpu_summary(build))
        self.fields["backend"].setText(info.get("backend") or "—")
        self.fields["cuda"].setText(
            f"yes, CUDA runtime {build.get('cuda_runtime_version', 0) // 1000}.{build.get('cuda_runtime_version', 0) % 1000 // 10}"
            if build.get("cuda_compiled") else f"no ({build.get('reason') or 'built without nvcc'})")
        self.fields["architectures"].setText(str(build.get("architectures") or "—"))
        lt = build.get("cublaslt")
        self.fields["cublaslt"].setText("found" if lt else "not found" if lt is not None else "—")
        self.fields["versions"].setText(info.get("versions") or "—")
        self.fields["home"].setText(info.get("home") or "—")

    def report(self) -> str:
        """Everything a bug report needs, as text."""
        lines = ["Hearth diagnostics", f"Platform: {platform.platform()}", f"Python: {sys.version.split()[0]}"]
        for key, label in self.fields.items():
            lines.append(f"{key}: {label.text()}")
        build = self.info.get("build") or {}
        lines.append("build_info: " + ", ".join(f"{k}={v}" for k, v in sorted(build.items())))
        lines.append("")
        lines.append("Recent log:")
        lines += [format_record(e) for e in list(self.capture.records)[-200:]]
        return "\n".join(lines) + "\n"

    def save_log(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(format_record(e) for e in self.capture.records) + "\n")

    def _save_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save the log", "hearth.log", "Log files (*.log *.txt)")
        if path:
            self.save_log(path)
