"""No chat is lost: SIGKILL a process streaming a reply into the real store at random moments.

Each run starts tests/reliability/store_driver.py on one database and kills it (SIGKILL) at a
random line of its output, that is at a random point of creating the chat, adding messages or
streaming the reply. Then the store is reopened: PRAGMA integrity_check is "ok", every message the
driver had reported committed is there with its exact text, and the reply being streamed holds at
least the text the window had shown (and is no longer "streaming"). Chats of earlier runs must
survive every later kill too.

CI runs HEARTH_DURABILITY_RUNS (default 20) kills; the full count is
`HEARTH_DURABILITY_RUNS=100 pytest tests/reliability/test_store_durability.py -s`.
"""
from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import store_driver as driver

RUNS = int(os.environ.get("HEARTH_DURABILITY_RUNS", "20"))
DRIVER = Path(__file__).with_name("store_driver.py")
REPO = Path(__file__).resolve().parents[2]


def _kill_at(db: Path, run: int, line_no: int, rng: random.Random) -> list:
    """Start the driver, SIGKILL it when it prints its line_no-th line; return the lines it printed."""
    proc = subprocess.Popen([sys.executable, str(DRIVER), str(db), str(run), "400"], stdout=subprocess.PIPE,
                            text=True, cwd=REPO)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line.strip())
            if len(lines) >= line_no:
                # kill at once, or after a moment so the next write is caught half-way
                if rng.random() < 0.5:
                    for _ in range(rng.randrange(0, 20000)):
                        pass
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.wait()
        proc.stdout.close()
    return lines


def test_sigkill_while_streaming_loses_no_chat(tmp_path):
    from app.store import COMPLETE, STOPPED, ChatStore

    rng = random.Random(16)
    db = tmp_path / "chats.sqlite3"
    expected: dict = {}     # chat id -> (run, committed complete message ids, chunks shown or None)
    kills = 0
    lost: set = set()     # chats with a message missing or changed
    for run in range(RUNS):
        line_no = rng.choice([1, 2, 3, 4, 5]) if rng.random() < 0.2 else rng.randrange(5, 406)
        lines = _kill_at(db, run, line_no, rng)
        kills += lines[-1] != "finished" if lines else 1
        chat_id = next((l.split()[1] for l in lines if l.startswith("chat ")), None)
        if chat_id is None:
            continue
        complete = [int(l.split()[1]) for l in lines if l.startswith("complete ")]
        shown = [int(l.split()[1]) for l in lines if l.startswith("shown ")]
        expected[chat_id] = (run, complete, shown[-1] if shown else (0 if any(l.startswith("streaming") for l in lines)
                                                                      else None))

        check = sqlite3.connect(db)
        assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        check.close()
        store = ChatStore(db)
        try:
            for cid, (r, ids, chunks) in expected.items():
                messages = {m.id: m for m in store.messages(cid)}
                texts = [driver.question(r, 1), driver.answer(r), driver.question(r, 2)]
                for mid, text in zip(ids, texts):
                    if mid not in messages or messages[mid].content != text or messages[mid].state != COMPLETE:
                        lost.add(cid)
                if chunks is not None:
                    replies = [m for m in messages.values() if m.role == "assistant" and m.id not in ids]
                    if not replies:
                        lost.add(cid)
                        continue
                    reply = replies[-1]
                    shown = driver.reply_text(r, chunks)
                    if not reply.content.startswith(shown) or not driver.reply_text(r, 400).startswith(reply.content):
                        lost.add(cid)
                    assert reply.state in (STOPPED, COMPLETE)
        finally:
            store.close()
    print(f"\ndurability: {RUNS} runs, {kills} killed mid-write, {len(expected)} chats checked after every "
          f"later kill, {len(lost)} chats lost or damaged")
    assert not lost, sorted(lost)
    assert kills >= RUNS // 2
