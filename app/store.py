"""Chats on disk: one SQLite database (WAL) under the Hearth home folder.

Qt-free. Every message is a row; a reply being streamed is a row too, rewritten as it grows
(state "streaming"), so killing the app mid-reply keeps what was on screen. A finished message
is "complete"; one the user stopped is "stopped"; one cut short by an error is "error".
Each assistant message records the model id, the weights' sha256, the sampling parameters
and the seed it was produced with.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

SCHEMA_VERSION = 2      # 2: messages.alternatives (earlier replies kept by regenerate)
EXPORT_FORMAT = "hearth-chat"
EXPORT_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS chats (
    id            TEXT PRIMARY KEY,
    title         TEXT NOT NULL,
    model_id      TEXT,
    system_prompt TEXT NOT NULL DEFAULT '',
    params        TEXT NOT NULL DEFAULT '{}',
    created_at    REAL NOT NULL,
    updated_at    REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    chat_id        TEXT NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    position       INTEGER NOT NULL,
    role           TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
    content        TEXT NOT NULL,
    state          TEXT NOT NULL DEFAULT 'complete',
    model_id       TEXT,
    weights_sha256 TEXT,
    params         TEXT,
    seed           INTEGER,
    stats          TEXT,
    alternatives   TEXT,
    created_at     REAL NOT NULL,
    updated_at     REAL NOT NULL,
    UNIQUE (chat_id, position)
);
CREATE INDEX IF NOT EXISTS messages_by_chat ON messages(chat_id, position);
"""

COMPLETE, STREAMING, STOPPED, ERROR = "complete", "streaming", "stopped", "error"
# What one reply is: the columns an alternative keeps, and what paging swaps in.
REPLY_FIELDS = ("content", "state", "model_id", "weights_sha256", "params", "seed", "stats")


def hearth_home() -> Path:
    """$HEARTH_HOME if set, else the platform's user data folder."""
    env = os.environ.get("HEARTH_HOME")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_dir
    return Path(user_data_dir("hearth", appauthor=False))


@dataclass
class StoredMessage:
    id: int
    chat_id: str
    position: int
    role: str
    content: str
    state: str = COMPLETE
    model_id: Optional[str] = None
    weights_sha256: Optional[str] = None
    params: Optional[dict] = None
    seed: Optional[int] = None
    stats: Optional[dict] = None
    created_at: float = 0.0
    updated_at: float = 0.0
    # Other replies to the same history (regenerate keeps them): {"index": where this reply sits among
    # all of them, "others": [reply dicts (REPLY_FIELDS)]}; {} when there is only this one.
    alternatives: dict = field(default_factory=dict)

    def as_turn(self) -> dict:
        return {"role": self.role, "content": self.content}


@dataclass
class StoredChat:
    id: str
    title: str
    model_id: Optional[str] = None
    system_prompt: str = ""
    params: dict = field(default_factory=dict)
    created_at: float = 0.0
    updated_at: float = 0.0


