"""An in-window message: errors from the worker are shown here, never only logged."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QVBoxLayout

TITLES = {
    "not-found": "File not found",
    "not-a-checkpoint": "Not a model checkpoint",
    "missing-config": "The checkpoint's configuration is incomplete",
    "corrupt": "The checkpoint is damaged",
    "missing-tensors": "The checkpoint is missing weights",
    "unsupported-architecture": "This model architecture is not supported yet",
    "unsupported-tensor-type": "This weight format is not supported yet",
    "tokenizer-missing": "The model has no tokenizer",
    "chat-template": "The model's chat template failed",
    "unknown-model": "Unknown model",
    "unknown-session": "The chat session was lost",
    "out-of-memory": "Not enough memory",
    "backend-unavailable": "Backend unavailable",
    "context-overflow": "The conversation is longer than the model's context",
    "cancelled": "Cancelled",
    "import-failed": "Import failed",
    "internal": "Something went wrong",
}


class Banner(QFrame):
    dismissed = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("banner")
        self.setAccessibleName("Message banner")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(14, 10, 10, 10)
        text = QVBoxLayout()
        text.setSpacing(2)
        self.title = QLabel()
        self.title.setObjectName("bannerTitle")
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.message.setAccessibleName("Message")
        text.addWidget(self.title)
        text.addWidget(self.message)
        layout.addLayout(text, 1)
        self.close_button = QPushButton("Dismiss")
        self.close_button.setAccessibleName("Dismiss message")
        self.close_button.clicked.connect(self.dismiss)
        layout.addWidget(self.close_button, 0, Qt.AlignTop)
        self.kind = ""
        self.hide()

    def show_error(self, kind: str, message: str) -> None:
        self._show("error", kind, TITLES.get(kind, "Error"), message)

    def show_info(self, title: str, message: str) -> None:
        self._show("info", "info", title, message)

    def _show(self, level: str, kind: str, title: str, message: str) -> None:
        self.kind = kind
        self.setProperty("level", level)
        self.style().unpolish(self)
        self.style().polish(self)
        for child in (self.title, self.message):
            child.style().unpolish(child)
            child.style().polish(child)
        self.title.setText(title)
        self.message.setText(message)
        self.show()

    def dismiss(self) -> None:
        self.hide()
        self.dismissed.emit()
