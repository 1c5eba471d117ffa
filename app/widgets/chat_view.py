"""The conversation: one widget per message, Markdown with highlighted code.

Only the message being streamed re-renders as tokens arrive (at most once per frame, because the
worker coalesces), so a long chat costs nothing extra per token.
"""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QScrollArea, QSizePolicy, QVBoxLayout, QWidget

from .. import theme
from ..render import render_markdown
from ..store import ERROR, STOPPED, STREAMING


def stats_line(message) -> str:
    s = message.stats or {}
    parts = []
    if message.state == STOPPED:
        parts.append("Stopped")
    elif message.state == ERROR:
        parts.append("Failed: " + str(s.get("error", "")))
    if s.get("generated_tokens") is not None:
        parts.append(f"{s['generated_tokens']} tokens")
    if s.get("tokens_per_s"):
        parts.append(f"{s['tokens_per_s']:.1f} tok/s")
    if s.get("ttft_s") is not None:
        parts.append(f"TTFT {s['ttft_s'] * 1000:.0f} ms")
    reason = s.get("stop_reason")
    if reason in ("max-tokens", "context-full"):
        parts.append({"max-tokens": "hit max tokens", "context-full": "context full"}[reason])
    if message.seed is not None and message.role == "assistant":
        parts.append(f"seed {message.seed}")
    return "  ·  ".join(parts)


class MessageWidget(QFrame):
    def __init__(self, message, model_name: str = "", parent=None):
        super().__init__(parent)
        self.message = message
        user = message.role == "user"
        self.setObjectName("userBubble" if user else "assistantMessage")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(16, 10, 16, 10) if user else layout.setContentsMargins(4, 4, 4, 4)
        layout.setSpacing(4)
        self.role = QLabel("You" if user else (model_name or message.model_id or "Assistant"))
        self.role.setObjectName("role")
        layout.addWidget(self.role)
        self.body = QLabel()
        self.body.setObjectName("messageBody")
        self.body.setTextFormat(Qt.RichText)
        self.body.setWordWrap(True)
        self.body.setOpenExternalLinks(True)
        self.body.setTextInteractionFlags(Qt.TextSelectableByMouse | Qt.LinksAccessibleByMouse)
        self.body.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Minimum)
        self.body.setAccessibleName("Your message" if user else "Reply")
        layout.addWidget(self.body)
        self.footer = QLabel()
        self.footer.setObjectName("caption")
        self.footer.setAccessibleName("Message details")
        layout.addWidget(self.footer)
        self.refresh()

    def refresh(self) -> None:
        m = self.message
        text = m.content
        if m.state == STREAMING and not text:
            self.body.setText(f"<span style='color:{theme.current().muted}'>Thinking…</span>")
        else:
            self.body.setText(render_markdown(text, theme.current().markdown))
        line = "" if m.state == STREAMING else stats_line(m)
        self.footer.setText(line)
        self.footer.setVisible(bool(line))

    def plain_text(self) -> str:
        return self.body.text()


class ChatView(QScrollArea):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setAccessibleName("Conversation")
        self.container = QWidget()
        self.container.setObjectName("messages")
        outer = QHBoxLayout(self.container)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addStretch(1)
        column = QWidget()
        column.setMaximumWidth(860)
        column.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Preferred)
        outer.addWidget(column, 8)
        outer.addStretch(1)
        self.layout_ = QVBoxLayout(column)
        self.layout_.setContentsMargins(24, 20, 24, 20)
        self.layout_.setSpacing(14)
        self.empty = QLabel()
        self.empty.setAlignment(Qt.AlignCenter)
        self.empty.setObjectName("muted")
        self.empty.setWordWrap(True)
        self.layout_.addWidget(self.empty)
        self.layout_.addStretch(1)
        self.setWidget(self.container)
        self.widgets: list[MessageWidget] = []
        self.model_names: dict = {}
        self._stick_to_bottom = True
        self.verticalScrollBar().rangeChanged.connect(self._range_changed)
        self.verticalScrollBar().valueChanged.connect(self._scrolled)
        self.set_empty_text("")

    def set_empty_text(self, text: str) -> None:
        self.empty.setText(text)
        self.empty.setVisible(not self.widgets and bool(text))

    def set_messages(self, messages) -> None:
        for w in self.widgets:
            w.setParent(None)
            w.deleteLater()
        self.widgets = []
        for m in messages:
            self.add_message(m)
        self._stick_to_bottom = True
        self.empty.setVisible(not self.widgets and bool(self.empty.text()))

    def add_message(self, message) -> MessageWidget:
        w = MessageWidget(message, self.model_names.get(message.model_id, ""))
        self.layout_.insertWidget(self.layout_.count() - 1, w)
        self.widgets.append(w)
        self.empty.hide()
        self._stick_to_bottom = True
        return w

    def update_message(self, message) -> None:
        for w in reversed(self.widgets):
            if w.message.id == message.id:
                w.message = message
                w.refresh()
                return

    def truncate(self, keep: int) -> None:
        for w in self.widgets[keep:]:
            w.setParent(None)
            w.deleteLater()
        del self.widgets[keep:]

    def rerender(self) -> None:
        for w in self.widgets:
            w.refresh()

    def _scrolled(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._stick_to_bottom = value >= bar.maximum() - 24

    def _range_changed(self, _min: int, maximum: int) -> None:
        if self._stick_to_bottom:
            self.verticalScrollBar().setValue(maximum)
