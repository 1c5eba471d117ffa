"""Tokenizer (Hugging Face `tokenizers`) and streaming detokenization.

The stream decoder emits only complete UTF-8: an emoji or CJK character split across tokens comes
out whole, once its last byte arrives.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from .errors import CorruptCheckpoint, TokenizerMissing


def _token_text(value) -> Optional[str]:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


@dataclass
class Tokenizer:
    inner: object                       # tokenizers.Tokenizer
    bos_token: Optional[str]
    eos_token: Optional[str]
    eos_ids: frozenset
    chat_template: Optional[str]
    add_bos: bool

    @classmethod
    def from_folder(cls, folder: Path, config: dict | None = None) -> "Tokenizer":
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.exists():
            raise TokenizerMissing(
                f"{folder.name} has no tokenizer.json, so Hearth cannot turn text into tokens. "
                "Scoring token ids still works; chat needs the tokenizer files from the model's source.")
        try:
            inner = load_tokenizer_json(path)
        except Exception as exc:  # the library raises a bare Exception on malformed files
            raise CorruptCheckpoint(f"tokenizer.json could not be read: {exc}") from None
        settings = {}
        if (folder / "tokenizer_config.json").exists():
            try:
                settings = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
            except ValueError as exc:
                raise CorruptCheckpoint(f"tokenizer_config.json is not valid JSON: {exc}") from None
        template = settings.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        if (folder / "chat_template.jinja").exists():
            template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
        bos = _token_text(settings.get("bos_token"))
        eos = _token_text(settings.get("eos_token"))
        eos_ids = set()
        for source in (config or {}, _read_json(folder / "generation_config.json")):
            value = source.get("eos_token_id")
            for e in (value if isinstance(value, list) else [value]):
                if isinstance(e, int):
                    eos_ids.add(e)
        if eos is not None and inner.token_to_id(eos) is not None:
            eos_ids.add(inner.token_to_id(eos))
        add_bos = bool(settings.get("add_bos_token", False))
        return cls(inner, bos, eos, frozenset(eos_ids), template, add_bos)

    def encode(self, text: str) -> list[int]:
        """Token ids of text, with special tokens in the text recognised and nothing added."""
        return self.inner.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.inner.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        return self.inner.get_vocab_size()

    def stream(self) -> "StreamDecoder":
        return StreamDecoder(self)


_BPE_STRINGS = ("unk_token", "continuing_subword_prefix", "end_of_word_suffix", "dropout")
_BPE_FLAGS = ("fuse_unk", "byte_fallback", "ignore_merges")


def load_tokenizer_json(path: Path):
    """A `tokenizers.Tokenizer` from tokenizer.json, built in steps that each hold the GIL briefly.

    `Tokenizer.from_file` parses and builds a large BPE vocabulary in one native call that holds the
    GIL for 60-90 ms, and so does one `json.loads` of a 3 MB file for 30-50 ms: long enough to freeze
    a Qt window whose engine runs in a worker thread. Here the vocabulary and merges are parsed in
    blocks of a few thousand entries, the pipeline (normalizer, pre-tokenizer, decoder, added tokens)
    is built around an empty model, and the BPE model is built last (~30 ms, the one step left that
    cannot be split). Other model types, and files laid out unexpectedly, load in one call.
    """
    import gc

    from tokenizers import Tokenizer as HFTokenizer, models

    text = path.read_bytes().decode("utf-8")
    # The vocabulary and merges are ~100k short-lived, acyclic objects: reference counting frees them.
    # Without this, creating them triggers a full cyclic collection of the whole heap (50-100 ms with
    # torch imported), which holds the GIL just like a long native call would.
    enabled = gc.isenabled()
    gc.disable()
    try:
        parts = _split_bpe_json(text)
        if parts is None:
            return HFTokenizer.from_str(text)
        data, vocab, merges = parts
        model = data["model"]
        skeleton = HFTokenizer.from_str(json.dumps(data))
        merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges]
        options = {k: model[k] for k in _BPE_STRINGS if model.get(k) is not None}
        options.update({k: bool(model[k]) for k in _BPE_FLAGS if k in model})
        skeleton.model = models.BPE(vocab=vocab, merges=merges, **options)
        return skeleton
    finally:
        if enabled:
            gc.enable()


_STRING = r'"(?:[^"\\]|\\.)*"'
_VOCAB_OPEN = re.compile(r'"model"\s*:\s*\{.*?"vocab"\s*:\s*\{', re.S)
_VOCAB_BLOCK = re.compile(r'(?:\s*' + _STRING + r'\s*:\s*-?\d+\s*,){1,4000}')
_VOCAB_LAST = re.compile(r'\s*(?:' + _STRING + r'\s*:\s*-?\d+\s*)?\}')
_MERGES_OPEN = re.compile(r'\s*,\s*"merges"\s*:\s*\[')
_MERGE = r'(?:' + _STRING + r'|\[\s*' + _STRING + r'\s*,\s*' + _STRING + r'\s*\])'
_MERGES_BLOCK = re.compile(r'(?:\s*' + _MERGE + r'\s*,){1,4000}')
_MERGES_LAST = re.compile(r'\s*(?:' + _MERGE + r'\s*)?\]')


def _split_bpe_json(text: str):
    """(settings without vocab and merges, vocab dict, merges list) parsed block by block, or None
    when the file is not a BPE tokenizer laid out as `tokenizers` writes it (then parse it whole)."""
    opened = _VOCAB_OPEN.search(text)
    if opened is None:
        return None
    vocab: dict = {}
    pos = opened.end()
    while (block := _VOCAB_BLOCK.match(text, pos)) is not None:
        vocab.update(json.loads("{" + block.group(0).rstrip().rstrip(",") + "}"))
        pos = block.end()
    last = _VOCAB_LAST.match(text, pos)
    if last is None:
        return None
    vocab.update(json.loads("{" + last.group(0)))
    vocab_end = last.end()
    opened_merges = _MERGES_OPEN.match(text, vocab_end)
    if opened_merges is None:
        return None
    merges: list = []
    pos = opened_merges.end()
    while (block := _MERGES_BLOCK.match(text, pos)) is not None:
        merges.extend(json.loads("[" + block.group(0).rstrip().rstrip(",") + "]"))
        pos = block.end()
    last = _MERGES_LAST.match(text, pos)
    if last is None:
        return None
    merges.extend(json.loads("[" + last.group(0)))
    rest = text[:opened.end()] + "}" + text[vocab_end:opened_merges.end()] + "]" + text[last.end():]
    try:
        data = json.loads(rest)
    except ValueError:
        return None
    model = data.get("model")
    if not isinstance(model, dict) or model.get("type") != "BPE" or model.get("vocab") != {} or model.get("merges") != []:
        return None
    return data, vocab, merges


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except ValueError:
        return {}


class StreamDecoder:
    """Turns token ids into text deltas, decoding only a short window each time."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        decode = self.tokenizer.decode
        prefix = decode(self.ids[self.prefix_offset:self.read_offset])
        text = decode(self.ids[self.prefix_offset:])
        if len(text) > len(prefix) and not text.endswith("\ufffd"):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return text[len(prefix):]
        return ""

    def flush(self) -> str:
        """What is left at the end (an incomplete character shows as U+FFFD, as the full decode would)."""
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset:self.read_offset])
        text = self.tokenizer.decode(self.ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.ids)
        return text[len(prefix):] if text.startswith(prefix) else ""
