"""Hearth's desktop app (Qt / PySide6). The engine package never imports this."""
