"""The conversation: one widget per message, Markdown with highlighted code.

Only the message being streamed re-renders as tokens arrive (at most once per frame, because the
worker coalesces), so a long chat costs nothing extra per token. A message is cut into text parts
and code blocks (render.split_segments): a code block is its own read-only editor that scrolls
sideways instead of wrapping, with its own Copy button. Each message has actions under it: Copy;
Edit for your messages; Remove for a failed reply; ‹ n/m › to page through a reply's alternatives.
"""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QScrollArea, QSizePolicy, QTextEdit, QToolButton,
                               QVBoxLayout, QWidget)

from .. import theme
from ..models.library import human_duration
from ..render import code_html, render_markdown, split_segments
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
        parts.append(f"first token {human_duration(s['ttft_s'])}")
    reason = s.get("stop_reason")
    if reason in ("max-tokens", "context-full"):
        parts.append({"max-tokens": "hit max tokens", "context-full": "context full"}[reason])
    if s.get("context_note"):
        parts.append(str(s["context_note"]))
    if message.seed is not None and message.role == "assistant":
        parts.append(f"seed {message.seed}")
    return "  ·  ".join(parts)


def copy_text(text: str) -> None:
    QGuiApplication.clipboard().setText(text)


def _action(text: str, accessible: str, tip: str = "") -> QToolButton:
    b = QToolButton()
    b.setObjectName("messageAction")
    b.setText(text)
    b.setAccessibleName(accessible)
    b.setToolTip(tip or accessible)
    b.setCursor(Qt.PointingHandCursor)
    return b


class CodeBlock(QFrame):
    """One fenced code block: language, Copy, and the code in an editor that scrolls sideways."""

    def __init__(self, language: str, code: str, parent=None):
        super().__init__(parent)
        self.setObjectName("codeBlock")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 6, 6)
        layout.setSpacing(2)
        head = QHBoxLayout()
        self.language = QLabel()
        self.language.setObjectName("caption")
        head.addWidget(self.language)
        head.addStretch(1)
        self.copy_button = _action("Copy", "Copy this code block")
        self.copy_button.clicked.connect(lambda: copy_text(self.code))
        head.addWidget(self.copy_button)
        layout.addLayout(head)
        self.view = QTextEdit()
        self.view.setObjectName("code")
        self.view.setReadOnly(True)
        self.view.setLineWrapMode(QTextEdit.NoWrap)
        self.view.setHorizontalScrollBarPolicy(Qt.ScrollBarAsNeeded)
        self.view.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.view.setFrameShape(QFrame.NoFrame)
        self.view.setAccessibleName("Code")
        self.view.setTabChangesFocus(True)
        self.view.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        layout.addWidget(self.view)
        self.code = ""
        # refit whenever the layout changes the document's size (the style's font arrives at polish)
        self.view.document().documentLayout().documentSizeChanged.connect(lambda _size: self._fit())
        self.set_code(language, code)

    def set_code(self, language: str, code: str) -> None:
        if code == self.code and self.language.text() == (language or "code"):
            return
        self.code = code
        self.language.setText(language or "code")
        self.view.setHtml(code_html(code, language, theme.current().markdown))
        self._fit()

    def _fit(self) -> None:
        """As tall as the code (no vertical scrolling inside a scrolling chat), plus room for the
        sideways scroll bar."""
        doc = self.view.document()
        doc.setTextWidth(-1)                   # no wrapping: the natural size
        bar = self.view.horizontalScrollBar().sizeHint().height()
        self.view.setFixedHeight(int(doc.size().height()) + bar + 2 * self.view.frameWidth() + 4)


