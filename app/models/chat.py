"""The open chat: its messages, the reply being streamed, and the edits a user can make.

Qt-free. Every change goes to the ChatStore at once (a streaming reply on each flush), then
listeners hear about it: listener(event, payload) with events "opened", "message-added",
"message-updated", "messages-truncated", "messages-reset", "streaming-started", "streaming-finished".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .observable import Observable

from ..store import COMPLETE, ERROR, STOPPED, STREAMING, ChatStore, StoredChat, StoredMessage, reply_of

TITLE_CHARS = 48


def alternatives_of(message: StoredMessage) -> list:
    """Every other reply kept for this message (regenerate), in order, this one not included."""
    return list((message.alternatives or {}).get("others", []))


def alternative_position(message: StoredMessage) -> tuple:
    """(index, count) of the reply shown among its alternatives; count 0 when it has none."""
    others = alternatives_of(message)
    return (int(message.alternatives.get("index", 0)), len(others) + 1) if others else (0, 0)


@dataclass(frozen=True)
class GenerationRequest:
    """What the worker needs to produce one reply."""
    chat_id: str
    model_id: str
    system_prompt: str
    turns: list          # [{"role", "content"}], ends with the user's message
    params: dict         # SamplingParams fields, with a concrete seed
    reply_id: int        # the stored assistant message that receives the tokens


@dataclass
class ChatState(Observable):
    store: ChatStore
    chat: Optional[StoredChat] = None
    messages: list = field(default_factory=list)      # [StoredMessage]
    streams: dict = field(default_factory=dict)       # chat id -> its reply being streamed (several at once)
    _listeners: list = field(default_factory=list)

    # --- choosing a chat -------------------------------------------------------------------
    def open(self, chat_id: str) -> None:
        self.chat = self.store.chat(chat_id)
        self.messages = self.store.messages(chat_id)
        live = self.streams.get(chat_id)
        if live is not None:   # a reply still streaming into this chat: keep it live
            self.messages = [live if m.id == live.id else m for m in self.messages]
        self._emit("opened", self.chat)

    @property
    def streaming(self) -> Optional[StoredMessage]:
        """The open chat's reply being streamed, if any."""
        return self.streams.get(self.chat.id) if self.chat is not None else None

    @property
    def any_busy(self) -> bool:
        return bool(self.streams)

    def new_chat(self, model_id: Optional[str] = None, system_prompt: str = "",
                 params: Optional[dict] = None) -> StoredChat:
        chat = self.store.create_chat("New chat", model_id, system_prompt, params)
        self.open(chat.id)
        return chat

    def close(self) -> None:
        self.chat, self.messages = None, []
        self._emit("opened", None)

    @property
    def busy(self) -> bool:
        """The open chat is replying (other chats may be too)."""
        return self.streaming is not None

    def set_system_prompt(self, text: str) -> None:
        if self.chat is not None:
            self.store.update_chat(self.chat.id, system_prompt=text)
            self.chat.system_prompt = text

    def set_params(self, params: dict) -> None:
        if self.chat is not None:
            self.store.update_chat(self.chat.id, params=params)
            self.chat.params = dict(params)

    # --- turning user actions into requests -------------------------------------------------
    def send(self, text: str, model_id: str, weights_sha256: Optional[str], params: dict) -> GenerationRequest:
        self._require_idle()
        text = text.strip()
        if not text:
            raise ValueError("nothing to send")
        if self.chat.title == "New chat" and not any(m.role == "user" for m in self.messages):
            title = " ".join(text.replace("*", "").replace("`", "").replace("#", "").split()) or "Chat"
            title = title if len(title) <= TITLE_CHARS else title[:TITLE_CHARS - 1].rstrip() + "…"
            self.store.rename_chat(self.chat.id, title)
            self.chat.title = title
        self._add("user", text)
        return self._start_reply(model_id, weights_sha256, params)

    def can_regenerate(self) -> bool:
        return (not self.busy and bool(self.messages) and self.messages[-1].role == "assistant"
                and any(m.role == "user" for m in self.messages))

    def regenerate(self, model_id: str, weights_sha256: Optional[str], params: dict) -> GenerationRequest:
        """A new reply to the same history; the earlier ones stay as alternatives to page through."""
        self._require_idle()
        if not self.can_regenerate():
            raise ValueError("there is no reply to regenerate")
        old = self.messages[-1]
        others = alternatives_of(old)
        if old.state != ERROR:     # a failed reply is not worth keeping
            others.insert(int((old.alternatives or {}).get("index", 0)) if others else 0, reply_of(old))
        self._truncate(len(self.messages) - 1)
        request = self._start_reply(model_id, weights_sha256, params)
        if others:
            self.streaming.alternatives = {"index": len(others), "others": others}
            self.store.update_message(self.streaming.id, alternatives=self.streaming.alternatives)
        return request

    def show_alternative(self, message_id: int, step: int) -> None:
        """Page through a reply's alternatives (‹ ›): the one shown is the one the chat continues from."""
        self._require_idle()
        message = next((m for m in self.messages if m.id == message_id), None)
        if message is None or not message.alternatives:
            return
        index = int(message.alternatives.get("index", 0))
        replies = list(message.alternatives.get("others", []))
        replies.insert(index, reply_of(message))
        target = max(0, min(len(replies) - 1, index + step))
        if target == index:
            return
        chosen = replies.pop(target)
        for name, value in chosen.items():
            setattr(message, name, value)
        message.alternatives = {"index": target, "others": replies}
        self.store.update_message(message.id, reply=chosen, alternatives=message.alternatives)
        self._emit("message-updated", message)

    def delete_message(self, message_id: int) -> None:
        """Remove one message (a failed reply, say) from the chat and the store."""
        self._require_idle()
        message = next((m for m in self.messages if m.id == message_id), None)
        if message is None:
            return
        self.store.delete_message(message_id)
        self.messages.remove(message)
        self._emit("messages-reset", self.messages)

    def edit_message(self, message_id: int, text: str, model_id: str, weights_sha256: Optional[str],
                     params: dict) -> GenerationRequest:
        """Replace one of your messages (any, not only the last), drop what came after it, ask again.
        The engine reuses its cached prefix up to the edit."""
        self._require_idle()
        index = next((i for i, m in enumerate(self.messages) if m.id == message_id), None)
        if index is None or self.messages[index].role != "user":
            raise ValueError("only your own messages can be edited")
        text = text.strip()
        if not text:
            raise ValueError("nothing to send")
        self._truncate(index)
        self._add("user", text)
        return self._start_reply(model_id, weights_sha256, params)

    def last_user_text(self) -> Optional[str]:
        for m in reversed(self.messages):
            if m.role == "user":
                return m.content
        return None

    def edit_last_user(self, text: str, model_id: str, weights_sha256: Optional[str],
                       params: dict) -> GenerationRequest:
        """Replace the last user message (and everything after it) and ask again."""
        self._require_idle()
        positions = [i for i, m in enumerate(self.messages) if m.role == "user"]
        if not positions:
            raise ValueError("there is no message to edit")
        self._truncate(positions[-1])
        self._add("user", text.strip())
        return self._start_reply(model_id, weights_sha256, params)

    # --- the reply as it streams --------------------------------------------------------------
    def _stream(self, chat_id: Optional[str]) -> Optional[StoredMessage]:
        if chat_id is None:
            return self.streaming
        return self.streams.get(chat_id)

    def stream_for_reply(self, reply_id: int) -> Optional[StoredMessage]:
        return next((m for m in self.streams.values() if m.id == reply_id), None)

    def append(self, text: str, chat_id: Optional[str] = None) -> None:
        message = self._stream(chat_id)
        if message is not None and text:
            message.content += text
            self._emit("message-updated", message)

    def flush(self, chat_id: Optional[str] = None) -> None:
        """Write what has been shown so far; cheap (one UPDATE in WAL mode)."""
        message = self._stream(chat_id)
        if message is not None:
            self.store.update_message(message.id, content=message.content)

    def finish(self, stats: Optional[dict], chat_id: Optional[str] = None) -> None:
        message = self._stream(chat_id)
        if message is None:
            return
        reason = (stats or {}).get("stop_reason")
        message.state = STOPPED if reason == "cancelled" else COMPLETE
        message.stats = stats
        self.store.update_message(message.id, content=message.content, state=message.state, stats=stats)
        del self.streams[message.chat_id]
        self._emit("message-updated", message)
        self._emit("streaming-finished", message)

    def fail(self, error: str, chat_id: Optional[str] = None) -> None:
        """The engine raised: keep the partial reply, mark it."""
        message = self._stream(chat_id)
        if message is None:
            return
        message.state = ERROR
        message.stats = {"error": error}
        self.store.update_message(message.id, content=message.content, state=ERROR, stats=message.stats)
        del self.streams[message.chat_id]
        self._emit("message-updated", message)
        self._emit("streaming-finished", message)

    # --- internals -------------------------------------------------------------------------
    def _require_idle(self) -> None:
        if self.chat is None:
            raise ValueError("no chat is open")
        if self.busy:
            raise ValueError("a reply is still being written")

    def _add(self, role: str, content: str, **extra) -> StoredMessage:
        message = self.store.add_message(self.chat.id, role, content, **extra)
        self.messages.append(message)
        self._emit("message-added", message)
        return message

    def _truncate(self, keep: int) -> None:
        self.store.truncate(self.chat.id, keep)
        del self.messages[keep:]
        self._emit("messages-truncated", keep)

    def _start_reply(self, model_id: str, weights_sha256: Optional[str], params: dict) -> GenerationRequest:
        params = dict(params)
        if params.get("seed") is None:
            import secrets
            params["seed"] = secrets.randbits(31)
        turns = [m.as_turn() for m in self.messages]
        if self.chat.model_id != model_id:
            self.store.update_chat(self.chat.id, model_id=model_id)
            self.chat.model_id = model_id
        reply = self._add("assistant", "", state=STREAMING, model_id=model_id,
                          weights_sha256=weights_sha256, params=params, seed=params["seed"])
        self.streams[self.chat.id] = reply
        self._emit("streaming-started", reply)
        return GenerationRequest(self.chat.id, model_id, self.chat.system_prompt or "", turns, params, reply.id)
