"""Light and dark palettes that follow the system (Qt 6.5+ colorScheme), one accent colour."""
from __future__ import annotations

import os
from pathlib import Path
from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

from . import render

CHEVRON = (Path(__file__).resolve().parents[1] / "resources" / "chevron-down.svg").as_posix()


@dataclass(frozen=True)
class Theme:
    dark: bool
    window: str
    surface: str
    sunken: str
    border: str
    text: str
    muted: str
    accent: str
    accent_text: str
    accent_soft: str
    danger: str
    danger_soft: str
    success: str
    user_bubble: str

    @property
    def markdown(self) -> render.Palette:
        return render.DARK if self.dark else render.LIGHT


LIGHT = Theme(False, "#f4f5f7", "#ffffff", "#eceef1", "#dde1e6", "#1f2328", "#5f6874", "#c8541c", "#ffffff",
              "#fbe9df", "#b42318", "#fdecea", "#1a7f37", "#eef2f7")
DARK = Theme(True, "#131518", "#1b1e23", "#0f1114", "#2e333a", "#e6e9ee", "#98a1ad", "#f08a4b", "#1b1208",
             "#3a2619", "#f0766b", "#3b1d1b", "#4cc26a", "#252b33")

_current = LIGHT


def current() -> Theme:
    return _current


def system_is_dark(app: QApplication) -> bool:
    forced = os.environ.get("HEARTH_THEME", "").lower()
    if forced in ("dark", "light"):
        return forced == "dark"
    return app.styleHints().colorScheme() == Qt.ColorScheme.Dark


def apply(app: QApplication) -> Theme:
    global _current
    theme = DARK if system_is_dark(app) else LIGHT
    _current = theme
    app.setStyle("Fusion")
    p = QPalette()
    c = QColor
    p.setColor(QPalette.Window, c(theme.window))
    p.setColor(QPalette.WindowText, c(theme.text))
    p.setColor(QPalette.Base, c(theme.surface))
    p.setColor(QPalette.AlternateBase, c(theme.sunken))
    p.setColor(QPalette.Text, c(theme.text))
    p.setColor(QPalette.Button, c(theme.surface))
    p.setColor(QPalette.ButtonText, c(theme.text))
    p.setColor(QPalette.ToolTipBase, c(theme.surface))
    p.setColor(QPalette.ToolTipText, c(theme.text))
    p.setColor(QPalette.PlaceholderText, c(theme.muted))
    p.setColor(QPalette.Highlight, c(theme.accent))
    p.setColor(QPalette.HighlightedText, c(theme.accent_text))
    p.setColor(QPalette.Link, c(theme.markdown.link))
    p.setColor(QPalette.Mid, c(theme.border))
    for role in (QPalette.WindowText, QPalette.Text, QPalette.ButtonText):
        p.setColor(QPalette.Disabled, role, c(theme.muted))
    app.setPalette(p)
    app.setStyleSheet(stylesheet(theme))
    return theme


