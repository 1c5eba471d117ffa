"""Markdown to the HTML subset Qt's rich-text engine draws, with highlighted code blocks.

Qt-free. Fenced code is cut out before Markdown runs and highlighted by Pygments with inline
colours (QTextDocument has no stylesheet classes), inside a one-cell table because table cells are
where Qt reliably paints a background. A fence still open (a reply mid-stream) renders as code.
Raw HTML in the text is shown as text, never interpreted.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass

import markdown
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name, guess_lexer
from pygments.util import ClassNotFound


@dataclass(frozen=True)
class Palette:
    text: str
    muted: str
    code_bg: str
    code_border: str
    inline_code_bg: str
    link: str
    pygments_style: str


LIGHT = Palette("#1f2328", "#656d76", "#f6f8fa", "#d8dee4", "#eef1f4", "#0969da", "default")
DARK = Palette("#e6edf3", "#8d96a0", "#161b22", "#30363d", "#2a3038", "#4493f8", "github-dark")

_FENCE = re.compile(r"^([ \t]*)(```|~~~)[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:^\1\2[ \t]*$|\Z)",
                    re.MULTILINE | re.DOTALL)
_PLACEHOLDER = "HEARTHCODEBLOCK{}X"
_MONO = "'DejaVu Sans Mono', 'Cascadia Mono', Consolas, 'SF Mono', monospace"


def _markdown() -> markdown.Markdown:
    md = markdown.Markdown(extensions=["tables", "sane_lists"], output_format="html")
    # Show raw HTML as text: a reply is data, not markup.
    md.preprocessors.deregister("html_block")
    md.inlinePatterns.deregister("html")
    return md


_md = _markdown()


def _lexer(language: str, code: str):
    if language:
        try:
            return get_lexer_by_name(language.lower())
        except ClassNotFound:
            pass
    try:
        lexer = guess_lexer(code) if len(code) > 40 else TextLexer()
        return lexer
    except ClassNotFound:
        return TextLexer()


def code_block_html(code: str, language: str, palette: Palette) -> str:
    code = code.rstrip("\n")
    formatter = HtmlFormatter(nowrap=True, noclasses=True, style=palette.pygments_style)
    body = highlight(code, _lexer(language, code), formatter).rstrip("\n") if code else ""
    label = html.escape(language or "code")
    return (
        f'<table width="100%" cellspacing="0" cellpadding="10" bgcolor="{palette.code_bg}" '
        f'style="border: 1px solid {palette.code_border}; margin-top: 6px; margin-bottom: 6px;">'
        f'<tr><td><div style="color: {palette.muted}; font-size: small;">{label}</div>'
        f'<pre style="font-family: {_MONO}; white-space: pre; margin: 0;">{body}</pre>'
        f'</td></tr></table>')


def split_segments(text: str) -> list:
    """[("text", "", markdown) | ("code", language, code)]: a reply cut where its fenced code blocks are,
    so each block can be its own widget (scrolled sideways, never wrapped, with its own Copy)."""
    segments, at = [], 0
    for match in _FENCE.finditer(text):
        if match.start() > at and text[at:match.start()].strip():
            segments.append(("text", "", text[at:match.start()]))
        segments.append(("code", match.group(3) or "", match.group(4).rstrip("\n")))
        at = match.end()
    if text[at:].strip() or not segments:
        segments.append(("text", "", text[at:]))
    return segments


def code_html(code: str, language: str, palette: Palette) -> str:
    """Highlighted code for a code-block widget: pre-formatted, never wrapped."""
    formatter = HtmlFormatter(nowrap=True, noclasses=True, style=palette.pygments_style)
    body = highlight(code, _lexer(language, code), formatter).rstrip("\n") if code else ""
    return (f'<pre style="font-family: {_MONO}; white-space: pre; margin: 0; color: {palette.text};">'
            f'{body}</pre>')


def render_markdown(text: str, palette: Palette = LIGHT) -> str:
    blocks: list[str] = []

    def cut(match: re.Match) -> str:
        blocks.append(code_block_html(match.group(4), match.group(3), palette))
        return "\n\n" + _PLACEHOLDER.format(len(blocks) - 1) + "\n\n"

    source = _FENCE.sub(cut, text)
    _md.reset()
    out = _md.convert(source)
    for i, block in enumerate(blocks):
        token = _PLACEHOLDER.format(i)
        out = out.replace(f"<p>{token}</p>", block).replace(token, block)
    out = out.replace("<code>", f'<code style="font-family: {_MONO}; background-color: {palette.inline_code_bg};">')
    out = out.replace("<a href=", f'<a style="color: {palette.link};" href=')
    return out
