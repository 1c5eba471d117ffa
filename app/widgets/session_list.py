"""Chats in the sidebar: new, search, rename, delete."""
from __future__ import annotations

import time

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QAbstractItemView, QFrame, QInputDialog, QLineEdit, QListWidget, QListWidgetItem,
                               QMenu, QMessageBox, QPushButton, QVBoxLayout)


def _when(ts: float) -> str:
    delta = time.time() - ts
    if delta < 60:
        return "just now"
    if delta < 3600:
        return f"{int(delta // 60)} min ago"
    if delta < 86400:
        return time.strftime("%H:%M", time.localtime(ts))
    return time.strftime("%d %b", time.localtime(ts))


class ChatListWidget(QListWidget):
    """Delete (or Backspace, as on a Mac) asks to delete the selected chat."""
    delete_pressed = Signal()

    def keyPressEvent(self, event) -> None:
        if event.key() in (Qt.Key_Delete, Qt.Key_Backspace) and self.currentItem() is not None:
            self.delete_pressed.emit()
            return
        super().keyPressEvent(event)


class SessionList(QFrame):
    new_requested = Signal()
    open_requested = Signal(str)
    rename_requested = Signal(str, str)
    delete_requested = Signal(str)
    search_changed = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("sidePanel")
        self.setFixedWidth(240)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 12, 10, 10)
        layout.setSpacing(8)
        self.new_button = QPushButton("＋  New chat")
        self.new_button.setObjectName("primary")
        self.new_button.setAccessibleName("New chat")
        self.new_button.setToolTip("New chat (Ctrl+N)")
        self.new_button.clicked.connect(self.new_requested)
        layout.addWidget(self.new_button)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats")
        self.search.setAccessibleName("Search chats")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self.search_changed)
        layout.addWidget(self.search)
        self.list = ChatListWidget()
        self.list.setAccessibleName("Chats")
        self.list.setFrameShape(QFrame.NoFrame)
        self.list.setStyleSheet("QListWidget { border: none; }")
        self.list.setSelectionMode(QAbstractItemView.SingleSelection)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.ElideRight)
        self.list.setWordWrap(False)
        self.list.setUniformItemSizes(True)
        self.list.setContextMenuPolicy(Qt.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        self.list.currentItemChanged.connect(self._current)
        self.list.itemDoubleClicked.connect(lambda item: self.rename(item.data(Qt.UserRole)))
        layout.addWidget(self.list, 1)
        self.list.delete_pressed.connect(lambda: self.confirm_delete(self.current_id()))
        self._quiet = False

    def set_chats(self, chats, current_id: str = "") -> None:
        self._quiet = True
        self.list.clear()
        for chat in chats:
            item = QListWidgetItem(f"{chat.title}\n{_when(chat.updated_at)}")
            item.setData(Qt.UserRole, chat.id)
            item.setData(Qt.UserRole + 1, chat.title)
            item.setToolTip(chat.title)
            self.list.addItem(item)
            if chat.id == current_id:
                self.list.setCurrentItem(item)
        self._quiet = False

    def current_id(self) -> str:
        item = self.list.currentItem()
        return item.data(Qt.UserRole) if item else ""

    def _current(self, item, _previous):
        if item is not None and not self._quiet:
            self.open_requested.emit(item.data(Qt.UserRole))

    def _item(self, chat_id: str):
        for i in range(self.list.count()):
            if self.list.item(i).data(Qt.UserRole) == chat_id:
                return self.list.item(i)
        return None

    def rename(self, chat_id: str) -> None:
        item = self._item(chat_id)
        if item is None:
            return
        title, ok = QInputDialog.getText(self, "Rename chat", "Title:", text=item.data(Qt.UserRole + 1))
        if ok and title.strip():
            self.rename_requested.emit(chat_id, title.strip())

    def confirm_delete(self, chat_id: str) -> None:
        item = self._item(chat_id)
        if item is None:
            return
        answer = QMessageBox.question(self, "Delete chat",
                                      f"Delete “{item.data(Qt.UserRole + 1)}” and all its messages?")
        if answer == QMessageBox.Yes:
            self.delete_requested.emit(chat_id)

    def _menu(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        chat_id = item.data(Qt.UserRole)
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self.rename(chat_id))
        menu.addAction("Delete…", lambda: self.confirm_delete(chat_id))
        menu.exec(self.list.mapToGlobal(pos))
