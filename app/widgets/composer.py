"""The composer: Enter sends, Shift+Enter starts a new line; Send turns into Stop while replying."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout


class ComposerEdit(QPlainTextEdit):
    """Enter sends (Shift+Enter: new line), or, with ctrl_sends, Ctrl+Enter sends (Enter: new line).
    Tab always moves the focus on: the composer never traps it."""
    submitted = Signal()
    ctrl_sends = False

    def keyPressEvent(self, event):
        if event.key() in (Qt.Key_Return, Qt.Key_Enter):
            ctrl = bool(event.modifiers() & Qt.ControlModifier)
            shift = bool(event.modifiers() & Qt.ShiftModifier)
            if (ctrl if self.ctrl_sends else not shift):
                self.submitted.emit()
                return
            if self.ctrl_sends and not shift:
                self.insertPlainText("\n")
                return
        super().keyPressEvent(event)


class Composer(QFrame):
    send_requested = Signal(str)        # new message, or the edited last message (see editing)
    stop_requested = Signal()
    regenerate_requested = Signal()
    edit_requested = Signal()
    cancel_edit_requested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        outer = QHBoxLayout(self)
        outer.setContentsMargins(24, 6, 24, 16)
        outer.addStretch(1)
        box = QVBoxLayout()
        box.setSpacing(6)
        self.edit_hint = QLabel("Editing your last message: Enter resends it, Esc cancels")
        self.edit_hint.setObjectName("caption")
        self.edit_hint.hide()
        box.addWidget(self.edit_hint)
        row = QHBoxLayout()
        row.setSpacing(8)
        self.edit = ComposerEdit()
        self.edit.setObjectName("composer")
        self.edit.setAccessibleName("Message composer")
        self.edit.setPlaceholderText("Message the model…  (Enter to send, Shift+Enter for a new line)")
        self.edit.setTabChangesFocus(True)
        self.edit.setFixedHeight(76)
        self.edit.submitted.connect(self._submit)
        row.addWidget(self.edit, 1)
        buttons = QVBoxLayout()
        buttons.setSpacing(6)
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("primary")
        self.send_button.setAccessibleName("Send message")
        self.send_button.clicked.connect(self._submit)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setAccessibleName("Stop generating")
        self.stop_button.setToolTip("Stop generating (Esc)")
        self.stop_button.clicked.connect(self.stop_requested)
        self.stop_button.hide()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch(1)
        row.addLayout(buttons)
        box.addLayout(row)
        actions = QHBoxLayout()
        self.regenerate_button = QPushButton("↻ Regenerate")
        self.regenerate_button.setAccessibleName("Regenerate the last reply")
        self.regenerate_button.clicked.connect(self.regenerate_requested)
        self.edit_button = QPushButton("✎ Edit last message")
        self.edit_button.setAccessibleName("Edit your last message")
        self.edit_button.clicked.connect(self.edit_requested)
        self.status = QLabel("")
        self.status.setObjectName("caption")
        self.status.setAccessibleName("Composer status")
        actions.addWidget(self.regenerate_button)
        actions.addWidget(self.edit_button)
        actions.addStretch(1)
        actions.addWidget(self.status)
        box.addLayout(actions)
        holder = QFrame()
        holder.setLayout(box)
        holder.setMaximumWidth(860)
        outer.addWidget(holder, 8)
        outer.addStretch(1)
        self.editing = False
        self.can_send = False

    def set_send_key(self, send_key: str) -> None:
        self.edit.ctrl_sends = send_key == "ctrl-enter"
        self.edit.setPlaceholderText("Message the model…  (Ctrl+Enter to send, Enter for a new line)"
                                     if self.edit.ctrl_sends else
                                     "Message the model…  (Enter to send, Shift+Enter for a new line)")

    def set_state(self, *, can_send: bool, generating: bool, can_regenerate: bool, can_edit: bool,
                  status: str = "") -> None:
        self.can_send = can_send and not generating
        self.send_button.setVisible(not generating)
        self.stop_button.setVisible(generating)
        self.send_button.setEnabled(self.can_send)
        self.regenerate_button.setEnabled(can_regenerate and not generating)
        self.edit_button.setEnabled(can_edit and not generating)
        self.status.setText(status)

    def begin_edit(self, text: str, last: bool = True) -> None:
        self.editing = True
        self.edit.setPlainText(text)
        self.edit_hint.setText("Editing your last message: Enter resends it, Esc cancels" if last else
                               "Editing an earlier message: Enter resends it and drops what came after; Esc cancels")
        self.edit_hint.show()
        self.send_button.setText("Resend")
        self.edit.setFocus()
        cursor = self.edit.textCursor()
        cursor.movePosition(cursor.MoveOperation.End)
        self.edit.setTextCursor(cursor)

    def end_edit(self) -> None:
        self.editing = False
        self.edit_hint.hide()
        self.send_button.setText("Send")

    def _submit(self) -> None:
        text = self.edit.toPlainText().strip()
        if not text or not self.can_send:
            return
        self.send_requested.emit(text)
