"""Right-hand panel of the chat: live figures, system prompt, sampling parameters."""
from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (QComboBox, QDoubleSpinBox, QFormLayout, QFrame, QGridLayout, QLabel, QPlainTextEdit,
                               QProgressBar, QScrollArea, QSpinBox, QVBoxLayout, QWidget)

DEFAULT_PARAMS = {"temperature": 0.7, "top_p": 0.95, "top_k": 40, "min_p": 0.05,
                  "repetition_penalty": 1.1, "seed": None, "max_tokens": 512, "context_policy": "stop"}
POLICY_LABELS = (("stop", "Stop and say so"), ("drop-oldest", "Drop the oldest turns"),
                 ("rolling", "Rolling window (half the context)"))


class SettingsPanel(QScrollArea):
    params_changed = Signal(dict)
    system_prompt_changed = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setFixedWidth(292)
        self.setFrameShape(QFrame.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        inner = QWidget()
        inner.setObjectName("page")
        layout = QVBoxLayout(inner)
        layout.setContentsMargins(0, 0, 10, 0)
        layout.setSpacing(12)

        # live figures
        figures = self._card(layout, "This reply")
        grid = QGridLayout()
        grid.setHorizontalSpacing(14)
        grid.setVerticalSpacing(0)
        self.ttft = self._figure(grid, 0, "Time to first token")
        self.rate = self._figure(grid, 1, "Tokens / s")
        figures.addLayout(grid)
        self.context_label = QLabel("Context —")
        self.context_label.setObjectName("caption")
        self.context_label.setAccessibleName("Context used")
        figures.addWidget(self.context_label)
        self.context_bar = QProgressBar()
        self.context_bar.setTextVisible(False)
        self.context_bar.setFixedHeight(6)
        self.context_bar.setAccessibleName("Context used of the limit")
        figures.addWidget(self.context_bar)

        # system prompt
        sp = self._card(layout, "System prompt")
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setAccessibleName("System prompt")
        self.system_prompt.setPlaceholderText("e.g. You are a concise assistant.")
        self.system_prompt.setFixedHeight(84)
        self._sp_timer = QTimer(self)
        self._sp_timer.setSingleShot(True)
        self._sp_timer.setInterval(400)
        self._sp_timer.timeout.connect(self._emit_system_prompt)
        self.system_prompt.textChanged.connect(self._sp_timer.start)
        sp.addWidget(self.system_prompt)

        # sampling
        sampling = self._card(layout, "Sampling")
        form = QFormLayout()
        form.setHorizontalSpacing(12)
        form.setFieldGrowthPolicy(QFormLayout.FieldsStayAtSizeHint)
        form.setFormAlignment(Qt.AlignLeft | Qt.AlignTop)
        form.setVerticalSpacing(6)
        self.temperature = self._double(form, "Temperature", 0.0, 2.0, 0.05, 2)
        self.top_p = self._double(form, "Top-p", 0.01, 1.0, 0.01, 2)
        self.top_k = self._int(form, "Top-k", 0, 1000, "off")
        self.min_p = self._double(form, "Min-p", 0.0, 1.0, 0.01, 2)
        self.repetition_penalty = self._double(form, "Repetition penalty", 0.5, 2.0, 0.01, 2)
        self.seed = self._int(form, "Seed", -1, 2**31 - 1, "random")
        self.max_tokens = self._int(form, "Max tokens", 1, 32768)
        sampling.addLayout(form)
        self.context_policy = QComboBox()
        self.context_policy.setAccessibleName("When the chat outgrows the context")
        self.context_policy.setToolTip("When this chat no longer fits in the loaded context: stop with that "
                                       "message, drop the oldest turns (the system prompt stays), or keep a "
                                       "rolling window of the newest turns")
        for value, label in POLICY_LABELS:
            self.context_policy.addItem(label, value)
        self.context_policy.currentIndexChanged.connect(self._changed)
        policy_caption = QLabel("When the chat outgrows the context")
        policy_caption.setObjectName("caption")
        sampling.addWidget(policy_caption)
        sampling.addWidget(self.context_policy)
        hint = QLabel("Temperature 0 is greedy. Each reply stores its seed, so it can be reproduced.")
        hint.setObjectName("caption")
        hint.setWordWrap(True)
        sampling.addWidget(hint)
        layout.addStretch(1)
        self.setWidget(inner)
        self._quiet = False
        self.set_params(DEFAULT_PARAMS)

    def _card(self, layout, title):
        card = QFrame()
        card.setObjectName("card")
        v = QVBoxLayout(card)
        v.setContentsMargins(14, 12, 14, 12)
        v.setSpacing(8)
        label = QLabel(title)
        label.setObjectName("sectionTitle")
        v.addWidget(label)
        layout.addWidget(card)
        return v

    def _figure(self, grid, col, caption):
        c = QLabel(caption)
        c.setObjectName("caption")
        v = QLabel("—")
        v.setObjectName("figure")
        v.setAccessibleName(caption)
        grid.addWidget(c, 0, col)
        grid.addWidget(v, 1, col)
        return v

    def _double(self, form, label, lo, hi, step, decimals):
        box = QDoubleSpinBox()
        box.setRange(lo, hi)
        box.setSingleStep(step)
        box.setDecimals(decimals)
        box.setAccessibleName(label)
        box.setFixedWidth(96)
        box.valueChanged.connect(self._changed)
        form.addRow(label, box)
        return box

    def _int(self, form, label, lo, hi, special=None):
        box = QSpinBox()
        box.setRange(lo, hi)
        if special:
            box.setSpecialValueText(special)
        box.setFixedWidth(96)
        box.setAccessibleName(label)
        box.valueChanged.connect(self._changed)
        form.addRow(label, box)
        return box

    def params(self) -> dict:
        seed = self.seed.value()
        return {"temperature": round(self.temperature.value(), 4), "top_p": round(self.top_p.value(), 4),
                "top_k": self.top_k.value(), "min_p": round(self.min_p.value(), 4),
                "repetition_penalty": round(self.repetition_penalty.value(), 4),
                "seed": None if seed < 0 else seed, "max_tokens": self.max_tokens.value(),
                "context_policy": self.context_policy.currentData() or "stop"}

    def set_params(self, params: dict) -> None:
        p = {**DEFAULT_PARAMS, **{k: v for k, v in (params or {}).items() if k in DEFAULT_PARAMS}}
        self._quiet = True
        self.temperature.setValue(float(p["temperature"]))
        self.top_p.setValue(float(p["top_p"]))
        self.top_k.setValue(int(p["top_k"]))
        self.min_p.setValue(float(p["min_p"]))
        self.repetition_penalty.setValue(float(p["repetition_penalty"]))
        self.seed.setValue(-1 if p["seed"] is None else int(p["seed"]))
        self.max_tokens.setValue(int(p["max_tokens"]))
        index = self.context_policy.findData(p["context_policy"])
        self.context_policy.setCurrentIndex(max(0, index))
        self._quiet = False

    def set_system_prompt(self, text: str) -> None:
        self.system_prompt.blockSignals(True)
        self.system_prompt.setPlainText(text or "")
        self.system_prompt.blockSignals(False)

    def _emit_system_prompt(self) -> None:
        self.system_prompt_changed.emit(self.system_prompt.toPlainText())

    def _changed(self, *_):
        if not self._quiet:
            self.params_changed.emit(self.params())

    def show_live(self, live: dict) -> None:
        from ..models.library import human_duration
        if live.get("ttft_s") is not None:
            self.ttft.setText(human_duration(live["ttft_s"]))
        if live.get("tokens_per_s"):
            self.rate.setText(f"{live['tokens_per_s']:.1f}")
        self.show_context(live.get("context_used"), live.get("context_limit"))

    def show_stats(self, stats: dict) -> None:
        self.show_live(stats)

    def show_context(self, used, limit) -> None:
        if used is not None and limit:
            self.context_label.setText(f"Context {int(used):,} / {int(limit):,} tokens")
            self.context_bar.setRange(0, int(limit))
            self.context_bar.setValue(min(int(used), int(limit)))

    def clear_figures(self) -> None:
        self.ttft.setText("—")
        self.rate.setText("—")
        self.context_label.setText("Context —")
        self.context_bar.setValue(0)
