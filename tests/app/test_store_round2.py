"""The chat store's second round: alternatives kept across restarts, a version-1 database still opens,
export and import as plain data, and bad import files refused with a sentence."""
import json
import sqlite3

import pytest

from app.models import export
from app.models.chat import ChatState, alternative_position
from app.store import ChatStore


def test_a_version_1_database_opens_and_keeps_its_messages(tmp_path):
    path = tmp_path / "chats.sqlite3"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE chats (id TEXT PRIMARY KEY, title TEXT NOT NULL, model_id TEXT, system_prompt TEXT NOT NULL
            DEFAULT '', params TEXT NOT NULL DEFAULT '{}', created_at REAL NOT NULL, updated_at REAL NOT NULL);
        CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, chat_id TEXT NOT NULL, position INTEGER NOT NULL,
            role TEXT NOT NULL, content TEXT NOT NULL, state TEXT NOT NULL DEFAULT 'complete', model_id TEXT,
            weights_sha256 TEXT, params TEXT, seed INTEGER, stats TEXT, created_at REAL NOT NULL,
            updated_at REAL NOT NULL, UNIQUE (chat_id, position));
        INSERT INTO chats VALUES ('c', 'Old', NULL, '', '{}', 1, 1);
        INSERT INTO messages (chat_id, position, role, content, created_at, updated_at) VALUES ('c', 0, 'user', 'hi', 1, 1);
        PRAGMA user_version=1;""")
    db.close()
    store = ChatStore(path)
    [m] = store.messages("c")
    assert m.content == "hi" and m.alternatives == {}
    store.close()


def test_regenerate_keeps_alternatives_and_paging_survives_a_restart(tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite3")
    chat = ChatState(store)
    chat.new_chat("m")
    chat.send("hello", "m", "ab", {"seed": 1})
    chat.append("first")
    chat.finish({"stop_reason": "eos"})
    chat.regenerate("m", "ab", {"seed": 2})
    chat.append("second")
    chat.finish({"stop_reason": "eos"})
    reply = chat.messages[-1]
    assert alternative_position(reply) == (1, 2)
    chat.show_alternative(reply.id, -1)
    store.close()
    store = ChatStore(tmp_path / "chats.sqlite3")
    again = store.messages(chat.chat.id)[-1]
    assert again.content == "first" and again.seed == 1 and alternative_position(again) == (0, 2)
    assert again.alternatives["others"][0]["content"] == "second"
    store.close()


def test_export_import_round_trip_and_bad_files(tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite3")
    chat = store.create_chat("Trip", "m", "Be brief.", {"temperature": 0.2})
    store.add_message(chat.id, "user", "where?")
    store.add_message(chat.id, "assistant", "```sh\nls\n```", model_id="m", weights_sha256="ab" * 32,
                      params={"temperature": 0.2, "seed": 5}, seed=5, stats={"generated_tokens": 3})
    data = store.export_chat(chat.id)
    copy = store.import_chat(json.loads(json.dumps(data)))
    again = store.export_chat(copy.id)
    assert {k: v for k, v in again.items() if k != "updated_at"} == {k: v for k, v in data.items() if k != "updated_at"}
    md = export.chat_markdown(data)
    assert md.startswith("# Trip") and "weights sha256 `abababab" in md and "seed 5" in md and "```sh" in md

    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="is not JSON"):
        export.read_json(bad)
    with pytest.raises(ValueError, match="not a Hearth chat export"):
        export.import_file_data(store, {"messages": []})
    with pytest.raises(ValueError, match="without a role"):
        store.import_chat({"format": "hearth-chat", "version": 1, "messages": [{"role": "robot", "content": "x"}]})
    with pytest.raises(ValueError, match="newer Hearth"):
        store.import_chat({"format": "hearth-chat", "version": 99, "messages": []})
    assert len(store.list_chats()) == 2
    store.close()


def test_fit_turns_drops_whole_oldest_pairs_and_keeps_the_last_message():
    from app.worker import fit_turns

    turns = [{"role": r, "content": str(i)} for i, r in enumerate(["user", "assistant"] * 4 + ["user"])]

    def count(ts):
        return 100 * len(ts)
    assert fit_turns(turns, count, 1000, 50, "stop") == (turns, 0)
    kept, dropped = fit_turns(turns, count, 800, 50, "drop-oldest")
    assert dropped == 2 and kept == turns[2:]                # just enough: 700 + 50 <= 800
    kept, dropped = fit_turns(turns, count, 800, 50, "rolling")
    assert dropped == 6 and kept == turns[6:] and count(kept) <= 400   # down to half
    kept, dropped = fit_turns(turns[-1:], count, 50, 10, "drop-oldest")
    assert kept == turns[-1:] and dropped == 0               # the last message always stays
