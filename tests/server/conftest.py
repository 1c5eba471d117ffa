"""Server tests: a real uvicorn on 127.0.0.1 (a free port), the official `openai` client, and the real
default model on the torch backend (the session's `default_engine`)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).parent))   # appended: tests/app imports its own `conftest` by name

from conftest_helpers import MODEL  # noqa: E402


@pytest.fixture(scope="session")
def server(default_engine):
    from engine.server import Server, ServerConfig

    srv = Server(default_engine, ServerConfig(port=0)).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def keyed_server(default_engine):
    from engine.server import Server, ServerConfig

    srv = Server(default_engine, ServerConfig(port=0, api_key="sesame-123")).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=300)


@pytest.fixture
def alone(default_engine):
    """alone(messages, **params) -> (text, stats) of the same chat run in-process, by itself."""
    from engine.engine import Finished
    from engine.sampling import SamplingParams

    def run(messages, **params):
        tokens = default_engine.conversation_tokens(MODEL, messages)
        for event in default_engine.generate_tokens(MODEL, tokens, SamplingParams(**params)):
            if isinstance(event, Finished):
                return event.text, event.stats

    return run
