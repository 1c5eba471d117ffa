"""The engine's scheduler loop on the cuda-native backend: continuous batching of several chats
(decode graphs, buckets padded), greedy replies equal to each chat alone, cancellation within one
step, and every KV block back in the pool afterwards."""
from __future__ import annotations

import threading

import pytest

from engine import Engine, Finished, SamplingParams, TextDelta

pytestmark = pytest.mark.cuda

# The "tiny" test shape with head size 32 (cuda-native runs head sizes 32, 64, 96, 128, 256).
TINY_GPU = dict(num_attention_heads=2, num_key_value_heads=1)


@pytest.fixture()
def gpu_engine(synth, tmp_path):
    eng = Engine(backend="cuda-native", home=tmp_path / "home", max_batch=4, decode_priority_burst=2,
                 prefill_chunk=16)
    mid = eng.load_model(synth("tiny", tokenizer=True, seed=5, **TINY_GPU)).id
    yield eng, mid
    eng.unload(mid)


def _reply(eng, sid, prompt, params):
    return "".join(e.text for e in eng.chat(sid, prompt, params) if isinstance(e, TextDelta))


def _pool(eng, mid):
    return eng._model(mid).runner.memory()


def test_concurrent_chats_equal_each_alone_on_gpu(gpu_engine):
    """Four chats decoding together (one graph replay per step, the bucket of 4; the long prompt is
    prefilled in chunks between decode steps) give exactly the greedy text each gives alone."""
    eng, mid = gpu_engine
    prompts = ["the cat", "in an inn", "there there " * 8, "a"]
    params = SamplingParams(temperature=0, max_tokens=24)
    alone = []
    for p in prompts:
        sid = eng.create_session(mid)
        alone.append(_reply(eng, sid, p, params))
        eng.release_session(sid)
    sids = [eng.create_session(mid) for _ in prompts]
    together = [None] * len(prompts)

    def run(i):
        together[i] = _reply(eng, sids[i], prompts[i], params)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert together == alone
    for sid in sids:
        eng.release_session(sid)
    mem = _pool(eng, mid)
    assert mem["kv_blocks_free"] == mem["kv_blocks_total"]


def test_cancel_within_one_step_on_gpu(gpu_engine):
    """Stop while another chat keeps decoding: no token of the stopped reply after the stop, the
    other reply runs to its end, and the stopped session still answers."""
    eng, mid = gpu_engine
    stopped, other = eng.create_session(mid), eng.create_session(mid)
    other_text = []
    worker = threading.Thread(target=lambda: other_text.append(
        _reply(eng, other, "in an inn", SamplingParams(temperature=0, max_tokens=40))))
    worker.start()
    seen = after = 0
    finished = None
    for event in eng.chat(stopped, "hello", SamplingParams(temperature=1.0, max_tokens=500, seed=3)):
        if isinstance(event, TextDelta):
            seen += 1
            if seen > 3:
                after += 1
            if seen == 3:
                eng.cancel(stopped)
        if isinstance(event, Finished):
            finished = event
    worker.join(120)
    assert after == 0
    assert finished is not None and finished.stats.stop_reason == "cancelled"
    assert other_text and other_text[0]
    again = list(eng.chat(stopped, "again", SamplingParams(temperature=0, max_tokens=3)))
    assert isinstance(again[-1], Finished) and again[-1].stats.stop_reason in ("max-tokens", "eos")
    for sid in (stopped, other):
        eng.release_session(sid)
    mem = _pool(eng, mid)
    assert mem["kv_blocks_free"] == mem["kv_blocks_total"]


def test_structured_output_masks_on_the_device_as_on_the_host(gpu_engine):
    """A JSON-schema reply on cuda-native: its token mask goes to the device sampler with every decode
    step (no logits read back); the same reply sampled on the host (an observer forces that path) is
    token for token the same, and both parse and validate."""
    import json

    from engine.constraints import ConstraintFactory

    eng, mid = gpu_engine
    factory = ConstraintFactory.for_tokenizer(eng.tokenizer(mid))
    # a finite grammar: a random model at temperature 0 may write digits of an integer until max_tokens
    schema = {"type": "object", "properties": {"c": {"enum": ["red", "green"]}, "ok": {"type": "boolean"}},
              "required": ["c", "ok"], "additionalProperties": False}
    prompt = eng.tokenizer(mid).encode("the cat sat on the")
    params = SamplingParams(temperature=0, max_tokens=64)

    def reply(observer=None):
        events = eng.generate_tokens(mid, prompt, params, constraint=factory.json_schema(schema), observer=observer)
        return [e for e in events if isinstance(e, Finished)][0]

    on_device = reply()
    seen = []
    on_host = reply(observer=lambda logits, token: seen.append(token))
    assert seen and on_device.text == on_host.text
    value = json.loads(on_device.text)
    assert set(value) == {"c", "ok"} and value["c"] in ("red", "green") and isinstance(value["ok"], bool)
