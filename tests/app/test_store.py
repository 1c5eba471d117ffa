"""The chat store: WAL, every message with its provenance, streaming rewrites, recovery, search."""
import sqlite3

from app.store import COMPLETE, STOPPED, STREAMING, ChatStore


def test_chats_messages_and_provenance(tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite3")
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    chat = store.create_chat("First", model_id="m", system_prompt="Be brief.", params={"temperature": 0.2})
    store.add_message(chat.id, "user", "hello")
    reply = store.add_message(chat.id, "assistant", "", state=STREAMING, model_id="m", weights_sha256="ab" * 32,
                              params={"temperature": 0.2, "seed": 7}, seed=7)
    store.update_message(reply.id, content="hi th")
    store.close()

    # Another connection (as after a kill) sees what was flushed, then recovery marks it stopped.
    raw = sqlite3.connect(tmp_path / "chats.sqlite3")
    assert raw.execute("SELECT content, state FROM messages WHERE id = ?", (reply.id,)).fetchone() == ("hi th", STREAMING)
    raw.close()
    store = ChatStore(tmp_path / "chats.sqlite3")
    messages = store.messages(chat.id)
    assert [(m.role, m.content, m.state) for m in messages] == [("user", "hello", COMPLETE), ("assistant", "hi th", STOPPED)]
    m = messages[1]
    assert (m.model_id, m.weights_sha256, m.seed, m.params) == ("m", "ab" * 32, 7, {"temperature": 0.2, "seed": 7})
    c = store.chat(chat.id)
    assert (c.title, c.system_prompt, c.params) == ("First", "Be brief.", {"temperature": 0.2})


def test_truncate_rename_search_delete(tmp_path):
    store = ChatStore(tmp_path / "c.db")
    a = store.create_chat("Alpha")
    b = store.create_chat("Beta")
    for text in ("one", "two 100%", "three"):
        store.add_message(a.id, "user", text)
    store.truncate(a.id, 1)
    assert [m.content for m in store.messages(a.id)] == ["one"]
    assert store.add_message(a.id, "assistant", "again").position == 1
    store.rename_chat(b.id, "  ")
    assert store.chat(b.id).title == "Untitled chat"
    assert [c.id for c in store.list_chats("again")] == [a.id]
    assert [c.id for c in store.list_chats("untitled")] == [b.id]
    assert store.list_chats("100%") == []          # % is matched literally
    store.delete_chat(a.id)
    assert store.messages(a.id) == [] and [c.id for c in store.list_chats()] == [b.id]
