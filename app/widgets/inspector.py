"""Checkpoint inspection: metadata, decoder config, execution plan (or why not), every tensor.

Works from headers alone (engine.inspect), so nothing needs to be loaded. The tensor table is a
QAbstractTableModel behind a QSortFilterProxyModel: thousands of rows filter as you type.
"""
from __future__ import annotations

from dataclasses import asdict, is_dataclass

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QSortFilterProxyModel, Qt, Signal
from PySide6.QtWidgets import (QAbstractItemView, QFileDialog, QFormLayout, QFrame, QHBoxLayout, QHeaderView,
                               QLabel, QLineEdit, QPushButton, QScrollArea, QSplitter, QTableView, QVBoxLayout,
                               QWidget)

from ..models.library import human_bytes, human_count

TENSOR_COLUMNS = ("Name", "Dtype", "Shape", "Bytes", "File")
EMPTY_HINT = ("Nothing inspected yet. Open a GGUF file or a Hugging Face folder above, or press Inspect on the "
              "Models page; the model you load shows here too.")


def natural_key(name: str) -> str:
    """layers.2 before layers.10: every run of digits compared as a number (zero-padded text, which
    the proxy model compares as a plain string)."""
    import re
    return re.sub(r"\d+", lambda m: m.group().zfill(10), name)


class TensorTableModel(QAbstractTableModel):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.tensors: list = []
        self.formats: dict = {}      # name -> (format, bits per weight) where it says more than the dtype

    def set_tensors(self, tensors, formats=None) -> None:
        self.beginResetModel()
        self.tensors = sorted(tensors, key=lambda t: natural_key(t.name))
        self.formats = dict(formats or {})
        self.endResetModel()

    def dtype_text(self, t) -> str:
        """The dtype, and for quantized checkpoints what it holds: "U8 · nvfp4 4.5 bpw"."""
        fmt = self.formats.get(t.name)
        if not fmt or fmt[0] == t.dtype.lower():
            return t.dtype
        return f"{t.dtype} · {fmt[0]}" + (f" {fmt[1]:.2f} bpw" if fmt[1] else "")

    def rowCount(self, parent=QModelIndex()):
        return 0 if parent.isValid() else len(self.tensors)

    def columnCount(self, parent=QModelIndex()):
        return 0 if parent.isValid() else len(TENSOR_COLUMNS)

    def headerData(self, section, orientation, role=Qt.DisplayRole):
        if orientation == Qt.Horizontal and role == Qt.DisplayRole:
            return TENSOR_COLUMNS[section]
        return None

    def data(self, index, role=Qt.DisplayRole):
        if not index.isValid():
            return None
        t = self.tensors[index.row()]
        col = index.column()
        if role == Qt.DisplayRole:
            return (t.name, self.dtype_text(t), " × ".join(str(d) for d in t.shape), human_bytes(t.bytes), t.file)[col]
        if role == Qt.UserRole:   # sort keys
            return (natural_key(t.name), t.dtype, "x".join(f"{d:012d}" for d in t.shape), t.bytes, t.file)[col]
        if role == Qt.TextAlignmentRole and col == 3:
            return int(Qt.AlignRight | Qt.AlignVCenter)
        if role == Qt.ToolTipRole:
            return f"{t.name}\n{t.dtype} {list(t.shape)}\n{t.bytes:,} bytes at offset {t.offset:,} in {t.file}"
        return None


