"""Chat: templates equal transformers', sessions reuse their KV, streaming text is whole, errors are clear."""
import json
import shutil

import pytest

from engine import Engine, Finished, SamplingParams, TextDelta
from engine import errors
from engine.chat_template import ChatTemplate

CONVERSATIONS = [
    [{"role": "user", "content": "Hi there!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}],
    [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3? 🙂 日本語で"}],
    [{"role": "user", "content": "Write code:\n```py\nprint('x')\n```"}, {"role": "assistant", "content": "Done."}],
]


def _run(events):
    events = list(events)
    assert isinstance(events[-1], Finished)
    return "".join(e.text for e in events if isinstance(e, TextDelta)), events[-1]


def test_template_matches_transformers(default_model, default_engine):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(default_model.path)
    tok = default_engine.tokenizer(default_model.id)
    template = ChatTemplate(tok.chat_template, tok.bos_token, tok.eos_token)
    for conv in CONVERSATIONS:
        for gen in (True, False):
            assert template.render(conv, add_generation_prompt=gen) == hf.apply_chat_template(
                conv, tokenize=False, add_generation_prompt=gen)
    # and the canonical tokens equal transformers' tokenization of the rendered text
    for conv in CONVERSATIONS:
        ours = default_engine.conversation_tokens(default_model.id, conv)
        ref = hf.apply_chat_template(conv, tokenize=True, add_generation_prompt=True, return_dict=False)
        assert ours == list(ref)


def test_second_turn_prefills_only_new_tokens_and_matches_a_fresh_session(default_model, default_engine):
    eng, mid = default_engine, default_model.id
    greedy = SamplingParams(temperature=0, max_tokens=20)
    sid = eng.create_session(mid, system_prompt="You are a helpful assistant.")
    first, fin1 = _run(eng.chat(sid, "What is the capital of France?", greedy))
    assert fin1.stats.prefilled_tokens == fin1.stats.prompt_tokens  # a new session computes everything
    cached = len(eng.session_tokens(sid))
    second, fin2 = _run(eng.chat(sid, "And of Italy?", greedy))
    new_tokens = fin2.stats.prompt_tokens - cached
    assert fin2.stats.prefilled_tokens == new_tokens
    assert new_tokens < 20 < cached
    history = eng.history(sid)
    assert [m["role"] for m in history] == ["system", "user", "assistant", "user", "assistant"]
    assert history[2]["content"] == first and history[4]["content"] == second

    fresh = eng.create_session(mid, history=history[:3])
    again, fin3 = _run(eng.chat(fresh, "And of Italy?", greedy))
    assert fin3.stats.prefilled_tokens == fin3.stats.prompt_tokens == fin2.stats.prompt_tokens
    assert again == second
    eng.release_session(sid)
    eng.release_session(fresh)


def test_regenerate_reuses_the_prefix(default_model, default_engine):
    eng, mid = default_engine, default_model.id
    sid = eng.create_session(mid)
    params = SamplingParams(temperature=0.8, max_tokens=12, seed=7)
    text1, fin1 = _run(eng.chat(sid, "Tell me a fact about owls.", params))
    eng.set_history(sid, eng.history(sid)[:-1])           # drop the reply
    text2, fin2 = _run(eng.respond(sid, params))
    assert text2 == text1                                   # same seed, same text
    assert fin2.stats.prefilled_tokens == 1                 # everything but the last prompt token was cached
    eng.release_session(sid)


def test_streaming_text_is_whole_utf8(default_model, default_engine):
    tok = default_engine.tokenizer(default_model.id)
    text = "Emoji 😀👍🏽🇫🇷 and CJK 日本語の文章、中文句子 and café ñ — done ✅"
    ids = tok.encode(text)
    stream = tok.stream()
    pieces = [stream.push(i) for i in ids]
    pieces.append(stream.flush())
    assert "".join(pieces) == tok.decode(ids) == text
    assert not any("\ufffd" in p for p in pieces)
    assert any(p == "" for p in pieces)  # some tokens carried only part of a character


def test_same_seed_same_text(default_model, default_engine):
    eng, mid = default_engine, default_model.id
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, seed=2024)
    a, _ = _run(eng.generate(mid, "Once upon a time", params))
    b, _ = _run(eng.generate(mid, "Once upon a time", params))
    c, _ = _run(eng.generate(mid, "Once upon a time", SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, seed=1)))
    assert a == b and a != c


# ----------------------------------------------------------------------------------- synthetic, fast

@pytest.fixture()
def tiny_engine(synth, tmp_path):
    eng = Engine(backend="torch", home=tmp_path / "home", context_length=96)
    handle = eng.load_model(synth("tiny", tokenizer=True))
    return eng, handle.id


def test_cancel_stops_within_one_step(tiny_engine):
    eng, mid = tiny_engine
    sid = eng.create_session(mid)
    events = eng.chat(sid, "hello", SamplingParams(temperature=1.0, max_tokens=60, seed=1))
    seen, after_cancel, shown = 0, 0, ""
    for event in events:
        if isinstance(event, TextDelta):
            seen += 1
            shown += event.text
            if seen > 3:
                after_cancel += 1
            if seen == 3:
                eng.cancel(sid)
        if isinstance(event, Finished):
            assert event.stats.stop_reason == "cancelled"
            assert event.stats.generated_tokens < 60
    assert after_cancel == 0                       # nothing appears once stop is pressed
    assert eng.history(sid)[-1] == {"role": "assistant", "content": shown}
    # the session still works afterwards
    _, fin = _run(eng.chat(sid, "again", SamplingParams(temperature=0, max_tokens=3)))
    assert fin.stats.stop_reason in ("max-tokens", "eos")


def test_stop_strings_cut_the_reply(tiny_engine):
    eng, mid = tiny_engine
    base, _ = _run(eng.generate(mid, "the", SamplingParams(temperature=0, max_tokens=30)))
    marker = base[5:7]
    cut, fin = _run(eng.generate(mid, "the", SamplingParams(temperature=0, max_tokens=30, stop=(marker,))))
    assert fin.stats.stop_reason == "stop" and cut == base[:base.find(marker)]


def test_context_limits(tiny_engine):
    eng, mid = tiny_engine
    sid = eng.create_session(mid)
    with pytest.raises(errors.ContextOverflow, match="context of 96"):
        eng.chat(sid, "x" * 200, SamplingParams(max_tokens=4))
    assert eng.history(sid) == []                  # the refused message is not left behind
    with pytest.raises(errors.ContextOverflow):
        eng.generate(mid, "x" * 200)
    assert eng.sessions(mid) == [sid]              # nor a throwaway session
    sid = eng.create_session(mid)
    _, fin = _run(eng.chat(sid, "a" * 60, SamplingParams(temperature=0, max_tokens=200)))
    assert fin.stats.stop_reason in ("context-full", "eos")
    assert fin.stats.context_used <= 96


def test_unknown_session_and_model(tiny_engine):
    eng, mid = tiny_engine
    with pytest.raises(errors.UnknownSession, match="no chat session"):
        eng.chat("nope", "hi")
    with pytest.raises(errors.UnknownModel, match="not loaded"):
        eng.create_session("missing-model")
    sid = eng.create_session(mid)
    eng.release_session(sid)
    with pytest.raises(errors.UnknownSession):
        eng.history(sid)


def test_tokenizer_missing_scoring_still_works(synth, tmp_path):
    eng = Engine(backend="torch", home=tmp_path / "home")
    handle = eng.load_model(synth("tiny"))
    logits = eng.score(handle.id, [1, 2, 3, 4])
    assert logits.shape == (4, 384)
    sid = eng.create_session(handle.id)
    with pytest.raises(errors.TokenizerMissing, match="no tokenizer.json"):
        eng.chat(sid, "hello")


def _with_template(synth, tmp_path, template):
    folder = tmp_path / "m"
    shutil.copytree(synth("tiny", tokenizer=True), folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    eng = Engine(backend="torch", home=tmp_path / "home")
    return eng, eng.load_model(folder).id


def test_chat_template_errors(synth, tmp_path):
    eng, mid = _with_template(synth, tmp_path, "{{ raise_exception('System role not supported') }}")
    with pytest.raises(errors.ChatTemplateError, match="System role not supported"):
        eng.chat(eng.create_session(mid), "hi")


def test_chat_template_sandbox(synth, tmp_path):
    eng, mid = _with_template(synth, tmp_path, "{{ ''.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(errors.ChatTemplateError):
        eng.chat(eng.create_session(mid), "hi")


def test_chat_template_syntax_error(synth, tmp_path):
    eng, mid = _with_template(synth, tmp_path, "{% for m in messages %}")
    with pytest.raises(errors.ChatTemplateError, match="does not parse"):
        eng.chat(eng.create_session(mid), "hi")


def test_stepwise_tokenizer_load_equals_from_file(default_model, synth):
    from tokenizers import Tokenizer as HFTokenizer
    from pathlib import Path
    from engine.tokenizer import load_tokenizer_json

    texts = ["Hello world 123 4567", "<|im_start|>user\nhi 😀 日本語<|im_end|>\n", "  spaces\n\n\tx", "café ñ — ✅"]
    for folder in (Path(default_model.path), synth("tiny", tokenizer=True)):
        ours, ref = load_tokenizer_json(folder / "tokenizer.json"), HFTokenizer.from_file(str(folder / "tokenizer.json"))
        assert ours.get_vocab(with_added_tokens=True) == ref.get_vocab(with_added_tokens=True)
        for text in texts:
            ids = ref.encode(text).ids
            assert ours.encode(text).ids == ids
            assert ours.decode(ids, skip_special_tokens=False) == ref.decode(ids, skip_special_tokens=False)


def test_load_that_cannot_fit_is_refused_with_advice(synth, tmp_path):
    folder = synth("tiny", tokenizer=True, max_position_embeddings=2**31)
    eng = Engine(backend="torch", home=tmp_path / "home")
    with pytest.raises(errors.EngineOutOfMemory, match="reduce the context to") as caught:
        eng.load_model(folder, context_length=2**31)
    assert caught.value.needed_bytes > caught.value.free_bytes > 0
    assert eng.loaded_models() == []
    assert eng.load_model(folder, context_length=512).id        # a context that fits loads fine


def test_block_parsed_tokenizer_handles_escapes_and_odd_layouts(tmp_path):
    """Keys with quotes, braces, commas and backslashes; and a file laid out differently (whole parse)."""
    import json as _json
    from tokenizers import Tokenizer as HFTokenizer, models, pre_tokenizers
    from engine.tokenizer import _split_bpe_json, load_tokenizer_json

    vocab = {ch: i for i, ch in enumerate(["a", "b", '"', "}", ",", "\\", "1", ":"])}
    merges = [("a", "b"), ('"', "}"), (",", '"'), ("\\", "1")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    for i in range(9000):                       # enough entries for several parse blocks
        vocab[f"w{i}"] = len(vocab)
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    text = path.read_text()
    data, parsed_vocab, parsed_merges = _split_bpe_json(text)
    assert parsed_vocab == vocab and [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m)
                                      for m in parsed_merges] == merges
    ours = load_tokenizer_json(path)
    for sample in ['ab "} ,"', "\\1 a b", "w42 w8999"]:
        assert ours.encode(sample).ids == tok.encode(sample).ids

    reordered = _json.loads(text)
    model = reordered["model"]
    reordered["model"] = {"merges": model["merges"], **{k: v for k, v in model.items() if k != "merges"}}
    path.write_text(_json.dumps(reordered))
    assert _split_bpe_json(path.read_text()) is None           # not the usual layout: parsed whole
    assert load_tokenizer_json(path).encode("ab w7").ids == tok.encode("ab w7").ids
