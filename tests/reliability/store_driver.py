"""A process that writes chats into the real SQLite store the way the app does, until it is killed.

    python tests/reliability/store_driver.py DB RUN

Run RUN creates one chat, adds a user message and a complete assistant reply, a second user message,
then streams a second reply (state "streaming"), one UPDATE per chunk, as app/models/chat.py's
flush does. After each write has returned (committed) it prints what is now on disk:
"chat ID", "complete MESSAGE_ID", "shown CHARS". The parent (test_store_durability.py) SIGKILLs it
at a random line, so whatever it printed last is what the window had shown, and must survive.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.store import COMPLETE, STREAMING, ChatStore  # noqa: E402


def reply_text(run: int, chunks: int) -> str:
    """The reply of run `run` after `chunks` chunks (the parent knows it too)."""
    return "".join(chunk(run, k) for k in range(chunks))


def chunk(run: int, k: int) -> str:
    return f"r{run}w{k} " + ("é" if k % 7 == 0 else "") + ("\n" if k % 11 == 10 else "")


def question(run: int, n: int) -> str:
    return f"question {n} of run {run}: " + "lorem ipsum " * (run % 5)


def answer(run: int) -> str:
    return f"the complete answer of run {run}. " * 20


def main(argv) -> int:
    db, run = Path(argv[0]), int(argv[1])
    max_chunks = int(argv[2]) if len(argv) > 2 else 4000
    store = ChatStore(db)
    chat = store.create_chat(title=f"run {run}", model_id="m")
    print(f"chat {chat.id}", flush=True)
    for role, text in (("user", question(run, 1)), ("assistant", answer(run)), ("user", question(run, 2))):
        m = store.add_message(chat.id, role, text, model_id="m" if role == "assistant" else None)
        print(f"complete {m.id}", flush=True)
    reply = store.add_message(chat.id, "assistant", "", state=STREAMING, model_id="m", seed=run)
    print(f"streaming {reply.id}", flush=True)
    content = ""
    for k in range(max_chunks):
        content += chunk(run, k)
        store.update_message(reply.id, content=content)
        print(f"shown {k + 1}", flush=True)
    store.update_message(reply.id, content=content, state=COMPLETE, stats={"generated_tokens": max_chunks})
    print("finished", flush=True)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
