"""Model manager: the library table, import/remove, load/unload, and the memory plan before a load."""
from __future__ import annotations

from PySide6.QtCore import QAbstractTableModel, QModelIndex, Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (QAbstractItemView, QFileDialog, QFrame, QGridLayout, QHBoxLayout, QHeaderView,
                               QLabel, QMessageBox, QProgressBar, QPushButton, QSpinBox, QTableView, QVBoxLayout,
                               QWidget)

from .. import theme
from ..models.library import LibraryState, human_bytes, human_count

COLUMNS = ("Name", "Architecture", "Parameters", "Quantization", "Size on disk", "Context", "Status")


class LibraryTableModel(QAbstractTableModel):
    def __init__(self, state: LibraryState, parent=None):
        super().__init__(parent)
        self.state = state
        state.subscribe(self._changed)

    def _changed(self, event, payload):
        if event == "reset":
            self.beginResetModel()
            self.endResetModel()
        elif event == "row-changed":
            self.dataChanged.emit(self.index(payload, 0), self.index(payload, len(COLUMNS) - 1))

    def rowCount(self, parent=QModelIndex()):
        return 0 if parent.isValid() else len(self.state.rows)

    def columnCount(self, parent=QModelIndex()):
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section, orientation, role=Qt.DisplayRole):
        if orientation == Qt.Horizontal and role == Qt.DisplayRole:
            return COLUMNS[section]
        return None

    def data(self, index, role=Qt.DisplayRole):
        if not index.isValid():
            return None
        row = self.state.rows[index.row()]
        col = index.column()
        if role == Qt.DisplayRole:
            return (row.name, row.architecture or "—", human_count(row.parameter_count),
                    row.quantization_label or "—", human_bytes(row.bytes),
                    f"{row.context_length:,}" if row.context_length else "—",
                    "● Loaded" if row.loaded else "Not loaded")[col]
        if role == Qt.ForegroundRole and col == 6:
            t = theme.current()
            return QColor(t.success if row.loaded else t.muted)
        if role == Qt.ToolTipRole:
            return f"{row.name}\n{row.path}\nsha256 {row.sha256[:16]}…" if row.sha256 else row.path
        if role == Qt.TextAlignmentRole and col in (2, 4, 5):
            return int(Qt.AlignRight | Qt.AlignVCenter)
        if role == Qt.UserRole:
            return row.id
        return None