class ChatStore:
    """All chats and messages. One connection, used from the thread that made it (the GUI's)."""

    def __init__(self, path: Optional[os.PathLike] = None):
        if path is None:
            path = hearth_home() / "chats.sqlite3"
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), isolation_level=None)  # autocommit; explicit txns
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")   # WAL + NORMAL: durable across a process kill
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(_SCHEMA)
        columns = {r[1] for r in self._db.execute("PRAGMA table_info(messages)")}
        if "alternatives" not in columns:      # a version-1 database: add the column, keep every row
            self._db.execute("ALTER TABLE messages ADD COLUMN alternatives TEXT")
        self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        self.recover_interrupted()

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    # --- chats -------------------------------------------------------------------------------
    def create_chat(self, title: str = "New chat", model_id: Optional[str] = None,
                    system_prompt: str = "", params: Optional[dict] = None) -> StoredChat:
        now = time.time()
        chat = StoredChat(uuid.uuid4().hex, title, model_id, system_prompt, dict(params or {}), now, now)
        self._db.execute(
            "INSERT INTO chats (id, title, model_id, system_prompt, params, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (chat.id, chat.title, chat.model_id, chat.system_prompt, json.dumps(chat.params), now, now))
        return chat

    def chat(self, chat_id: str) -> StoredChat:
        row = self._db.execute("SELECT * FROM chats WHERE id = ?", (chat_id,)).fetchone()
        if row is None:
            raise KeyError(chat_id)
        return self._chat(row)

    def list_chats(self, search: str = "") -> list[StoredChat]:
        """Most recently used first. `search` matches the title or any message's text."""
        if search:
            pattern = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            rows = self._db.execute(
                "SELECT * FROM chats WHERE title LIKE ?1 ESCAPE '\\' OR id IN"
                " (SELECT chat_id FROM messages WHERE content LIKE ?1 ESCAPE '\\')"
                " ORDER BY updated_at DESC", (pattern,)).fetchall()
        else:
            rows = self._db.execute("SELECT * FROM chats ORDER BY updated_at DESC").fetchall()
        return [self._chat(r) for r in rows]

    def update_chat(self, chat_id: str, *, title: Optional[str] = None, model_id: Optional[str] = None,
                    system_prompt: Optional[str] = None, params: Optional[dict] = None) -> None:
        sets, args = [], []
        for column, value in (("title", title), ("model_id", model_id),
                              ("system_prompt", system_prompt)):
            if value is not None:
                sets.append(f"{column} = ?")
                args.append(value)
        if params is not None:
            sets.append("params = ?")
            args.append(json.dumps(params))
        sets.append("updated_at = ?")
        args.append(time.time())
        self._db.execute(f"UPDATE chats SET {', '.join(sets)} WHERE id = ?", (*args, chat_id))

    def rename_chat(self, chat_id: str, title: str) -> None:
        self.update_chat(chat_id, title=title.strip() or "Untitled chat")

    def delete_chat(self, chat_id: str) -> None:
        self._db.execute("DELETE FROM chats WHERE id = ?", (chat_id,))

    # --- messages ----------------------------------------------------------------------------
    def messages(self, chat_id: str) -> list[StoredMessage]:
        rows = self._db.execute("SELECT * FROM messages WHERE chat_id = ? ORDER BY position",
                                (chat_id,)).fetchall()
        return [self._message(r) for r in rows]

    def add_message(self, chat_id: str, role: str, content: str, *, state: str = COMPLETE,
                    model_id: Optional[str] = None, weights_sha256: Optional[str] = None,
                    params: Optional[dict] = None, seed: Optional[int] = None,
                    stats: Optional[dict] = None) -> StoredMessage:
        now = time.time()
        with self._txn():
            row = self._db.execute("SELECT COALESCE(MAX(position) + 1, 0) FROM messages WHERE chat_id = ?",
                                   (chat_id,)).fetchone()
            position = int(row[0])
            cur = self._db.execute(
                "INSERT INTO messages (chat_id, position, role, content, state, model_id, weights_sha256,"
                " params, seed, stats, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (chat_id, position, role, content, state, model_id, weights_sha256,
                 _dumps(params), seed, _dumps(stats), now, now))
            self._db.execute("UPDATE chats SET updated_at = ? WHERE id = ?", (now, chat_id))
        return StoredMessage(cur.lastrowid, chat_id, position, role, content, state, model_id,
                             weights_sha256, params, seed, stats, now, now)

    def update_message(self, message_id: int, *, content: Optional[str] = None,
                       state: Optional[str] = None, stats: Optional[dict] = None,
                       seed: Optional[int] = None, alternatives: Optional[dict] = None,
                       reply: Optional[dict] = None) -> None:
        """One statement, committed at once: used for every flush of a streaming reply.
        `reply` replaces every REPLY_FIELDS column (paging through alternatives)."""
        sets, args = ["updated_at = ?"], [time.time()]
        if reply is not None:
            for name in REPLY_FIELDS:
                sets.append(f"{name} = ?")
                value = reply.get(name)
                args.append(_dumps(value) if name in ("params", "stats") else value)
        if alternatives is not None:
            sets.append("alternatives = ?")
            args.append(json.dumps(alternatives))
        if content is not None:
            sets.append("content = ?")
            args.append(content)
        if state is not None:
            sets.append("state = ?")
            args.append(state)
        if stats is not None:
            sets.append("stats = ?")
            args.append(_dumps(stats))
        if seed is not None:
            sets.append("seed = ?")
            args.append(seed)
        self._db.execute(f"UPDATE messages SET {', '.join(sets)} WHERE id = ?", (*args, message_id))

    def delete_message(self, message_id: int) -> None:
        self._db.execute("DELETE FROM messages WHERE id = ?", (message_id,))

    # --- export and import ------------------------------------------------------------------
    def export_chat(self, chat_id: str) -> dict:
        """A chat as plain data (JSON-ready): every message with its model, weights hash, sampling and seed."""
        chat = self.chat(chat_id)
        return {"format": EXPORT_FORMAT, "version": EXPORT_VERSION, "title": chat.title, "model_id": chat.model_id,
                "system_prompt": chat.system_prompt, "params": chat.params, "created_at": chat.created_at,
                "updated_at": chat.updated_at,
                "messages": [{"role": m.role, "content": m.content, "state": m.state, "model_id": m.model_id,
                              "weights_sha256": m.weights_sha256, "params": m.params, "seed": m.seed,
                              "stats": m.stats, "alternatives": m.alternatives, "created_at": m.created_at}
                             for m in self.messages(chat_id)]}

    def import_chat(self, data: dict) -> StoredChat:
        """A new chat from export_chat's data (a new id: importing twice gives two chats)."""
        if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
            raise ValueError("This file is not a Hearth chat export (its \"format\" is not \"hearth-chat\").")
        if int(data.get("version", 0)) > EXPORT_VERSION:
            raise ValueError(f"This chat was exported by a newer Hearth (format version {data.get('version')}).")
        messages = data.get("messages") or []
        for m in messages:
            if not isinstance(m, dict) or m.get("role") not in ("user", "assistant") \
                    or not isinstance(m.get("content"), str):
                raise ValueError("This chat export has a message without a role (user or assistant) or text.")
        now = time.time()
        created = float(data.get("created_at") or now)
        chat = StoredChat(uuid.uuid4().hex, str(data.get("title") or "Imported chat"), data.get("model_id"),
                          str(data.get("system_prompt") or ""), dict(data.get("params") or {}), created,
                          float(data.get("updated_at") or created))
        with self._txn():
            self._db.execute(
                "INSERT INTO chats (id, title, model_id, system_prompt, params, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (chat.id, chat.title, chat.model_id, chat.system_prompt, json.dumps(chat.params), chat.created_at,
                 chat.updated_at))
            for position, m in enumerate(messages):
                state = m.get("state") or COMPLETE
                at = float(m.get("created_at") or created)
                self._db.execute(
                    "INSERT INTO messages (chat_id, position, role, content, state, model_id, weights_sha256,"
                    " params, seed, stats, alternatives, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (chat.id, position, m["role"], m["content"], STOPPED if state == STREAMING else state,
                     m.get("model_id"), m.get("weights_sha256"), _dumps(m.get("params")), m.get("seed"),
                     _dumps(m.get("stats")), json.dumps(m.get("alternatives") or {}), at, at))
        return chat

    def truncate(self, chat_id: str, keep: int) -> None:
        """Drop every message at position >= keep (regenerate, edit-and-resend)."""
        self._db.execute("DELETE FROM messages WHERE chat_id = ? AND position >= ?", (chat_id, keep))

    def recover_interrupted(self) -> int:
        """A reply still 'streaming' at startup was cut off by an exit or a crash: mark it stopped."""
        cur = self._db.execute("UPDATE messages SET state = ? WHERE state = ?", (STOPPED, STREAMING))
        return cur.rowcount

    # --- helpers -----------------------------------------------------------------------------
    def _txn(self):
        db = self._db

        class _T:
            def __enter__(self_):
                db.execute("BEGIN IMMEDIATE")

            def __exit__(self_, exc_type, exc, tb):
                db.execute("ROLLBACK" if exc_type else "COMMIT")
                return False
        return _T()

    @staticmethod
    def _chat(row) -> StoredChat:
        return StoredChat(row["id"], row["title"], row["model_id"], row["system_prompt"],
                          json.loads(row["params"] or "{}"), row["created_at"], row["updated_at"])

    @staticmethod
    def _message(row) -> StoredMessage:
        return StoredMessage(row["id"], row["chat_id"], row["position"], row["role"], row["content"],
                             row["state"], row["model_id"], row["weights_sha256"], _loads(row["params"]),
                             row["seed"], _loads(row["stats"]), row["created_at"], row["updated_at"],
                             json.loads(row["alternatives"] or "{}"))


def _dumps(value) -> Optional[str]:
    return None if value is None else json.dumps(value)


def reply_of(message: "StoredMessage") -> dict:
    return {name: getattr(message, name) for name in REPLY_FIELDS}


def _loads(text) -> Optional[dict]:
    return None if text is None else json.loads(text)