class TensorFilter(QSortFilterProxyModel):
    """Filters on the name (any words, all must match), sorts on raw values."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.words: list[str] = []
        self.setSortRole(Qt.UserRole)

    def set_text(self, text: str) -> None:
        if hasattr(self, "beginFilterChange"):          # Qt 6.10+
            self.beginFilterChange()
            self.words = text.lower().split()
            self.endFilterChange(QSortFilterProxyModel.Direction.Rows)
        else:
            self.words = text.lower().split()
            self.invalidateRowsFilter()

    def filterAcceptsRow(self, row, parent):
        if not self.words:
            return True
        t = self.sourceModel().tensors[row]
        hay = f"{t.name} {t.dtype}".lower()
        return all(w in hay for w in self.words)


def _fields(obj) -> dict:
    if obj is None:
        return {}
    if isinstance(obj, dict):
        return obj
    if is_dataclass(obj):
        return asdict(obj)
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    return dict(vars(obj))


def _value(v) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {_value(x)}" for k, x in v.items()) or "—"
    if isinstance(v, (list, tuple)):
        return ", ".join(_value(x) for x in v) or "—"
    return "—" if v in (None, "") else str(v)


class Inspector(QWidget):
    inspect_path_requested = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("page")
        self.info = None
        self.key = ""
        layout = QVBoxLayout(self)
        layout.setContentsMargins(24, 20, 24, 20)
        layout.setSpacing(12)

        head = QHBoxLayout()
        titles = QVBoxLayout()
        titles.setSpacing(2)
        self.title = QLabel("Inspect a checkpoint")
        self.title.setObjectName("title")
        self.subtitle = QLabel("Read a model's structure from its headers, without loading it.")
        self.subtitle.setObjectName("muted")
        self.subtitle.setTextInteractionFlags(Qt.TextSelectableByMouse)
        titles.addWidget(self.title)
        titles.addWidget(self.subtitle)
        head.addLayout(titles, 1)
        self.open_folder = QPushButton("Open folder…")
        self.open_folder.setAccessibleName("Inspect a Hugging Face folder")
        self.open_folder.clicked.connect(self._pick_folder)
        self.open_file = QPushButton("Open GGUF…")
        self.open_file.setAccessibleName("Inspect a GGUF file")
        self.open_file.clicked.connect(self._pick_file)
        head.addWidget(self.open_folder, 0, Qt.AlignTop)
        head.addWidget(self.open_file, 0, Qt.AlignTop)
        layout.addLayout(head)

        self.summary = QLabel(EMPTY_HINT)
        self.summary.setWordWrap(True)
        self.summary.setObjectName("sectionTitle")
        self.summary.setAccessibleName("Inspection summary")
        layout.addWidget(self.summary)

        split = QSplitter(Qt.Horizontal)
        split.setChildrenCollapsible(False)
        # left: metadata, decoder, plan
        left_scroll = QScrollArea()
        left_scroll.setWidgetResizable(True)
        left_scroll.setMinimumWidth(330)
        left = QWidget()
        left.setObjectName("page")
        self.left_layout = QVBoxLayout(left)
        self.left_layout.setContentsMargins(0, 0, 8, 0)
        self.left_layout.setSpacing(12)
        self.meta_form = self._card("Model")
        self.plan_form = self._card("Execution plan")
        self.decoder_form = self._card("Decoder configuration")
        self.left_layout.addStretch(1)
        left_scroll.setWidget(left)
        split.addWidget(left_scroll)

        # right: tensors
        right = QFrame()
        right.setObjectName("card")
        rl = QVBoxLayout(right)
        rl.setContentsMargins(14, 12, 14, 14)
        rl.setSpacing(8)
        row = QHBoxLayout()
        self.tensor_title = QLabel("Tensors")
        self.tensor_title.setObjectName("sectionTitle")
        row.addWidget(self.tensor_title)
        row.addStretch(1)
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("Filter tensors (e.g. layers.0 attn)")
        self.filter.setAccessibleName("Filter tensors")
        self.filter.setClearButtonEnabled(True)
        self.filter.setMinimumWidth(260)
        row.addWidget(self.filter)
        rl.addLayout(row)
        self.tensor_model = TensorTableModel(self)
        self.proxy = TensorFilter(self)
        self.proxy.setSourceModel(self.tensor_model)
        self.filter.textChanged.connect(self._filter)
        self.table = QTableView()
        self.table.setAccessibleName("Tensors")
        self.table.setModel(self.proxy)
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(-1, Qt.AscendingOrder)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setAlternatingRowColors(True)
        self.table.setShowGrid(False)
        self.table.setWordWrap(False)
        self.table.verticalHeader().hide()
        self.table.verticalHeader().setDefaultSectionSize(26)
        h = self.table.horizontalHeader()
        h.setAccessibleName("Tensor columns (click to sort)")
        h.setSectionResizeMode(0, QHeaderView.Stretch)
        for c in range(1, len(TENSOR_COLUMNS)):
            h.setSectionResizeMode(c, QHeaderView.ResizeToContents)
        h.setDefaultAlignment(Qt.AlignLeft | Qt.AlignVCenter)
        rl.addWidget(self.table, 1)
        self.shown_label = QLabel("")
        self.shown_label.setObjectName("caption")
        rl.addWidget(self.shown_label)
        split.addWidget(right)
        split.setStretchFactor(0, 0)
        split.setStretchFactor(1, 1)
        split.setSizes([380, 800])
        layout.addWidget(split, 1)

    def _card(self, title: str) -> QFormLayout:
        card = QFrame()
        card.setObjectName("card")
        v = QVBoxLayout(card)
        v.setContentsMargins(16, 12, 16, 14)
        v.setSpacing(8)
        label = QLabel(title)
        label.setObjectName("sectionTitle")
        v.addWidget(label)
        form = QFormLayout()
        form.setHorizontalSpacing(16)
        form.setVerticalSpacing(5)
        form.setLabelAlignment(Qt.AlignLeft)
        v.addLayout(form)
        self.left_layout.addWidget(card)
        return form

    @staticmethod
    def _fill(form: QFormLayout, rows) -> None:
        while form.rowCount():
            form.removeRow(0)
        for label, value in rows:
            key = QLabel(label)
            key.setObjectName("muted")
            val = QLabel(value)
            val.setWordWrap(True)
            val.setTextInteractionFlags(Qt.TextSelectableByMouse)
            val.setAccessibleName(label)
            form.addRow(key, val)

    def show_info(self, key: str, info, name: str = "", source_quantization: str = "") -> None:
        self.info = info
        self.key = key
        meta = _fields(info.metadata)
        dec = _fields(info.decoder)
        n_tensors = len(info.tensors)
        params = meta.get("parameter_count") or 0
        self.title.setText(name or str(getattr(info, "path", key)).rstrip("/").split("/")[-1])
        self.subtitle.setText(f"{info.path}  ·  {getattr(info, 'format', '')}")
        self.summary.setText(f"{n_tensors:,} tensors  ·  {human_count(params)} parameters ({params:,})  ·  "
                             f"{human_bytes(getattr(info, 'total_bytes', 0))} on disk")
        dtypes = meta.get("dtypes") or {}
        self._fill(self.meta_form, [
            ("Architecture", _value(meta.get("architecture"))),
            ("Model type", _value(meta.get("model_type"))),
            ("Parameters", f"{params:,}"),
            ("Quantization", _value(meta.get("quantization")) + (
                f" (imported from {source_quantization})"
                if source_quantization and source_quantization.lower() != str(meta.get("quantization")).lower()
                else "")),
            ("Tensor types", ", ".join(f"{k} × {v}" for k, v in dtypes.items()) or "—"),
            ("Context length", _value(meta.get("context_length"))),
            ("Vocabulary", _value(meta.get("vocab_size"))),
            ("Tied embeddings", _value(meta.get("tied_embeddings"))),
            ("Tokenizer", _value(meta.get("has_tokenizer"))),
            ("Chat template", _value(meta.get("has_chat_template"))),
            ("Files", _value(len(getattr(info, "files", {}) or {}))),
        ] + self._scheme_rows(getattr(info, "quant_scheme", None)))
        kv = None
        if hasattr(info.decoder, "kv_bytes_per_token"):
            try:
                kv = info.decoder.kv_bytes_per_token()
            except Exception:
                kv = None
        plan = getattr(info, "plan", None)
        if plan is not None:
            p = _fields(plan)
            rows = [("Archetype", _value(p.get("archetype"))), ("Block", _value(p.get("block"))),
                    ("Attention", _value(p.get("attention"))),
                    ("Projection format", _value(p.get("projection_format")))]
            total, active = p.get("parameters") or 0, p.get("active_parameters") or 0
            if total and active != total:   # MoE: a token passes through only its top-k experts
                rows.append(("Parameters", f"{human_count(total)} total, {human_count(active)} active per token "
                                           f"({total:,} / {active:,})"))
            kv = p.get("kv_bytes_per_token", kv)
            shown = ("archetype", "block", "attention", "projection_format", "kv_bytes_per_token", "parameters",
                     "active_parameters")
            extra = [(k.replace("_", " ").capitalize(), _value(v)) for k, v in p.items()
                     if k not in shown and not isinstance(v, (dict, list))]
            rows += extra[:6]
        else:
            rows = [("Supported", "no"), ("Why", getattr(info, "plan_error", "") or "No execution plan")]
        rows.append(("KV cache per token", f"{human_bytes(kv)} ({kv:,} bytes, bf16)" if kv else "—"))
        self._fill(self.plan_form, rows)
        self._fill(self.decoder_form, [(k.replace("_", " "), _value(v)) for k, v in dec.items()])
        formats = ({t.name: info.tensor_format(t) for t in info.tensors}
                   if getattr(info, "quant_scheme", None) is not None and hasattr(info, "tensor_format") else {})
        self.tensor_model.set_tensors(info.tensors, formats)
        self._filter(self.filter.text())

    @staticmethod
    def _scheme_rows(scheme) -> list:
        if scheme is None:
            return []
        return [("NVFP4 layout", f"{scheme.layout}, blocks of {scheme.group_size}, activations {scheme.activations}"),
                ("Not quantized", _value(list(scheme.exclusions)))]

    def _filter(self, text: str) -> None:
        self.proxy.set_text(text)
        total = self.tensor_model.rowCount()
        shown = self.proxy.rowCount()
        self.tensor_title.setText(f"Tensors ({total:,})")
        self.shown_label.setText(f"Showing {shown:,} of {total:,}" if shown != total else f"{total:,} tensors")

    def _pick_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Inspect a Hugging Face model folder")
        if path:
            self.inspect_path_requested.emit(path)

    def _pick_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Inspect a GGUF file", "", "GGUF models (*.gguf);;All files (*)")
        if path:
            self.inspect_path_requested.emit(path)
