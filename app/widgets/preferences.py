"""Settings as a page: defaults for new loads, the look, how Enter behaves, where things live, and
the plain statement that nothing is sent anywhere. Saved in the profile's settings.ini."""
from __future__ import annotations

from PySide6.QtCore import QUrl, Qt, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (QComboBox, QFormLayout, QFrame, QHBoxLayout, QLabel, QPushButton, QSpinBox,
                               QVBoxLayout, QWidget)

DEFAULTS = {"context": 0, "precision": "fast", "theme": "system", "send_key": "enter"}


class Preferences(QWidget):
    changed = Signal(dict)       # the whole set, after any edit

    def __init__(self, home: str, parent=None):
        super().__init__(parent)
        self.setObjectName("page")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(24, 20, 24, 20)
        layout.setSpacing(14)
        title = QLabel("Settings")
        title.setObjectName("title")
        layout.addWidget(title)

        loads = self._card(layout, "Loading models")
        self.context = QSpinBox()
        self.context.setRange(0, 1 << 20)
        self.context.setSingleStep(1024)
        self.context.setSpecialValueText("the model's default (8,192 at most)")
        self.context.setSuffix(" tokens")
        self.context.setGroupSeparatorShown(True)
        self.context.setKeyboardTracking(False)
        self.context.setMinimumWidth(260)
        self.context.setAccessibleName("Default context length")
        self.context.setToolTip("Used for models without a context length of their own (set on the Models page)")
        loads.addRow("Default context length", self.context)
        self.precision = QComboBox()
        self.precision.setAccessibleName("Precision")
        self.precision.addItem("Fast (16-bit products)", "fast")
        self.precision.addItem("Exact (fp32-accurate, slower)", "exact")
        self.precision.setToolTip("How the GPU backend multiplies; the CPU backend always computes exactly")
        loads.addRow("Precision", self.precision)

        look = self._card(layout, "Appearance and keys")
        self.theme = QComboBox()
        self.theme.setAccessibleName("Theme")
        for value, label in (("system", "Follow the system"), ("light", "Light"), ("dark", "Dark")):
            self.theme.addItem(label, value)
        look.addRow("Theme", self.theme)
        self.send_key = QComboBox()
        self.send_key.setAccessibleName("Key that sends a message")
        self.send_key.addItem("Enter sends, Shift+Enter is a new line", "enter")
        self.send_key.addItem("Ctrl+Enter sends, Enter is a new line", "ctrl-enter")
        look.addRow("Sending", self.send_key)

        where = self._card(layout, "Your data")
        row = QHBoxLayout()
        self.home_label = QLabel(home)
        self.home_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.home_label.setAccessibleName("Data folder")
        self.open_home = QPushButton("Open folder")
        self.open_home.setAccessibleName("Open the data folder")
        self.open_home.clicked.connect(lambda: QDesktopServices.openUrl(QUrl.fromLocalFile(home)))
        row.addWidget(self.home_label, 1)
        row.addWidget(self.open_home)
        holder = QWidget()
        holder.setLayout(row)
        where.addRow("Library and chats", holder)
        move = QLabel("To keep them elsewhere, start Hearth with --home FOLDER or set HEARTH_HOME.")
        move.setObjectName("caption")
        move.setWordWrap(True)
        where.addRow("", move)
        telemetry = QLabel("None. Hearth sends nothing anywhere: no usage data, no crash reports, no update checks.")
        telemetry.setWordWrap(True)
        telemetry.setAccessibleName("Telemetry")
        where.addRow("Telemetry", telemetry)
        layout.addStretch(1)

        self._quiet = False
        for box in (self.precision, self.theme, self.send_key):
            box.currentIndexChanged.connect(self._changed)
        self.context.valueChanged.connect(self._changed)

    @staticmethod
    def _card(layout, title: str) -> QFormLayout:
        card = QFrame()
        card.setObjectName("card")
        v = QVBoxLayout(card)
        v.setContentsMargins(16, 12, 16, 14)
        label = QLabel(title)
        label.setObjectName("sectionTitle")
        v.addWidget(label)
        form = QFormLayout()
        form.setHorizontalSpacing(16)
        form.setVerticalSpacing(8)
        v.addLayout(form)
        card.setMaximumWidth(860)
        layout.addWidget(card)
        return form

    def values(self) -> dict:
        return {"context": int(self.context.value()), "precision": self.precision.currentData(),
                "theme": self.theme.currentData(), "send_key": self.send_key.currentData()}

    def set_values(self, values: dict) -> None:
        v = {**DEFAULTS, **(values or {})}
        self._quiet = True
        self.context.setValue(int(v["context"] or 0))
        for box, key in ((self.precision, "precision"), (self.theme, "theme"), (self.send_key, "send_key")):
            box.setCurrentIndex(max(0, box.findData(v[key])))
        self._quiet = False

    def _changed(self, *_) -> None:
        if not self._quiet:
            self.changed.emit(self.values())
