"""Qt-free state: chat edits become the right engine requests; the library table's figures; Markdown."""
import pytest

from app.models import ChatState, LibraryState, human_bytes, human_count
from app.models.library import weights_digest
from app.render import DARK, render_markdown
from app.store import COMPLETE, STOPPED, ChatStore


@pytest.fixture
def chat(tmp_path):
    state = ChatState(ChatStore(tmp_path / "c.db"))
    state.new_chat("m", "sys", {})
    return state


def test_send_stream_finish(chat):
    events = []
    chat.subscribe(lambda e, p: events.append(e))
    req = chat.send("  Explain *RoPE*  ", "m", "sha", {"temperature": 0.5})
    assert req.turns == [{"role": "user", "content": "Explain *RoPE*"}]
    assert req.system_prompt == "sys" and isinstance(req.params["seed"], int)
    assert chat.chat.title == "Explain RoPE"
    chat.append("Rotary ")
    chat.append("embeddings")
    chat.flush()
    assert chat.store.messages(chat.chat.id)[-1].content == "Rotary embeddings"
    chat.finish({"stop_reason": "eos", "generated_tokens": 2})
    last = chat.store.messages(chat.chat.id)[-1]
    assert (last.state, last.seed, last.weights_sha256) == (COMPLETE, req.params["seed"], "sha")
    assert events[:3] == ["message-added", "message-added", "streaming-started"]
    with pytest.raises(ValueError):
        chat.send("   ", "m", None, {})


def test_regenerate_and_edit(chat):
    chat.send("a", "m", None, {"seed": 1})
    chat.append("first")
    chat.finish({"stop_reason": "cancelled"})
    assert chat.messages[-1].state == STOPPED
    req = chat.regenerate("m", None, {"seed": 2})
    assert req.turns == [{"role": "user", "content": "a"}] and len(chat.messages) == 2
    with pytest.raises(ValueError):             # one reply at a time
        chat.send("b", "m", None, {})
    chat.append("second")
    chat.finish({"stop_reason": "eos"})
    req = chat.edit_last_user("a, edited", "m", None, {})
    assert req.turns == [{"role": "user", "content": "a, edited"}]
    assert [m.content for m in chat.store.messages(chat.chat.id)] == ["a, edited", ""]


def test_library_state_and_figures():
    lib = LibraryState()
    lib.set_manifests([{"id": "x", "name": "X", "path": "/p", "architecture": "LlamaForCausalLM",
                        "quantization": "Q4_1", "context_length": 8192, "bytes": 269_030_016,
                        "sha256": {"model.safetensors": "ff" * 32}, "source": "s"}])
    lib.set_parameter_count("x", 134_515_008)
    lib.set_loaded("x", True)
    row = lib.row("x")
    assert row.loaded and row.parameter_count == 134_515_008 and row.sha256 == "ff" * 32
    assert human_count(134_515_008) == "135M" and human_count(7_240_000_000) == "7.2B"
    assert human_bytes(269_030_016) == "256.6 MiB" and human_bytes(None) == "—"   # the CLI's units
    assert weights_digest({"b": "2", "a": "1"}) == '{"a": "1", "b": "2"}'


def test_markdown_code_and_safety():
    html = render_markdown("Use **this**:\n\n```python\ndef f():\n    return 1\n```\n\n<script>x</script>")
    assert "<strong>this</strong>" in html
    assert "<table" in html and "def</span>" in html and "font-weight: bold" in html
    assert "&lt;script&gt;" in html and "<script>" not in html
    streaming = render_markdown("```js\nlet a = 1", DARK)      # an open fence mid-stream is code already
    assert "<table" in streaming and DARK.code_bg in streaming
