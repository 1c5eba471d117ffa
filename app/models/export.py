"""Chats as files: JSON (the store's export, which imports back unchanged) and Markdown (to read or share).

Qt-free. The JSON keeps, for every reply, the model id, the weights' sha256, the sampling parameters and
the seed, so a reply can be reproduced; Markdown shows them under each reply.
"""
from __future__ import annotations

import json
import re
import time

from ..store import ChatStore


def chat_markdown(data: dict) -> str:
    """One exported chat (ChatStore.export_chat's dict) as Markdown."""
    lines = [f"# {data.get('title') or 'Chat'}", ""]
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(data.get("created_at") or time.time()))
    lines.append(f"*Exported from Hearth · started {when}*")
    lines.append("")
    if data.get("system_prompt"):
        lines += ["**System prompt:**", "", "> " + data["system_prompt"].replace("\n", "\n> "), ""]
    for m in data.get("messages", []):
        if m["role"] == "user":
            lines += ["## You", "", m["content"], ""]
            continue
        lines += [f"## {m.get('model_id') or 'Assistant'}", "", m["content"], ""]
        p = m.get("params") or {}
        facts = [f"model `{m.get('model_id')}`"] if m.get("model_id") else []
        if m.get("weights_sha256"):
            facts.append(f"weights sha256 `{str(m['weights_sha256'])[:16]}…`")
        sampling = ", ".join(f"{k} {p[k]}" for k in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                                                      "max_tokens") if p.get(k) is not None)
        if sampling:
            facts.append(sampling)
        if m.get("seed") is not None:
            facts.append(f"seed {m['seed']}")
        if m.get("state") not in (None, "complete"):
            facts.append(m["state"])
        if facts:
            lines += ["<sub>" + " · ".join(facts) + "</sub>", ""]
    return "\n".join(lines).rstrip() + "\n"


def export_all(store: ChatStore) -> dict:
    """Every chat, newest first, in one JSON-ready dict."""
    return {"format": "hearth-chats", "version": 1,
            "chats": [store.export_chat(c.id) for c in store.list_chats()]}


def import_file_data(store: ChatStore, data) -> list:
    """Import one chat export or an export of all chats; returns the new chats (ValueError if neither)."""
    if isinstance(data, dict) and data.get("format") == "hearth-chats":
        return [store.import_chat(chat) for chat in data.get("chats", [])]
    return [store.import_chat(data)]


def read_json(path) -> object:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"Could not read {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON ({exc.msg} at line {exc.lineno}).") from None


def safe_file_name(title: str) -> str:
    name = re.sub(r"[^\w\- ]+", "", title).strip().replace(" ", "-")[:60]
    return name or "chat"
