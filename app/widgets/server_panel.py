"""The Server page: Hearth's OpenAI-compatible server (start / stop, address, key, served models, a live
request log) and remote OpenAI-compatible endpoints, whose models join the chat's model list.

Everything goes through the EngineClient (the worker owns the engine and the server); results come
back as its signals: server_state, server_request, remotes_changed.
"""
from __future__ import annotations

import secrets
import time

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QCheckBox, QFormLayout, QFrame, QHBoxLayout, QLabel, QLineEdit, QListWidget,
                               QListWidgetItem, QPlainTextEdit, QPushButton, QSpinBox, QVBoxLayout, QWidget)

REMOTE_PREFIX = "remote:"            # engine.remote.REMOTE_PREFIX (the app does not import the engine)


class ServerPanel(QWidget):
    start_requested = Signal(dict)          # {"host", "port", "api_key"}
    stop_requested = Signal()
    add_remote_requested = Signal(dict)     # {"name", "base_url", "api_key"}
    remove_remote_requested = Signal(str)
    refresh_remotes_requested = Signal()
    remote_models_changed = Signal(list)    # [(model ref, label)]

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("page")
        self.running = False
        self.url = ""
        self.remote_models: list = []
        layout = QVBoxLayout(self)
        layout.setContentsMargins(24, 16, 24, 16)
        layout.setSpacing(12)

        title = QLabel("Local server")
        title.setObjectName("title")
        layout.addWidget(title)
        hint = QLabel("Serves your models over the OpenAI API to editors, agents and scripts on this computer.")
        hint.setObjectName("caption")
        hint.setWordWrap(True)
        layout.addWidget(hint)
        form = QFormLayout()
        self.host = QLineEdit("127.0.0.1")
        self.host.setAccessibleName("Server address to bind")
        self.host.setToolTip("127.0.0.1 answers this computer only; 0.0.0.0 answers your network too")
        form.addRow("Address", self.host)
        self.port = QSpinBox()
        self.port.setRange(0, 65535)          # 0: any free port
        self.port.setValue(8765)
        self.port.setAccessibleName("Server port")
        form.addRow("Port", self.port)
        key_row = QHBoxLayout()
        self.require_key = QCheckBox("Require an API key")
        self.require_key.setAccessibleName("Require an API key")
        self.key = QLineEdit()
        self.key.setAccessibleName("API key")
        self.key.setReadOnly(True)
        self.key.setText(secrets.token_urlsafe(18))
        self.key.setEnabled(False)
        self.require_key.toggled.connect(self.key.setEnabled)
        key_row.addWidget(self.require_key)
        key_row.addWidget(self.key, 1)
        form.addRow("Key", key_row)
        layout.addLayout(form)
        row = QHBoxLayout()
        self.toggle = QPushButton("Start server")
        self.toggle.setAccessibleName("Start or stop the server")
        self.toggle.clicked.connect(self._toggle)
        row.addWidget(self.toggle)
        self.status = QLabel("Stopped")
        self.status.setAccessibleName("Server status")
        self.status.setTextInteractionFlags(Qt.TextSelectableByMouse)
        row.addWidget(self.status, 1)
        layout.addLayout(row)
        self.models_label = QLabel("")
        self.models_label.setObjectName("caption")
        self.models_label.setAccessibleName("Served models")
        self.models_label.setWordWrap(True)
        layout.addWidget(self.models_label)
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setMaximumBlockCount(500)
        self.log.setAccessibleName("Request log")
        self.log.setPlaceholderText("Requests appear here as they are served.")
        layout.addWidget(self.log, 1)

        line = QFrame()
        line.setFrameShape(QFrame.HLine)
        layout.addWidget(line)
        remote_title = QLabel("Remote endpoints")
        remote_title.setObjectName("title")
        layout.addWidget(remote_title)
        remote_hint = QLabel("An OpenAI-compatible server elsewhere (vLLM, SGLang, another Hearth): its models "
                             "appear in the chat's model list, marked remote. The key is kept in the system keyring.")
        remote_hint.setObjectName("caption")
        remote_hint.setWordWrap(True)
        layout.addWidget(remote_hint)
        add = QHBoxLayout()
        self.remote_name = QLineEdit()
        self.remote_name.setPlaceholderText("Name")
        self.remote_name.setAccessibleName("Remote endpoint name")
        self.remote_url = QLineEdit()
        self.remote_url.setPlaceholderText("http://host:8000/v1")
        self.remote_url.setAccessibleName("Remote endpoint address")
        self.remote_key = QLineEdit()
        self.remote_key.setPlaceholderText("API key (optional)")
        self.remote_key.setEchoMode(QLineEdit.Password)
        self.remote_key.setAccessibleName("Remote endpoint API key")
        self.add_remote = QPushButton("Add")
        self.add_remote.setAccessibleName("Add the remote endpoint")
        self.add_remote.clicked.connect(self._add_remote)
        for w, stretch in ((self.remote_name, 1), (self.remote_url, 2), (self.remote_key, 1), (self.add_remote, 0)):
            add.addWidget(w, stretch)
        layout.addLayout(add)
        self.remotes = QListWidget()
        self.remotes.setAccessibleName("Remote endpoints and their models")
        self.remotes.setMaximumHeight(160)
        layout.addWidget(self.remotes)
        buttons = QHBoxLayout()
        refresh = QPushButton("Refresh")
        refresh.setAccessibleName("Read the remote endpoints' model lists again")
        refresh.clicked.connect(self.refresh_remotes_requested)
        remove = QPushButton("Remove")
        remove.setAccessibleName("Remove the selected remote endpoint")
        remove.clicked.connect(self._remove_remote)
        buttons.addWidget(refresh)
        buttons.addWidget(remove)
        buttons.addStretch(1)
        layout.addLayout(buttons)

    # ------------------------------------------------------------------ wiring
    def attach(self, client) -> None:
        """Connect to an EngineClient: requests out, its signals in."""
        self.start_requested.connect(client.start_server)
        self.stop_requested.connect(client.stop_server)
        self.add_remote_requested.connect(client.add_remote)
        self.remove_remote_requested.connect(client.remove_remote)
        self.refresh_remotes_requested.connect(client.refresh_remotes)
        client.server_state.connect(self.show_state)
        client.server_request.connect(self.show_request)
        client.remotes_changed.connect(self.show_remotes)
        client.ready.connect(lambda _backend: client.refresh_remotes())

    def _toggle(self) -> None:
        self.toggle.setEnabled(False)
        if self.running:
            self.stop_requested.emit()
        else:
            self.start_requested.emit({"host": self.host.text().strip(), "port": self.port.value(),
                                       "api_key": self.key.text() if self.require_key.isChecked() else ""})

    def _add_remote(self) -> None:
        self.add_remote_requested.emit({"name": self.remote_name.text().strip(),
                                        "base_url": self.remote_url.text().strip(),
                                        "api_key": self.remote_key.text() or None})
        self.remote_key.clear()

    def _remove_remote(self) -> None:
        item = self.remotes.currentItem()
        if item is not None and item.data(Qt.UserRole + 1):
            self.remove_remote_requested.emit(item.data(Qt.UserRole + 1))

    # ------------------------------------------------------------------ results
    def show_state(self, state: dict) -> None:
        self.running = bool(state.get("running"))
        self.url = state.get("url", "") if self.running else ""
        self.toggle.setEnabled(True)
        self.toggle.setText("Stop server" if self.running else "Start server")
        for w in (self.host, self.port, self.require_key):
            w.setEnabled(not self.running)
        if self.running:
            self.status.setText(f"Serving at {self.url}" + (" (key required)" if state.get("api_key") else ""))
            models = state.get("models") or []
            self.models_label.setText("Models: " + (", ".join(models) if models else "none in the library")
                                      + " (loaded on first use)")
        else:
            error = state.get("error") or ""
            self.status.setText(f"Stopped: {error}" if error else "Stopped")
            self.models_label.setText("")

    def show_request(self, record: dict) -> None:
        at = time.strftime("%H:%M:%S", time.localtime(record.get("at", time.time())))
        tokens = record.get("completion_tokens", 0)
        detail = f"{tokens} tokens, first after {record.get('ttft_s', 0) * 1000:.0f} ms" if tokens else ""
        self.log.appendPlainText(f"{at}  {record.get('status')}  {record.get('method')} {record.get('path')}  "
                                 f"{record.get('model', '')}  {detail}  {record.get('finish', '')}".rstrip())

    def show_remotes(self, rows: list) -> None:
        self.remotes.clear()
        models = []
        for row in rows:
            head = QListWidgetItem(f"{row['name']} — {row['base_url']}" + (f"  ({row['error']})" if row.get("error")
                                                                           else ""))
            head.setData(Qt.UserRole + 1, row["name"])
            self.remotes.addItem(head)
            for model in row.get("models") or []:
                ref = f"{REMOTE_PREFIX}{row['name']}/{model}"
                item = QListWidgetItem(f"    {model}  · remote")
                item.setData(Qt.UserRole, ref)
                item.setData(Qt.UserRole + 1, row["name"])
                self.remotes.addItem(item)
                models.append((ref, f"{model} (remote: {row['name']})"))
        self.remote_models = models
        self.remote_models_changed.emit(models)