class MessageWidget(QFrame):
    copy_requested = Signal(object)        # the message
    edit_requested = Signal(object)
    remove_requested = Signal(object)
    alternative_requested = Signal(object, int)   # the message, +1 / -1

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
        self.parts_layout = QVBoxLayout()
        self.parts_layout.setSpacing(6)
        layout.addLayout(self.parts_layout)
        self.parts: list = []                # [(kind, widget)]
        self.body = self._text_part()         # the first text part (kept for tests and screen readers)
        self.footer = QLabel()
        self.footer.setObjectName("caption")
        self.footer.setAccessibleName("Message details")
        self.footer.setWordWrap(True)
        layout.addWidget(self.footer)
        actions = QHBoxLayout()
        actions.setSpacing(2)
        self.copy_button = _action("Copy", "Copy this message")
        self.copy_button.clicked.connect(lambda: copy_text(self.message.content))
        self.edit_button = _action("Edit", "Edit this message", "Edit this message and ask again from here")
        self.edit_button.clicked.connect(lambda: self.edit_requested.emit(self.message))
        self.remove_button = _action("Remove", "Remove this reply")
        self.remove_button.clicked.connect(lambda: self.remove_requested.emit(self.message))
        self.previous_button = _action("‹", "Previous alternative reply")
        self.previous_button.clicked.connect(lambda: self.alternative_requested.emit(self.message, -1))
        self.alternatives = QLabel("")
        self.alternatives.setObjectName("caption")
        self.alternatives.setAccessibleName("Alternative replies")
        self.next_button = _action("›", "Next alternative reply")
        self.next_button.clicked.connect(lambda: self.alternative_requested.emit(self.message, 1))
        for w in (self.previous_button, self.alternatives, self.next_button, self.copy_button, self.edit_button,
                  self.remove_button):
            actions.addWidget(w)
        actions.addStretch(1)
        layout.addLayout(actions)
        self.alternative_count = (0, 0)       # (index, count): shown when count > 1
        self.busy = False                     # a reply is streaming: no edits anywhere
        self.waiting_text = ""
        self.refresh()

    def _text_part(self) -> QLabel:
        label = QLabel()
        label.setObjectName("messageBody")
        label.setTextFormat(Qt.RichText)
        label.setWordWrap(True)
        label.setOpenExternalLinks(True)
        label.setTextInteractionFlags(Qt.TextSelectableByMouse | Qt.LinksAccessibleByMouse)
        label.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Minimum)
        label.setAccessibleName("Your message" if self.message.role == "user" else "Reply")
        self.parts_layout.addWidget(label)
        self.parts.append(("text", label))
        return label

    def set_alternatives(self, index: int, count: int) -> None:
        self.alternative_count = (index, count)
        self._refresh_actions()

    def set_busy(self, busy: bool) -> None:
        self.busy = busy
        self._refresh_actions()

    def show_waiting(self, text: str) -> None:
        """What shows before the first token (e.g. how much of a long prompt has been read)."""
        self.waiting_text = text
        if self.message.state == STREAMING and not self.message.content:
            self.refresh()

    def refresh(self) -> None:
        m = self.message
        if m.state == STREAMING and not m.content:
            self._set_segments([("text", "", "")])
            self.body.setText(f"<span style='color:{theme.current().muted}'>"
                              f"{self.waiting_text or 'Thinking…'}</span>")
        else:
            self._set_segments(split_segments(m.content) if m.role == "assistant" else [("text", "", m.content)])
        line = "" if m.state == STREAMING else stats_line(m)
        self.footer.setText(line)
        self.footer.setVisible(bool(line))
        self._refresh_actions()

    def _set_segments(self, segments) -> None:
        kinds = [k for k, _ in self.parts]
        wanted = [k for k, _, _ in segments]
        if kinds != wanted:        # the structure changed (a code fence opened): rebuild the parts
            for _, w in self.parts:
                w.setParent(None)
                w.deleteLater()
            self.parts = []
            for kind, language, text in segments:
                if kind == "code":
                    block = CodeBlock(language, text)
                    self.parts_layout.addWidget(block)
                    self.parts.append(("code", block))
                else:
                    self._text_part()
            self.body = next((w for k, w in self.parts if k == "text"), None) or self._text_part()
        palette = theme.current().markdown
        for (kind, widget), (_, language, text) in zip(self.parts, segments):
            if kind == "code":
                widget.set_code(language, text)
            else:
                widget.setText(render_markdown(text, palette))

    def _refresh_actions(self) -> None:
        m = self.message
        streaming = m.state == STREAMING
        index, count = self.alternative_count
        for w in (self.previous_button, self.alternatives, self.next_button):
            w.setVisible(count > 1)
        self.alternatives.setText(f"{index + 1} / {count}" if count > 1 else "")
        self.previous_button.setEnabled(not self.busy and index > 0)
        self.next_button.setEnabled(not self.busy and index < count - 1)
        self.copy_button.setVisible(not streaming and bool(m.content))
        self.edit_button.setVisible(m.role == "user")
        self.edit_button.setEnabled(not self.busy)
        self.remove_button.setVisible(m.role == "assistant" and m.state == ERROR)
        self.remove_button.setEnabled(not self.busy)

    def code_blocks(self) -> list:
        return [w for k, w in self.parts if k == "code"]

    def plain_text(self) -> str:
        return self.body.text()


class ChatView(QScrollArea):
    edit_requested = Signal(object)
    remove_requested = Signal(object)
    alternative_requested = Signal(object, int)

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
        self.alternatives: dict = {}        # message id -> (index, count)
        self.busy = False
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
        w.edit_requested.connect(self.edit_requested)
        w.remove_requested.connect(self.remove_requested)
        w.alternative_requested.connect(self.alternative_requested)
        w.set_alternatives(*self.alternatives.get(message.id, (0, 0)))
        w.set_busy(self.busy)
        self.layout_.insertWidget(self.layout_.count() - 1, w)
        self.widgets.append(w)
        self.empty.hide()
        self._stick_to_bottom = True
        return w

    def widget_for(self, message_id: int):
        return next((w for w in reversed(self.widgets) if w.message.id == message_id), None)

    def update_message(self, message) -> None:
        w = self.widget_for(message.id)
        if w is not None:
            w.message = message
            w.refresh()

    def set_alternatives(self, alternatives: dict) -> None:
        self.alternatives = dict(alternatives)
        for w in self.widgets:
            w.set_alternatives(*self.alternatives.get(w.message.id, (0, 0)))

    def set_busy(self, busy: bool) -> None:
        self.busy = busy
        for w in self.widgets:
            w.set_busy(busy)

    def truncate(self, keep: int) -> None:
        for w in self.widgets[keep:]:
            w.setParent(None)
            w.deleteLater()
        del self.widgets[keep:]

    def rerender(self) -> None:
        for w in self.widgets:
            for kind, part in w.parts:
                if kind == "code":
                    part.code = None     # force a re-highlight in the new palette
            w.refresh()

    def _scrolled(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._stick_to_bottom = value >= bar.maximum() - 24

    def _range_changed(self, _min: int, maximum: int) -> None:
        if self._stick_to_bottom:
            self.verticalScrollBar().setValue(maximum)