def stylesheet(t: Theme) -> str:
    CHEVRON_ = CHEVRON  # noqa: F841 (used in the f-string below)
    return f"""
QWidget {{ font-size: 10pt; }}
QMainWindow, QWidget#page {{ background: {t.window}; }}
QFrame#rail {{ background: {t.sunken}; border-right: 1px solid {t.border}; }}
QToolButton#railButton {{ border: none; border-radius: 8px; padding: 8px 4px; color: {t.muted};
    font-weight: 600; min-width: 64px; }}
QToolButton#railButton:hover {{ background: {t.surface}; color: {t.text}; }}
QToolButton#railButton:checked {{ background: {t.accent_soft}; color: {t.accent}; }}
QFrame#card, QFrame#sidePanel {{ background: {t.surface}; border: 1px solid {t.border}; border-radius: 10px; }}
QLabel#title {{ font-size: 15pt; font-weight: 600; }}
QLabel#sectionTitle {{ font-size: 11pt; font-weight: 600; }}
QLabel#muted, QLabel#caption {{ color: {t.muted}; }}
QLabel#caption {{ font-size: 9pt; }}
QLabel#figure {{ font-size: 13pt; font-weight: 600; }}
QLabel#fitOk {{ color: {t.success}; font-weight: 600; }}
QLabel#fitBad {{ color: {t.danger}; font-weight: 600; }}
QPushButton {{ background: {t.surface}; border: 1px solid {t.border}; border-radius: 7px;
    padding: 6px 14px; }}
QPushButton:hover {{ border-color: {t.accent}; }}
QPushButton:disabled {{ color: {t.muted}; background: {t.sunken}; }}
QPushButton#primary {{ background: {t.accent}; color: {t.accent_text}; border: 1px solid {t.accent};
    font-weight: 600; }}
QPushButton#primary:disabled {{ background: {t.sunken}; color: {t.muted}; border-color: {t.border}; }}
QPushButton#danger {{ color: {t.danger}; }}
QLineEdit, QPlainTextEdit, QComboBox {{ background: {t.surface};
    border: 1px solid {t.border}; border-radius: 7px; padding: 5px 8px; selection-background-color: {t.accent}; }}
QSpinBox, QDoubleSpinBox {{ background: {t.surface}; color: {t.text}; border: 1px solid {t.border};
    border-radius: 7px; padding: 4px 6px; min-height: 20px; selection-background-color: {t.accent}; }}
QSpinBox::up-button, QSpinBox::down-button, QDoubleSpinBox::up-button, QDoubleSpinBox::down-button {{
    width: 0px; border: none; }}
QLineEdit:focus, QPlainTextEdit:focus, QSpinBox:focus, QDoubleSpinBox:focus, QComboBox:focus {{
    border-color: {t.accent}; }}
QLineEdit:disabled, QPlainTextEdit:disabled, QSpinBox:disabled, QDoubleSpinBox:disabled, QComboBox:disabled {{
    color: {t.muted}; background: {t.sunken}; }}
QComboBox::drop-down {{ border: none; width: 26px; }}
QComboBox::down-arrow {{ image: url({CHEVRON_}); width: 12px; height: 12px; }}
QComboBox QAbstractItemView {{ background: {t.surface}; border: 1px solid {t.border}; selection-background-color: {t.accent_soft};
    selection-color: {t.text}; outline: none; padding: 4px; }}
QPlainTextEdit#composer {{ border-radius: 10px; padding: 8px 10px; }}
QTableView, QListWidget {{ background: {t.surface}; border: 1px solid {t.border}; border-radius: 8px;
    gridline-color: {t.border}; selection-background-color: {t.accent_soft}; selection-color: {t.text};
    alternate-background-color: {t.window}; }}
QListWidget::item {{ padding: 8px 8px; border-radius: 6px; }}
QListWidget::item:selected {{ background: {t.accent_soft}; color: {t.text}; }}
QHeaderView::section {{ background: {t.sunken}; color: {t.muted}; border: none;
    border-bottom: 1px solid {t.border}; padding: 6px 8px; font-weight: 600; }}
QProgressBar {{ background: {t.sunken}; border: none; border-radius: 5px; height: 10px; text-align: center;
    color: transparent; }}
QProgressBar::chunk {{ background: {t.accent}; border-radius: 5px; }}
QFrame#banner {{ background: {t.danger_soft}; border: 1px solid {t.danger}; border-radius: 10px; }}
QFrame#banner[level="info"] {{ background: {t.accent_soft}; border-color: {t.accent}; }}
QLabel#bannerTitle {{ font-weight: 700; color: {t.danger}; }}
QFrame#banner[level="info"] QLabel#bannerTitle {{ color: {t.accent}; }}
QFrame#progressStrip {{ background: {t.surface}; border: 1px solid {t.border}; border-radius: 10px; }}
QFrame#userBubble {{ background: {t.user_bubble}; border-radius: 12px; }}
QFrame#assistantMessage {{ background: transparent; }}
QLabel#role {{ font-weight: 700; }}
QFrame#codeBlock {{ background: {t.sunken}; border: 1px solid {t.border}; border-radius: 8px; }}
QTextEdit#code {{ background: transparent; border: none; padding: 2px 4px; }}
QTextEdit#code QScrollBar:horizontal {{ background: transparent; height: 10px; margin: 0; }}
QTextEdit#code QScrollBar::handle:horizontal {{ background: {t.border}; border-radius: 4px; min-width: 30px; }}
QTextEdit#code QScrollBar::add-line, QTextEdit#code QScrollBar::sub-line {{ width: 0; }}
QTextEdit#code QScrollBar::add-page, QTextEdit#code QScrollBar::sub-page {{ background: transparent; }}
QToolButton#messageAction {{ color: {t.muted}; border: none; padding: 2px 6px; border-radius: 5px; }}
QToolButton#messageAction:hover {{ color: {t.accent}; background: {t.accent_soft}; }}
QScrollArea {{ border: none; background: transparent; }}
QScrollArea > QWidget > QWidget#messages {{ background: {t.window}; }}
QTabWidget::pane {{ border: 1px solid {t.border}; border-radius: 8px; background: {t.surface}; top: -1px; }}
QTabBar::tab {{ padding: 7px 16px; border: none; color: {t.muted}; font-weight: 600; }}
QTabBar::tab:selected {{ color: {t.accent}; border-bottom: 2px solid {t.accent}; }}
QSplitter::handle {{ background: transparent; }}
QStatusBar {{ background: {t.sunken}; color: {t.muted}; border-top: 1px solid {t.border}; }}
QStatusBar QLabel {{ color: {t.muted}; padding: 0 8px; }}
"""
