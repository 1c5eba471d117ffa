"""The main window: wires the EngineClient's signals to the Qt-free models and their views."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Optional

from PySide6.QtCore import QSettings, QSize, Qt, QTimer
from PySide6.QtGui import QIcon, QKeySequence, QShortcut
from PySide6.QtWidgets import (QButtonGroup, QComboBox, QFileDialog, QFrame, QHBoxLayout, QLabel, QMainWindow,
                               QMenu, QPushButton, QSizePolicy, QStackedWidget, QToolButton, QVBoxLayout, QWidget)

from ..models import export
from ..models.chat import ChatState, alternative_position
from ..models.library import LibraryState, human_bytes
from ..store import ChatStore
from ..widgets.banner import Banner
from ..log_capture import LogCapture
from ..widgets.chat_view import ChatView
from ..widgets.diagnostics import Diagnostics
from ..widgets.preferences import DEFAULTS as PREFERENCE_DEFAULTS, Preferences
from ..widgets.composer import Composer
from ..widgets.inspector import Inspector
from ..widgets.load_progress import LoadProgress
from ..widgets.model_manager import ModelManager
from ..widgets.server_panel import ServerPanel
from ..widgets.session_list import SessionList
from ..widgets.settings_panel import DEFAULT_PARAMS, SettingsPanel
from ..worker import DEFAULT_MODEL_ID, EngineClient

log = logging.getLogger("hearth.app")
RESOURCES = Path(__file__).resolve().parents[2] / "resources"
CHAT, MODELS, INSPECT = 0, 1, 2
SERVER = 3
LOGS, SETTINGS = 4, 5
RESOURCE_POLL_MS = 2000


class ElidedLabel(QLabel):
    """A one-line label that ends in … instead of being cut off when the window is narrow."""

    def paintEvent(self, event) -> None:
        from PySide6.QtGui import QPainter
        painter = QPainter(self)
        text = self.fontMetrics().elidedText(self.text(), Qt.ElideRight, self.contentsRect().width())
        painter.drawText(self.contentsRect(), int(Qt.AlignLeft | Qt.AlignVCenter), text)

    def shown_text(self) -> str:
        return self.fontMetrics().elidedText(self.text(), Qt.ElideRight, self.contentsRect().width())


class StatusLabel(ElidedLabel):
    """A status-bar part: may shrink to nothing (elided), and tells the whole text in its tooltip."""

    def __init__(self, text: str = ""):
        super().__init__(text)
        self.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.setMinimumWidth(40)
        self.setToolTip(text)

    def setText(self, text: str) -> None:
        super().setText(text)
        self.setToolTip(text)
        self.setAccessibleDescription(text)


def app_icon() -> QIcon:
    return QIcon(str(RESOURCES / "hearth.svg"))


class MainWindow(QMainWindow):
    def __init__(self, client: EngineClient, store: ChatStore, settings: QSettings,
                 start_model: Optional[str] = None):
        super().__init__()
        self.client = client
        self.store = store
        self.settings = settings
        self.start_model = start_model      # None, "auto", or a model id to load once the library is known
        self.log_capture = LogCapture()       # before the engine starts, so its first lines are kept
        self.last_announcement = ""
        self.library = LibraryState()
        self.chat = ChatState(store)
        self.backend = ""
        self._user_inspects: set[str] = set()
        self._counted: set[str] = set()
        self._library_seen = False
        self._loading_after_install = False   # the first start installs the default model, then loads it
        self._contexts_sent: set[str] = set()   # models whose saved context length the worker knows
        self._select_after_import = ""          # the library lists a new model only after `imported`
        self._quiet_inspects: set[str] = set()   # the loaded model, shown in an empty inspector
        self.drafts: dict[str, str] = {}         # chat id -> unsent composer text
        self.editing_message_id: Optional[int] = None
        self._draft_chat = ""                    # the chat whose draft the composer holds
        self.setWindowTitle("Hearth")
        self.setWindowIcon(app_icon())
        self.setMinimumSize(QSize(980, 620))
        self._build()
        self._wire()
        self._shortcuts()
        self._restore()
        self.chat.subscribe(self._chat_event)
        self.refresh_sessions()
        chats = self.store.list_chats()
        if chats:
            self.open_chat(chats[0].id)
        else:
            self._show_chat_state()

    # ------------------------------------------------------------------ building
    def _build(self) -> None:
        central = QWidget()
        central.setObjectName("page")
        root = QHBoxLayout(central)
        root.setContentsMargins(0, 0, 0, 0)
        root.setSpacing(0)

        rail = QFrame()
        rail.setObjectName("rail")
        rail.setFixedWidth(84)
        rl = QVBoxLayout(rail)
        rl.setContentsMargins(10, 14, 10, 14)
        rl.setSpacing(6)
        logo = QLabel()
        logo.setPixmap(app_icon().pixmap(40, 40))
        logo.setAlignment(Qt.AlignHCenter)
        logo.setAccessibleName("Hearth")
        rl.addWidget(logo)
        rl.addSpacing(12)
        self.nav = QButtonGroup(self)
        self.nav.setExclusive(True)
        def rail_button(index: int, label: str, tip: str) -> None:
            b = QToolButton()
            b.setObjectName("railButton")
            b.setText(label)
            b.setToolTip(tip)
            b.setAccessibleName(tip)
            b.setCheckable(True)
            b.setToolButtonStyle(Qt.ToolButtonTextOnly)
            self.nav.addButton(b, index)
            rl.addWidget(b)
        for index, label, tip in ((CHAT, "Chat", "Chats"), (MODELS, "Models", "Model library"),
                                  (INSPECT, "Inspect", "Checkpoint inspector"),
                                  (SERVER, "Server", "Local server and remote endpoints"),   # server_panel.py
                                  (LOGS, "Logs", "Logs and diagnostics"), (SETTINGS, "Settings", "Settings")):
            rail_button(index, label, tip)
        rl.addStretch(1)
        root.addWidget(rail)

        main = QVBoxLayout()
        main.setContentsMargins(0, 0, 0, 0)
        main.setSpacing(0)
        top = QVBoxLayout()
        top.setContentsMargins(16, 10, 16, 0)
        top.setSpacing(8)
        self.banner = Banner()
        self.load_progress = LoadProgress()
        top.addWidget(self.banner)
        top.addWidget(self.load_progress)
        main.addLayout(top)
        self.pages = QStackedWidget()
        main.addWidget(self.pages, 1)
        root.addLayout(main, 1)

        # chat page
        chat_page = QWidget()
        chat_page.setObjectName("page")
        cl = QHBoxLayout(chat_page)
        cl.setContentsMargins(12, 12, 12, 12)
        cl.setSpacing(12)
        self.sessions = SessionList()
        cl.addWidget(self.sessions)
        middle = QVBoxLayout()
        middle.setSpacing(0)
        header = QHBoxLayout()
        header.setContentsMargins(24, 4, 24, 4)
        self.chat_title = ElidedLabel("")
        self.chat_title.setObjectName("title")
        self.chat_title.setAccessibleName("Chat title")
        self.chat_title.setMinimumWidth(80)
        self.chat_title.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        header.addWidget(self.chat_title, 1)
        self.model_combo = QComboBox()
        self.model_combo.setAccessibleName("Model for this chat")
        self.model_combo.setMinimumWidth(220)
        header.addWidget(self.model_combo)
        self.choose_model = QPushButton("Choose a model…")
        self.choose_model.setAccessibleName("Go to the model library")
        self.choose_model.clicked.connect(lambda: self.show_page(MODELS))
        header.addWidget(self.choose_model)
        self.settings_toggle = QPushButton("Settings")
        self.settings_toggle.setCheckable(True)
        self.settings_toggle.setChecked(True)
        self.settings_toggle.setAccessibleName("Show sampling settings and figures")
        self.settings_toggle.setToolTip("Show or hide the system prompt, sampling and live figures")
        header.addWidget(self.settings_toggle)
        self.export_button = QPushButton("Export")
        self.export_button.setAccessibleName("Export or import chats")
        self.export_button.setToolTip("Export this chat (Markdown or JSON), export all chats, or import a JSON export")
        menu = QMenu(self.export_button)
        menu.addAction("Export this chat as Markdown…", lambda: self.export_chat_dialog("md"))
        menu.addAction("Export this chat as JSON…", lambda: self.export_chat_dialog("json"))
        menu.addAction("Export all chats as JSON…", self.export_all_dialog)
        menu.addSeparator()
        menu.addAction("Import chats from JSON…", self.import_chats_dialog)
        self.export_button.setMenu(menu)
        header.addWidget(self.export_button)
        middle.addLayout(header)
        self.chat_view = ChatView()
        middle.addWidget(self.chat_view, 1)
        self.composer = Composer()
        middle.addWidget(self.composer)
        cl.addLayout(middle, 1)
        self.side = SettingsPanel()
        cl.addWidget(self.side)
        self.settings_toggle.toggled.connect(self.side.setVisible)
        self.pages.addWidget(chat_page)

        self.manager = ModelManager(self.library)
        self.pages.addWidget(self.manager)
        self.inspector = Inspector()
        self.pages.addWidget(self.inspector)
        self.server_panel = ServerPanel()
        self.pages.addWidget(self.server_panel)
        self.diagnostics = Diagnostics(self.log_capture)
        self.pages.addWidget(self.diagnostics)
        from ..store import hearth_home
        self.preferences = Preferences(str(hearth_home()))
        self.pages.addWidget(self.preferences)
        self.setCentralWidget(central)

        # Elided, never cut mid-word at the minimum width; the full text is in each tooltip.
        self.backend_label = StatusLabel("Starting engine…")
        self.model_label = StatusLabel("No model loaded")
        self.memory_label = StatusLabel("")
        for w, stretch in ((self.backend_label, 3), (self.model_label, 2), (self.memory_label, 3)):
            self.statusBar().addWidget(w, stretch)
        self.statusBar().setSizeGripEnabled(False)
        self.show_page(CHAT)

    def _wire(self) -> None:
        c = self.client
        c.ready.connect(self._ready)
        c.library_changed.connect(self._library_changed)
        c.inspected.connect(self._inspected)
        c.memory_planned.connect(self._planned)
        c.imported.connect(self._imported)
        c.removed.connect(lambda mid: self.banner.show_info("Model removed", f"{mid} is no longer in your library."))
        c.progress.connect(self.load_progress.update_event)
        c.started.connect(self._op_started)
        c.done.connect(self._op_done)
        c.loaded.connect(self._loaded)
        c.unloaded.connect(self._unloaded)
        c.failed.connect(self._failed)
        c.token.connect(self._token)
        c.metrics.connect(self._metrics)
        c.finished.connect(self._finished_reply)
        c.context_counted.connect(self._context_counted)
        c.diagnosed.connect(self.diagnostics.set_info)
        self.preferences.changed.connect(self._preferences_changed)
        self._resource_timer = QTimer(self)
        self._resource_timer.setInterval(RESOURCE_POLL_MS)
        self._resource_timer.timeout.connect(self._show_resources)
        self._resource_timer.start()
        c.removed.connect(self._removed)
        self.chat_view.edit_requested.connect(self.begin_edit_message)
        self.chat_view.remove_requested.connect(self._remove_message)
        self.chat_view.alternative_requested.connect(self._page_alternative)
        self._prompt_timer = QTimer(self)         # "Reading your message: 2,048 of 3,400 tokens"
        self._prompt_timer.setInterval(250)
        self._prompt_timer.timeout.connect(self._show_prompt_progress)

        self.nav.idClicked.connect(self.show_page)
        self.load_progress.cancel_requested.connect(self.client.cancel_load)
        m = self.manager
        m.import_requested.connect(self.import_path)
        m.install_default_requested.connect(lambda: self.client.install_default(False))
        m.remove_requested.connect(self.client.remove)
        m.quantize_requested.connect(self.client.quantize)
        m.load_requested.connect(self.load_model)
        m.unload_requested.connect(self.client.unload)
        m.inspect_requested.connect(self.inspect)
        m.selection_changed.connect(self._plan_if_needed)
        m.context_changed.connect(self._context_changed)
        self.inspector.inspect_path_requested.connect(self.inspect)
        self.server_panel.attach(self.client)
        self.server_panel.remote_models_changed.connect(lambda _models: self._refresh_model_combo())

        s = self.sessions
        s.new_requested.connect(self.new_chat)
        s.open_requested.connect(self.open_chat)
        s.rename_requested.connect(self._rename_chat)
        s.delete_requested.connect(self._delete_chat)
        s.search_changed.connect(lambda _: self.refresh_sessions())
        co = self.composer
        co.send_requested.connect(self.send)
        co.stop_requested.connect(self.stop)
        co.regenerate_requested.connect(self.regenerate)
        co.edit_requested.connect(self.begin_edit)
        self.side.params_changed.connect(self._params_changed)
        self.side.system_prompt_changed.connect(self._system_prompt_changed)
        self.model_combo.currentIndexChanged.connect(lambda _: self._model_chosen())

    def _shortcuts(self) -> None:
        for keys, fn in (("Ctrl+N", self.new_chat), ("Esc", self._escape), ("Ctrl+.", self.stop),
                         ("Ctrl+L", self.focus_composer), ("Ctrl+1", lambda: self.show_page(CHAT)),
                         ("Ctrl+2", lambda: self.show_page(MODELS)), ("Ctrl+3", lambda: self.show_page(INSPECT)),
                         ("Ctrl+4", lambda: self.show_page(LOGS)), ("Ctrl+,", lambda: self.show_page(SETTINGS))):
            QShortcut(QKeySequence(keys), self, fn)

    def _restore(self) -> None:
        geometry = self.settings.value("window/geometry")
        if geometry is not None:
            self.restoreGeometry(geometry)
        else:
            self.resize(1320, 820)
        try:
            params = json.loads(self.settings.value("chat/params", "") or "{}")
        except ValueError:
            params = {}
        self.default_params = {**DEFAULT_PARAMS, **params}
        self.default_system_prompt = self.settings.value("chat/system_prompt", "") or ""
        self.side.set_params(self.default_params)
        try:
            prefs = json.loads(self.settings.value("app/preferences", "") or "{}")
        except ValueError:
            prefs = {}
        self.prefs = {**PREFERENCE_DEFAULTS, **prefs}
        self.preferences.set_values(self.prefs)
        self._apply_preferences(self.prefs, startup=True)

    # ------------------------------------------------------------------ pages
    def show_page(self, index: int) -> None:
        self.pages.setCurrentIndex(index)
        self.nav.button(index).setChecked(True)
        if index == CHAT:
            self.focus_composer()

    def focus_composer(self) -> None:
        if self.pages.currentIndex() != CHAT:
            self.show_page(CHAT)
        self.composer.edit.setFocus()

    # ------------------------------------------------------------------ engine events
    def _ready(self, backend: str) -> None:
        self.backend = backend
        self.backend_label.setText(f"Backend: {backend}")

    def _library_changed(self, manifests: list) -> None:
        self.library.set_manifests(manifests)
        for row in self.library.rows:
            if row.parameter_count is None and row.id not in self._counted:
                self._counted.add(row.id)
                self.client.inspect(row.id)      # headers only: fills the Parameters column
            if row.id not in self._contexts_sent:
                self._contexts_sent.add(row.id)
                saved = int(self.settings.value(f"context/{row.id}", 0) or 0)
                if saved:
                    self.client.set_context(row.id, saved)   # before any load of it is asked for
        self._refresh_model_combo()
        if not self._library_seen:
            self._library_seen = True
            self._start_model()
        selected = self.manager.selected_id()
        if self._select_after_import and self.library.row(self._select_after_import) is not None:
            self.manager.select(self._select_after_import)
            self._select_after_import = ""
        elif not selected and self.library.rows:
            self.manager.select(self.library.rows[0].id)

    def _start_model(self) -> None:
        wanted = self.start_model
        if not wanted:
            return
        ids = {r.id for r in self.library.rows}
        if wanted == "auto":
            last = self.settings.value("chat/last_model", "") or ""
            if last in ids:
                self.load_model(last)
            elif not ids:
                self._install_default_and_load()
            elif DEFAULT_MODEL_ID in ids:     # the last model was removed; the default one is still here
                self.load_model(DEFAULT_MODEL_ID)
            else:
                self.banner.show_info("No model loaded", "Choose a model on the Models page and press Load.")
        elif wanted in ids:
            self.load_model(wanted)
        elif wanted in (DEFAULT_MODEL_ID, "default"):
            self._install_default_and_load()
        else:
            self.banner.show_error("unknown-model", f"No model with id “{wanted}” is in your library. "
                                   f"Known: {', '.join(sorted(ids)) or 'none'}.")

    def _install_default_and_load(self) -> None:
        self._loading_after_install = True
        self.client.install_default(True)

    def _inspected(self, key: str, info) -> None:
        count = getattr(info.metadata, "parameter_count", None)
        if self.library.row(key) is not None and count:
            self.library.set_parameter_count(key, int(count))
        stored = getattr(info.metadata, "quantization", "")
        if self.library.row(key) is not None and stored:
            self.library.set_stored_quantization(key, str(stored))
        row = self.library.row(key)
        if key in self._user_inspects:
            self._user_inspects.discard(key)
            self.inspector.show_info(key, info, row.name if row else "", row.quantization if row else "")
            self.show_page(INSPECT)
        elif key in self._quiet_inspects:
            self._quiet_inspects.discard(key)
            if not self.inspector.key:          # the inspector starts with the loaded model, not empty
                self.inspector.show_info(key, info, row.name if row else "", row.quantization if row else "")

    def _planned(self, key: str, plan: dict) -> None:
        self.manager.show_plan(key, plan)
        if getattr(self, "_load_after_plan", "") == key:
            self._load_after_plan = ""
            if plan.get("ok"):
                self.load_model(key)
            else:
                advice = (f" A context of {plan['suggested_context']:,} tokens fits: choose it on the Models page."
                          if plan.get("suggested_context") else " Unload another model or choose a smaller one.")
                self.banner.show_error("out-of-memory", f"{plan.get('message') or 'It does not fit.'}{advice}")
        self.memory_label.setText(f"Free {plan.get('device', '')}: {human_bytes(plan.get('free_bytes'))}")

    def _context_changed(self, model_id: str, tokens: int) -> None:
        """Remember the user's context length for this model; the worker re-plans and loads with it."""
        self.settings.setValue(f"context/{model_id}", int(tokens))
        self.manager.plans.pop(model_id, None)
        self.client.set_context(model_id, int(tokens))

    def _plan_if_needed(self, model_id: str) -> None:
        if model_id not in self.manager.plans:
            self.client.plan_memory(model_id)

    def _imported(self, manifest) -> None:
        self._select_after_import = manifest.id     # selected once library_changed lists it
        self.manager.select(manifest.id)
        if self._loading_after_install:
            self._loading_after_install = False
            self.banner.show_info("Default model installed", f"{manifest.name} is in your library and loads "
                                  "now; you can chat as soon as the status bar says it is loaded.")
            return
        self.banner.show_info("Model added", f"{manifest.name} is in your library. Select it to see whether it "
                              "fits in memory, then Load.")

    def _op_started(self, op: str, key: str) -> None:
        if op in ("load", "import", "install-default", "quantize"):
            row = self.library.row(key)
            name = row.name if row else Path(key).name or key
            title = {"load": f"Loading {name}", "import": f"Importing {name}",
                     "install-default": "Installing the default model", "quantize": f"Quantizing {name} to NVFP4"}[op]
            self.load_progress.begin(title, importing=op != "load")
            self.manager.set_busy(True)
        if op == "load":
            self.banner.hide()

    def _op_done(self, op: str, key: str) -> None:
        if op in ("load", "import", "install-default", "quantize"):
            if not {"load", "import", "install-default", "quantize"} & set(self.client.busy):
                self.load_progress.end()
                self.manager.set_busy(False)
        if op == "generate":
            streaming = self.chat.stream_for_reply(int(key)) if key.isdigit() else None
            if streaming is not None:
                # no `finished` came for this reply: the engine raised (failed() showed why)
                self.chat.fail(getattr(self, "_last_failure", "") or "the engine stopped before finishing",
                               streaming.chat_id)
                self._last_failure = ""
            self._show_chat_state()

    def _loaded(self, handle) -> None:
        if self.banner.isVisible() and self.banner.kind == "info" and \
                self.banner.title.text() in ("Default model installed", "No model loaded"):
            self.banner.hide()      # the first-start note is done once the model is loaded
        if not self.inspector.key:
            self._quiet_inspects.add(handle.id)
            self.client.inspect(handle.id)
        self.library.set_loaded(handle.id, True)
        self.manager.plans.clear()
        self.settings.setValue("chat/last_model", handle.id)
        self._refresh_model_combo(select=handle.id)
        if self.manager.selected_id():
            self.client.plan_memory(self.manager.selected_id())

    def _unloaded(self, model_id: str) -> None:
        self.library.set_loaded(model_id, False)
        self.manager.plans.clear()
        self._refresh_model_combo()
        selected = self.manager.selected_id()
        if selected and self.client.busy.get("remove") != selected:   # a model being removed has no plan
            self.client.plan_memory(selected)

    def _removed(self, model_id: str) -> None:
        if (self.settings.value("chat/last_model", "") or "") == model_id:
            self.settings.setValue("chat/last_model", "")
        self.manager.plans.pop(model_id, None)

    def _failed(self, kind: str, message: str) -> None:
        self._last_failure = message
        if kind == "context-overflow":
            message += (" Or choose, in this chat's settings, to drop the oldest turns or keep a rolling window "
                        "when the chat outgrows the context.")
        if kind == "cancelled":
            self.banner.show_info("Cancelled", message)
        else:
            self.banner.show_error(kind, message)

    def _token(self, chat_id: str, text: str) -> None:
        self.chat.append(text, chat_id)
        self.chat.flush(chat_id)       # every frame: nothing shown is lost if the app is killed

    def _metrics(self, chat_id: str, live: dict) -> None:
        if self.chat.chat is not None and self.chat.chat.id == chat_id:
            self.side.show_live(live)

    def _context_counted(self, chat_id: str, counted: dict) -> None:
        if self.chat.chat is not None and self.chat.chat.id == chat_id:
            self.side.show_context(counted.get("context_used"), counted.get("context_limit"))

    def _show_prompt_progress(self) -> None:
        if not self.chat.any_busy:
            self._prompt_timer.stop()
            return
        streaming = self.chat.streaming
        if streaming is None:
            return
        if streaming.content:
            return
        progress = self.client.reply_progress(streaming.chat_id)
        widget = self.chat_view.widget_for(streaming.id)
        if progress and widget is not None and progress["prompt_tokens"] - progress["prompt_done"] > 256:
            widget.show_waiting(f"Reading your message: {progress['prompt_done']:,} of "
                                f"{progress['prompt_tokens']:,} tokens…")
        elif progress and widget is not None and progress["prompt_done"] >= progress["prompt_tokens"] > 0:
            widget.show_waiting("Thinking…")

    def _finished_reply(self, chat_id: str, stats: dict) -> None:
        message = self.chat.streams.get(chat_id)
        if message is not None and self.chat.chat is not None and self.chat.chat.id == chat_id:
            preview = " ".join(message.content.split())[:160]
            self.announce(f"New reply: {preview}" if preview else "The reply ended empty.")
        if chat_id in self.chat.streams:
            self.chat.finish(stats, chat_id)
            if not (self.chat.chat is not None and self.chat.chat.id == chat_id):
                self.refresh_sessions()
        if self.chat.chat is not None and self.chat.chat.id == chat_id:
            self.side.show_stats(stats)
        self._show_chat_state()

    # ------------------------------------------------------------------ model actions
    def load_model(self, model_id: str) -> None:
        if self.client.busy.get("load"):
            return
        plan = self.manager.plans.get(model_id)
        if plan is not None and not plan.get("ok"):
            # The last plan said it would not fit; free memory moves, so plan again now: _planned
            # loads it if it fits, or warns with the plan's advice (the engine would refuse it).
            self._load_after_plan = model_id
            self.client.plan_memory(model_id)
            return
        row = self.library.row(model_id)
        self.load_progress.begin(f"Loading {row.name if row else Path(model_id).name}")   # at once, not on reply
        self.client.load(model_id)

    def import_path(self, path: str) -> None:
        self.load_progress.begin(f"Importing {Path(path).name}", importing=True)
        self.client.import_path(path)

    def inspect(self, key: str) -> None:
        self._user_inspects.add(key)
        self.client.inspect(key)

    def _refresh_model_combo(self, select: str = "") -> None:
        current = select or self.current_model_id() or (self.chat.chat.model_id if self.chat.chat else "")
        self.model_combo.blockSignals(True)
        self.model_combo.clear()
        for row in self.library.loaded_rows():
            self.model_combo.addItem(row.name, row.id)
        for ref, label in self.server_panel.remote_models:   # remote endpoints' models
            self.model_combo.addItem(label, ref)
        index = self.model_combo.findData(current)
        if index >= 0:
            self.model_combo.setCurrentIndex(index)
        self.model_combo.blockSignals(False)
        has = self.model_combo.count() > 0
        self.model_combo.setVisible(has)
        self.choose_model.setVisible(not has)
        self.chat_view.model_names = {r.id: r.name for r in self.library.rows}
        loaded = self.library.loaded_rows()
        self.model_label.setText("Loaded: " + ", ".join(r.name for r in loaded) if loaded else "No model loaded")
        self._show_chat_state()

    def current_model_id(self) -> str:
        return self.model_combo.currentData() or ""

    def _model_chosen(self) -> None:
        mid = self.current_model_id()
        if mid:
            self.settings.setValue("chat/last_model", mid)
        self._show_chat_state()

    # ------------------------------------------------------------------ chats
    def refresh_sessions(self) -> None:
        chats = self.store.list_chats(self.sessions.search.text().strip())
        self.sessions.set_chats(chats, self.chat.chat.id if self.chat.chat else "")

    def new_chat(self) -> None:
        if self.chat.chat is not None and not self.chat.messages:   # already an empty chat: use it
            self.sessions.search.clear()
            self.focus_composer()
            return
        self.chat.new_chat(self.current_model_id() or None, self.default_system_prompt, self.side.params())
        self.sessions.search.clear()
        self.refresh_sessions()
        self.focus_composer()

    def open_chat(self, chat_id: str) -> None:
        if self.chat.chat is not None and self.chat.chat.id == chat_id:
            return
        self.chat.open(chat_id)

    def _swap_draft(self, chat_id: str) -> None:
        """Each chat keeps its own unsent text: the composer's draft does not follow you across chats."""
        if self._draft_chat == chat_id:
            return
        if self._draft_chat and not self.composer.editing:
            self.drafts[self._draft_chat] = self.composer.edit.toPlainText()
        self._draft_chat = chat_id
        self.editing_message_id = None
        self.composer.end_edit()
        self.composer.edit.setPlainText(self.drafts.pop(chat_id, "") if chat_id else "")

    def _rename_chat(self, chat_id: str, title: str) -> None:
        self.store.rename_chat(chat_id, title)
        if self.chat.chat is not None and self.chat.chat.id == chat_id:
            self.chat.chat.title = title
            self.chat_title.setText(title)
        self.refresh_sessions()

    def _delete_chat(self, chat_id: str) -> None:
        if chat_id in self.chat.streams:
            self.banner.show_info("Still replying", "Stop the reply before deleting this chat.")
            return
        self.store.delete_chat(chat_id)
        self.client.release_chat(chat_id)
        if self.chat.chat is not None and self.chat.chat.id == chat_id:
            rest = self.store.list_chats()
            if rest:
                self.chat.open(rest[0].id)
            else:
                self.chat.close()
        self.refresh_sessions()

    def _chat_event(self, event: str, payload) -> None:
        if event == "opened":
            chat = payload
            self._swap_draft(chat.id if chat else "")
            self.chat_view.set_alternatives(self._alternatives())
            self.chat_view.set_messages(self.chat.messages if chat else [])
            self.chat_title.setText(chat.title if chat else "")
            self.side.set_params(chat.params if chat and chat.params else self.default_params)
            self.side.set_system_prompt(chat.system_prompt if chat else self.default_system_prompt)
            self.side.clear_figures()
            last = next((m for m in reversed(self.chat.messages) if m.stats), None)
            if last is not None:
                self.side.show_stats(last.stats)
            if chat and self.chat.messages and not (last and last.stats.get("context_used") is not None
                                                    and last is self.chat.messages[-1]):
                # the last reply was cut off (no stats): count the conversation's tokens instead
                model = chat.model_id or self.current_model_id()
                if model and model in self.library.loaded:
                    self.client.count_context(chat.id, model, chat.system_prompt or "",
                                              [m.as_turn() for m in self.chat.messages if m.content])
            if chat and chat.model_id and self.model_combo.findData(chat.model_id) >= 0:
                self.model_combo.setCurrentIndex(self.model_combo.findData(chat.model_id))
            self.refresh_sessions()
        elif event == "message-added":
            if self.chat.chat is not None and payload.chat_id == self.chat.chat.id:
                self.chat_view.add_message(payload)
        elif event == "message-updated":
            self.chat_view.set_alternatives(self._alternatives())
            self.chat_view.update_message(payload)
        elif event == "messages-truncated":
            self.chat_view.truncate(payload)
        elif event == "messages-reset":
            self.chat_view.set_alternatives(self._alternatives())
            self.chat_view.set_messages(self.chat.messages)
        elif event == "streaming-started":
            self.chat_view.set_alternatives(self._alternatives())
            self._prompt_timer.start()
        self._show_chat_state()

    def _show_chat_state(self) -> None:
        if not hasattr(self, "composer"):
            return
        model = self.current_model_id()
        open_chat = self.chat.chat is not None
        here = self.chat.busy                       # only this chat's reply shows Stop
        others = len(self.chat.streams) - (1 if here else 0)
        if not model:
            status = "Load a model to start chatting"
        elif here:
            status = "Replying…  (Esc to stop)"
        elif others:
            status = f"Replying in {others} other chat{'s' if others != 1 else ''}…"
        else:
            status = ""
        self.composer.set_state(can_send=bool(model), generating=here,
                                can_regenerate=bool(model) and open_chat and self.chat.can_regenerate(),
                                can_edit=bool(model) and open_chat and self.chat.last_user_text() is not None,
                                status=status)
        self.chat_view.set_busy(self.chat.busy)
        if not self.chat.messages:
            self.chat_view.set_empty_text("Start a conversation. Your chats stay on this computer."
                                          if model else "Load a model from the library, then start a conversation.")
        if open_chat:
            self.chat_title.setText(self.chat.chat.title)

    def _weights_hash(self, model_id: str) -> Optional[str]:
        row = self.library.row(model_id)
        return row.sha256 if row else None

    def send(self, text: str) -> None:
        model = self.current_model_id()
        if not model:
            self.banner.show_info("No model loaded", "Load a model from the Models page first.")
            return
        if self.chat.busy:
            return
        if self.chat.chat is None:
            self.new_chat()
        params = self.side.params()
        self.chat.set_params(params)
        try:
            if self.composer.editing and self.editing_message_id is not None:
                request = self.chat.edit_message(self.editing_message_id, text, model, self._weights_hash(model),
                                                 params)
            elif self.composer.editing:
                request = self.chat.edit_last_user(text, model, self._weights_hash(model), params)
            else:
                request = self.chat.send(text, model, self._weights_hash(model), params)
        except ValueError as exc:
            self.banner.show_info("Cannot send", str(exc))
            return
        self.composer.edit.clear()
        self.composer.end_edit()
        self.editing_message_id = None
        self._start(request)

    def _start(self, request) -> None:
        self.side.clear_figures()
        self.client.generate(request)
        self.refresh_sessions()
        self._show_chat_state()

    def stop(self) -> None:
        """Stop the open chat's reply (never another chat's)."""
        streaming = self.chat.streaming
        if streaming is not None:
            self.client.stop(streaming.chat_id)

    def _escape(self) -> None:
        if self.chat.busy:
            self.stop()
        elif self.composer.editing:
            self.composer.end_edit()
            self.editing_message_id = None
            self.composer.edit.clear()
        elif self.banner.isVisible():
            self.banner.dismiss()

    def regenerate(self) -> None:
        model = self.current_model_id()
        if not model or not self.chat.can_regenerate():
            return
        self._start(self.chat.regenerate(model, self._weights_hash(model), self.side.params()))

    def begin_edit(self) -> None:
        text = self.chat.last_user_text()
        if text is not None and not self.chat.busy:
            self.editing_message_id = None
            self.composer.begin_edit(text)

    def begin_edit_message(self, message) -> None:
        """Edit any of your messages: Enter resends it, and the chat continues from there."""
        if self.chat.busy or message.role != "user":
            return
        self.editing_message_id = message.id
        last = next((m for m in reversed(self.chat.messages) if m.role == "user"), None)
        self.composer.begin_edit(message.content, last is not None and last.id == message.id)

    def _remove_message(self, message) -> None:
        if not self.chat.busy:
            self.chat.delete_message(message.id)

    def _page_alternative(self, message, step: int) -> None:
        if not self.chat.busy:
            self.chat.show_alternative(message.id, step)

    def _alternatives(self) -> dict:
        return {m.id: alternative_position(m) for m in self.chat.messages if m.alternatives}

    # ------------------------------------------------------------------ export and import
    def export_chat(self, chat_id: str, path: str, kind: str) -> None:
        data = self.store.export_chat(chat_id)
        text = export.chat_markdown(data) if kind == "md" else json.dumps(data, indent=1, ensure_ascii=False)
        Path(path).write_text(text, encoding="utf-8")

    def export_all(self, path: str) -> None:
        Path(path).write_text(json.dumps(export.export_all(self.store), indent=1, ensure_ascii=False),
                              encoding="utf-8")

    def import_chats(self, path: str) -> list:
        """Import a JSON export (one chat or all); opens the first imported chat."""
        try:
            chats = export.import_file_data(self.store, export.read_json(path))
        except ValueError as exc:
            self.banner.show_error("import-failed", str(exc))
            return []
        self.refresh_sessions()
        if chats:
            self.open_chat(chats[0].id)
            self.banner.show_info("Chats imported", f"{len(chats)} chat{'s' if len(chats) != 1 else ''} "
                                  f"from {Path(path).name}.")
        return chats

    def export_chat_dialog(self, kind: str) -> None:
        if self.chat.chat is None:
            return
        suffix = {"md": "Markdown (*.md)", "json": "JSON (*.json)"}[kind]
        name = f"{export.safe_file_name(self.chat.chat.title)}.{kind}"
        path, _ = QFileDialog.getSaveFileName(self, "Export chat", name, suffix)
        if path:
            self.export_chat(self.chat.chat.id, path, kind)

    def export_all_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export all chats", "hearth-chats.json", "JSON (*.json)")
        if path:
            self.export_all(path)

    def import_chats_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import chats", "", "JSON (*.json);;All files (*)")
        if path:
            self.import_chats(path)

    def _params_changed(self, params: dict) -> None:
        self.chat.set_params(params)
        self.default_params = params
        self.settings.setValue("chat/params", json.dumps(params))

    def _system_prompt_changed(self, text: str) -> None:
        self.chat.set_system_prompt(text)
        self.default_system_prompt = text
        self.settings.setValue("chat/system_prompt", text)

    # ------------------------------------------------------------------ settings page, resources
    def _preferences_changed(self, prefs: dict) -> None:
        self.prefs = dict(prefs)
        self.settings.setValue("app/preferences", json.dumps(self.prefs))
        self._apply_preferences(self.prefs)

    def _apply_preferences(self, prefs: dict, startup: bool = False) -> None:
        import os
        self.composer.set_send_key(prefs.get("send_key", "enter"))
        self.client.set_defaults(int(prefs.get("context") or 0), prefs.get("precision") or "")
        self.manager.plans.clear()
        if not startup and self.manager.selected_id():
            self.client.plan_memory(self.manager.selected_id())
        wanted = prefs.get("theme", "system")
        if startup and (os.environ.get("HEARTH_THEME") or wanted == "system"):
            return            # HEARTH_THEME, when set, wins over the saved choice at start
        if wanted == "system":
            os.environ.pop("HEARTH_THEME", None)
        else:
            os.environ["HEARTH_THEME"] = wanted
        from PySide6.QtWidgets import QApplication
        from .. import theme
        app = QApplication.instance()
        if app is not None:
            theme.apply(app)
            self.apply_theme()

    def _show_resources(self) -> None:
        """The status bar's memory part: free where the weights live, this process, the KV cache fill."""
        r = self.client.resources()
        if not r:
            return
        parts = []
        if r.get("total_bytes"):
            used = r["total_bytes"] - r.get("free_bytes", 0)
            parts.append(f"{r.get('device', '')} {human_bytes(used)} used, {human_bytes(r.get('free_bytes'))} free")
        if r.get("process_bytes") and r.get("device") == "RAM":
            parts.append(f"Hearth {human_bytes(r['process_bytes'])}")
        for fill in r.get("kv", []):
            if fill["capacity"]:
                share = 100 * fill["used"] / fill["capacity"]
                row = self.library.row(fill["model_id"])
                name = row.name if row and len(r["kv"]) > 1 else ""
                parts.append(f"KV{' ' + name if name else ''} {fill['used']:,} / {fill['capacity']:,} tokens "
                             f"({share:.0f}%)")
        self.memory_label.setText("  ·  ".join(parts))
        self.resources_shown = r

    def announce(self, text: str) -> None:
        """Tell screen readers (a new reply arrived), without moving the focus."""
        from PySide6.QtGui import QAccessible, QAccessibleAnnouncementEvent
        self.last_announcement = text
        try:
            QAccessible.updateAccessibility(QAccessibleAnnouncementEvent(self.chat_view, text))
        except Exception:   # no accessibility backend (offscreen): the text is still kept
            log.debug("announce", exc_info=True)

    # ------------------------------------------------------------------ theme, close
    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        narrow = self.width() < 1180
        if narrow != getattr(self, "_narrow", None):   # the side panel gives way on small windows
            self._narrow = narrow
            self.settings_toggle.setChecked(not narrow)

    def apply_theme(self) -> None:
        self.chat_view.rerender()

    def closeEvent(self, event) -> None:
        self._resource_timer.stop()
        self.log_capture.close()
        for chat_id, message in list(self.chat.streams.items()):
            self.chat.flush(chat_id)
            self.chat.finish({"stop_reason": "cancelled", **(message.stats or {})}, chat_id)
            self.client.stop(chat_id)
        self.settings.setValue("window/geometry", self.saveGeometry())
        self.settings.sync()
        super().closeEvent(event)