class ModelManager(QWidget):
    """Emits requests; the main window forwards them to the EngineClient."""
    import_requested = Signal(str)
    install_default_requested = Signal()
    remove_requested = Signal(str)
    quantize_requested = Signal(str)
    load_requested = Signal(str)
    unload_requested = Signal(str)
    inspect_requested = Signal(str)
    selection_changed = Signal(str)
    context_changed = Signal(str, int)       # model id, context length in tokens

    def __init__(self, state: LibraryState, parent=None):
        super().__init__(parent)
        self.setObjectName("page")
        self.state = state
        self.plans: dict[str, dict] = {}
        layout = QVBoxLayout(self)
        layout.setContentsMargins(24, 20, 24, 20)
        layout.setSpacing(14)

        head = QHBoxLayout()
        title = QLabel("Models")
        title.setObjectName("title")
        head.addWidget(title)
        head.addStretch(1)
        self.default_button = QPushButton("Get SmolLM2 135M")
        self.default_button.setAccessibleName("Install the default model")
        self.default_button.setToolTip("Add the small default model that ships with Hearth")
        self.default_button.clicked.connect(self.install_default_requested)
        self.import_folder_button = QPushButton("Import folder…")
        self.import_folder_button.setAccessibleName("Import a Hugging Face folder")
        self.import_folder_button.setToolTip("A Hugging Face folder with config.json and *.safetensors")
        self.import_folder_button.clicked.connect(self._import_folder)
        self.import_file_button = QPushButton("Import GGUF…")
        self.import_file_button.setObjectName("primary")
        self.import_file_button.setAccessibleName("Import a GGUF file")
        self.import_file_button.clicked.connect(self._import_file)
        for b in (self.default_button, self.import_folder_button, self.import_file_button):
            head.addWidget(b)
        layout.addLayout(head)

        self.table_model = LibraryTableModel(state, self)
        self.table = QTableView()
        self.table.setAccessibleName("Model library")
        self.table.setModel(self.table_model)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.setAlternatingRowColors(True)
        self.table.setShowGrid(False)
        self.table.verticalHeader().hide()
        self.table.verticalHeader().setDefaultSectionSize(36)
        header = self.table.horizontalHeader()
        header.setAccessibleName("Library columns (click to sort)")
        header.setSectionResizeMode(0, QHeaderView.Stretch)
        for c in range(1, len(COLUMNS)):
            header.setSectionResizeMode(c, QHeaderView.ResizeToContents)
        header.setDefaultAlignment(Qt.AlignLeft | Qt.AlignVCenter)
        self.table.selectionModel().selectionChanged.connect(self._selection)
        self.table.doubleClicked.connect(lambda _: self._load())
        layout.addWidget(self.table, 3)

        self.empty = QLabel("Your library is empty. Import a GGUF file or a Hugging Face folder, "
                            "or get the small default model to try Hearth.")
        self.empty.setObjectName("muted")
        self.empty.setWordWrap(True)
        self.empty.setAlignment(Qt.AlignCenter)
        layout.addWidget(self.empty)

        # details card: memory plan vs free memory, actions
        self.card = QFrame()
        self.card.setObjectName("card")
        card = QVBoxLayout(self.card)
        card.setContentsMargins(18, 16, 18, 16)
        card.setSpacing(10)
        row = QHBoxLayout()
        self.detail_title = QLabel("Select a model")
        self.detail_title.setObjectName("sectionTitle")
        row.addWidget(self.detail_title)
        row.addStretch(1)
        self.inspect_button = QPushButton("Inspect")
        self.inspect_button.setAccessibleName("Inspect the selected model")
        self.inspect_button.clicked.connect(lambda: self._emit_selected(self.inspect_requested))
        self.remove_button = QPushButton("Remove")
        self.remove_button.setObjectName("danger")
        self.remove_button.setAccessibleName("Remove the selected model")
        self.remove_button.clicked.connect(self._remove)
        self.unload_button = QPushButton("Unload")
        self.unload_button.setAccessibleName("Unload the selected model")
        self.unload_button.clicked.connect(lambda: self._emit_selected(self.unload_requested))
        self.load_button = QPushButton("Load")
        self.load_button.setObjectName("primary")
        self.load_button.setAccessibleName("Load the selected model")
        self.load_button.clicked.connect(self._load)
        self.quantize_button = QPushButton("Quantize to NVFP4")
        self.quantize_button.setAccessibleName("Write a 4-bit NVFP4 copy of the selected model")
        self.quantize_button.setToolTip("Adds a 4-bit copy (NVFP4, weight-only) to the library; the original stays. "
                                        "Smaller and a little less accurate.")
        self.quantize_button.clicked.connect(lambda: self._emit_selected(self.quantize_requested))
        for b in (self.inspect_button, self.quantize_button, self.remove_button, self.unload_button,
                  self.load_button):
            row.addWidget(b)
        card.addLayout(row)
        self.path_label = QLabel("")
        self.path_label.setObjectName("caption")
        self.path_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        card.addWidget(self.path_label)

        grid = QGridLayout()
        grid.setHorizontalSpacing(28)
        grid.setVerticalSpacing(2)
        self.figures = {}
        for i, (key, label) in enumerate((("weight_bytes", "Weights"), ("kv_bytes", "KV cache"),
                                          ("workspace_bytes", "Workspace"), ("total_bytes", "Needs"),
                                          ("free_bytes", "Free"))):
            caption = QLabel(label)
            caption.setObjectName("caption")
            value = QLabel("—")
            value.setObjectName("figure")
            value.setAccessibleName(label)
            grid.addWidget(caption, 0, i)
            grid.addWidget(value, 1, i)
            self.figures[key] = (caption, value)
        grid.setColumnStretch(5, 1)
        card.addLayout(grid)
        self.fit_bar = QProgressBar()
        self.fit_bar.setRange(0, 1000)
        self.fit_bar.setTextVisible(False)
        self.fit_bar.setFixedHeight(8)
        self.fit_bar.setAccessibleName("Memory needed compared with free memory")
        card.addWidget(self.fit_bar)
        self.fit_label = QLabel("")
        self.fit_label.setWordWrap(True)
        self.fit_label.setAccessibleName("Memory check")
        card.addWidget(self.fit_label)
        # The context length decides the KV cache: the one setting that turns "does not fit" into "fits".
        context_row = QHBoxLayout()
        context_caption = QLabel("Context length")
        context_caption.setObjectName("caption")
        self.context_box = QSpinBox()
        self.context_box.setRange(256, 256)
        self.context_box.setSingleStep(1024)
        self.context_box.setSuffix(" tokens")
        self.context_box.setGroupSeparatorShown(True)
        self.context_box.setKeyboardTracking(False)      # one re-plan per committed value, not per keystroke
        self.context_box.setAccessibleName("Context length used for the memory plan and the load")
        self.context_box.valueChanged.connect(self._context_edited)
        self.suggest_button = QPushButton("")
        self.suggest_button.setAccessibleName("Use the longest context that fits")
        self.suggest_button.clicked.connect(self._use_suggestion)
        self.suggest_button.hide()
        context_row.addWidget(context_caption)
        context_row.addWidget(self.context_box)
        context_row.addWidget(self.suggest_button)
        self.context_reason = QLabel("")
        self.context_reason.setObjectName("caption")
        self.context_reason.setAccessibleName("Why the context length cannot be changed")
        self.context_reason.hide()
        context_row.addWidget(self.context_reason)
        context_row.addStretch(1)
        card.addLayout(context_row)
        self._showing_plan = False
        layout.addWidget(self.card, 0)

        self.busy = False
        state.subscribe(lambda *_: self._refresh())
        self._refresh()

    # ------------------------------------------------------------------
    def selected_id(self) -> str:
        rows = self.table.selectionModel().selectedRows()
        return rows[0].data(Qt.UserRole) if rows else ""

    def select(self, model_id: str) -> None:
        for i, row in enumerate(self.state.rows):
            if row.id == model_id:
                self.table.selectRow(i)
                return

    def set_busy(self, busy: bool) -> None:
        self.busy = busy
        self._refresh()

    def show_plan(self, model_id: str, plan: dict) -> None:
        self.plans[model_id] = plan
        if model_id == self.selected_id():
            self._render_plan(plan)

    def _render_plan(self, plan) -> None:
        for key, (caption, value) in self.figures.items():
            value.setText(human_bytes(plan.get(key)) if plan else "—")
        if plan:
            ctx = plan.get("context_length")
            self.figures["kv_bytes"][0].setText(f"KV cache ({ctx:,} tokens)" if ctx else "KV cache")
            self.figures["free_bytes"][0].setText(f"Free {plan.get('device', '')}".strip())
            free = max(1, int(plan.get("free_bytes") or 1))
            self.fit_bar.setValue(min(1000, int(1000 * (plan.get("total_bytes") or 0) / free)))
            ok = plan.get("ok")
            self._showing_plan = True                 # programmatic value changes are not user edits
            longest = min(2**31 - 1, int(plan.get("max_context") or ctx or 256))   # a spin box holds an int32
            self.context_box.setRange(256, max(256, longest))
            if ctx:
                self.context_box.setValue(int(ctx))
            self._showing_plan = False
            suggestion = int(plan.get("suggested_context") or 0)
            self.suggest_button.setVisible(not ok and suggestion >= 256)
            self.suggest_button.setText(f"Use {suggestion:,} tokens")
            self.fit_label.setObjectName("fitOk" if ok else "fitBad")
            self.fit_label.setText(("✓ " if ok else "✕ ") + (plan.get("message") or ("Fits" if ok else "Does not fit")))
        else:
            self.suggest_button.hide()
            self.fit_bar.setValue(0)
            self.fit_label.setObjectName("muted")
            self.fit_label.setText("Checking memory…" if self.selected_id() else "")
        self.fit_label.style().unpolish(self.fit_label)
        self.fit_label.style().polish(self.fit_label)

    def _context_edited(self, tokens: int) -> None:
        model_id = self.selected_id()
        if model_id and not self._showing_plan:
            self.context_changed.emit(model_id, int(tokens))

    def _use_suggestion(self) -> None:
        plan = self.plans.get(self.selected_id()) or {}
        if plan.get("suggested_context"):
            self.context_box.setValue(int(plan["suggested_context"]))

    def _selection(self, *_):
        model_id = self.selected_id()
        self._refresh()
        if model_id:
            self.selection_changed.emit(model_id)

    def _refresh(self) -> None:
        model_id = self.selected_id()
        row = self.state.row(model_id) if model_id else None
        self.empty.setVisible(not self.state.rows)
        self.table.setVisible(bool(self.state.rows))
        self.default_button.setVisible(not any(r.id == "smollm2-135m-instruct" for r in self.state.rows))
        for b in (self.default_button, self.import_file_button, self.import_folder_button):
            b.setEnabled(not self.busy)
        self.inspect_button.setEnabled(row is not None)
        self.remove_button.setEnabled(row is not None and not self.busy)
        self.quantize_button.setEnabled(row is not None and not self.busy and row.quantization != "nvfp4")
        self.load_button.setEnabled(row is not None and not row.loaded and not self.busy)
        self.unload_button.setEnabled(row is not None and row.loaded and not self.busy)
        editable = row is not None and not row.loaded and not self.busy
        self.context_box.setEnabled(editable)
        # a disabled field says why (a loaded model's KV cache is already sized)
        reason = ("Unload the model to change its context length" if row is not None and row.loaded else
                  "Wait for the current task to finish" if row is not None and self.busy else "")
        self.context_reason.setText(reason)
        self.context_reason.setVisible(bool(reason))
        self.context_box.setToolTip(reason or "The context length the memory plan and the next load use")
        if row is None:
            self.detail_title.setText("Select a model to see whether it fits")
            self.path_label.setText("")
            self._render_plan(None)
        else:
            self.detail_title.setText(row.name)
            self.path_label.setText(f"{row.path}   ·   {row.source or 'imported'}")
            self._render_plan(self.plans.get(row.id))

    def _emit_selected(self, signal) -> None:
        model_id = self.selected_id()
        if model_id:
            signal.emit(model_id)

    def _load(self) -> None:
        model_id = self.selected_id()
        row = self.state.row(model_id)
        if row is None or row.loaded or self.busy:
            return
        self.load_requested.emit(model_id)

    def _remove(self) -> None:
        model_id = self.selected_id()
        row = self.state.row(model_id)
        if row is None:
            return
        answer = QMessageBox.question(self, "Remove model",
                                      f"Remove {row.name} from the library?")
        if answer == QMessageBox.Yes:
            self.remove_requested.emit(model_id)

    def _import_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Import a Hugging Face model folder")
        if path:
            self.import_requested.emit(path)

    def _import_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import a GGUF file", "", "GGUF models (*.gguf);;All files (*)")
        if path:
            self.import_requested.emit(path)
