"""Remote endpoints, tested against Hearth's own server started in the test (real HTTP on 127.0.0.1)."""
from __future__ import annotations

import socket

import pytest

from conftest_helpers import MODEL, Relay

HELLO = [{"role": "user", "content": "Name three colours."}]


def test_models_and_chat_stream_through_a_remote_client(server, alone):
    from engine.engine import Finished, TextDelta
    from engine.remote import RemoteClient
    from engine.sampling import SamplingParams

    client = RemoteClient(f"http://127.0.0.1:{server.port}")     # /v1 is added
    assert client.base_url.endswith("/v1") and MODEL in client.models()
    events = list(client.chat_stream(MODEL, HELLO, SamplingParams(temperature=0, max_tokens=12)))
    text, stats = alone(HELLO, temperature=0, max_tokens=12)
    assert all(isinstance(e, TextDelta) for e in events[:-1]) and isinstance(events[-1], Finished)
    assert "".join(e.text for e in events[:-1]) == events[-1].text == text
    s = events[-1].stats
    assert (s.generated_tokens, s.prompt_tokens, s.stop_reason) == (12, stats.prompt_tokens, "max-tokens")
    assert s.ttft_s > 0 and s.tokens_per_s > 0


def test_auth_failure_is_clear(keyed_server):
    from engine.remote import RemoteAuthFailed, RemoteClient

    with pytest.raises(RemoteAuthFailed, match="refused the API key"):
        RemoteClient(keyed_server.url, api_key="wrong").models()
    with pytest.raises(RemoteAuthFailed):
        list(RemoteClient(keyed_server.url).chat_stream(MODEL, HELLO))
    assert MODEL in RemoteClient(keyed_server.url, api_key="sesame-123").models()


def test_unreachable_endpoint_is_clear():
    from engine.remote import RemoteClient, RemoteUnreachable

    with socket.socket() as s:                      # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RemoteUnreachable, match="Cannot reach"):
        RemoteClient(f"http://127.0.0.1:{port}/v1").models()
    with pytest.raises(RemoteUnreachable):
        list(RemoteClient(f"http://127.0.0.1:{port}/v1").chat_stream(MODEL, HELLO))


def test_timeout_is_clear(server):
    from engine.remote import RemoteClient, RemoteTimeout
    from engine.sampling import SamplingParams

    with pytest.raises(RemoteTimeout, match="did not answer"):
        list(RemoteClient(server.url, timeout=1e-4, connect_timeout=1e-4).chat_stream(
            MODEL, HELLO, SamplingParams(max_tokens=50)))


def test_endpoint_errors_carry_its_message(server):
    from engine.remote import RemoteClient, RemoteRefused

    with pytest.raises(RemoteRefused, match="HTTP 404.*no-such-model") as caught:
        list(RemoteClient(server.url).chat_stream("no-such-model", HELLO))
    assert caught.value.status == 404


def test_a_dropped_connection_keeps_the_text_as_stopped(default_engine):
    from engine.engine import Finished, TextDelta
    from engine.remote import RemoteClient
    from engine.sampling import SamplingParams
    from engine.server import Server, ServerConfig

    srv = Server(default_engine, ServerConfig(port=0)).start()
    relay = Relay(srv.port)
    received = []
    try:
        for event in RemoteClient(relay.url).chat_stream(MODEL, HELLO, SamplingParams(temperature=0.8, seed=3,
                                                                                      max_tokens=400)):
            received.append(event)
            if len(received) == 3:
                relay.sever()                             # the connection goes away mid-reply
    finally:
        relay.sever()
        srv.stop()
    finished = received[-1]
    assert isinstance(finished, Finished) and finished.stats.stop_reason == "connection-lost"
    assert finished.text == "".join(e.text for e in received if isinstance(e, TextDelta)) and finished.text


def test_bad_base_url_is_refused():
    from engine.errors import InvalidOption
    from engine.remote import normalize_base_url

    assert normalize_base_url("http://box:8000/v1/") == "http://box:8000/v1"
    for bad in ("", "box:8000", "ftp://box/v1"):
        with pytest.raises(InvalidOption):
            normalize_base_url(bad)


class MemoryKeyring:
    """A keyring backend held in memory: keyring's own plug-in interface, for machines without one."""

    def __new__(cls):
        import keyring.backend

        class Backend(keyring.backend.KeyringBackend):
            priority = 1

            def __init__(self):
                super().__init__()
                self.items = {}

            def set_password(self, service, user, password):
                self.items[(service, user)] = password

            def get_password(self, service, user):
                return self.items.get((service, user))

            def delete_password(self, service, user):
                self.items.pop((service, user), None)

        return Backend()


@pytest.fixture
def memory_keyring():
    import keyring

    before = keyring.get_keyring()
    backend = MemoryKeyring()
    keyring.set_keyring(backend)
    yield backend
    keyring.set_keyring(before)


def test_endpoint_key_goes_to_the_keyring_not_the_settings(tmp_path, memory_keyring, server):
    from engine.remote import KEYRING_SERVICE, RemoteEndpoints

    endpoints = RemoteEndpoints(tmp_path)
    endpoints.add("own", server.url, api_key="k-123")
    assert "k-123" not in (tmp_path / "remotes.json").read_text()
    assert memory_keyring.items[(KEYRING_SERVICE, "own")] == "k-123"
    again = RemoteEndpoints(tmp_path)
    assert [e.name for e in again.list()] == ["own"] and again.list()[0].has_key
    assert again.client("own").api_key == "k-123" and MODEL in again.client("own").models()
    again.remove("own")
    assert again.list() == [] and (KEYRING_SERVICE, "own") not in memory_keyring.items


def test_without_a_keyring_the_key_stays_in_memory_only(tmp_path):
    import keyring
    from keyring.backends import fail

    from engine.remote import KeyringUnavailable, RemoteEndpoints

    before = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    try:
        endpoints = RemoteEndpoints(tmp_path)
        with pytest.raises(KeyringUnavailable, match="session only"):
            endpoints.add("box", "http://127.0.0.1:9/v1", api_key="secret-9")
        assert endpoints.key("box") == "secret-9"
        assert "secret-9" not in (tmp_path / "remotes.json").read_text()
        assert RemoteEndpoints(tmp_path).key("box") is None
    finally:
        keyring.set_keyring(before)
