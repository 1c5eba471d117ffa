"""GPU faults on the cuda-native engine: the device gives back all its memory, and every failure is a
clear error after which the engine keeps working.

- 50 load / unload cycles of the 135M shape: device memory free afterwards within 1 MiB of before.
- 20 loads cancelled at random points (seeded): each a Cancelled error, no model left resident,
  device memory within 1 MiB of before, and a load after them works.
- Out of memory at load: a plan larger than the device (thousands of resident full contexts) is
  refused before anything is allocated; a KV pool the plan did not size (the native allocator
  itself failing) is an EngineOutOfMemory that frees what it had taken. The engine loads and chats
  afterwards.
- The KV pool exhausted mid-reply (more sessions than blocks: resident_sessions=1): the replies
  that cannot continue end with a typed error or stop reason, every block is back in the pool
  after the sessions are released, and a new chat answers.

Figures are printed (`scripts/gpu_check.sh` or `pytest tests/cuda/test_gpu_faults.py -s`).
"""
from __future__ import annotations

import gc
import random
import threading

import pytest

torch = pytest.importorskip("torch")

from engine import Engine, Finished, SamplingParams, TextDelta  # noqa: E402
from engine.errors import Cancelled, ContextOverflow, EngineOutOfMemory, HearthError  # noqa: E402

pytestmark = pytest.mark.cuda

MiB = 1024 ** 2
# The "tiny" test shape with head size 32 (cuda-native runs head sizes 32, 64, 96, 128, 256).
TINY_GPU = dict(num_attention_heads=2, num_key_value_heads=1)


def _free_bytes() -> int:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0]


def _chat_works(eng, mid) -> str:
    sid = eng.create_session(mid)
    try:
        events = list(eng.chat(sid, "the cat", SamplingParams(temperature=0, max_tokens=4)))
    finally:
        eng.release_session(sid)
    assert isinstance(events[-1], Finished), events[-1]
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def test_fifty_load_unload_cycles_give_back_device_memory(model_dir, tmp_path):
    path = model_dir("smollm2-135m")
    eng = Engine(backend="cuda-native", home=tmp_path / "home", context_length=2048)
    for _ in range(2):      # the first loads bring up cuBLAS and load kernel modules, which stay
        eng.unload(eng.load_model(path).id)
    before = _free_bytes()
    worst = 0
    for _ in range(50):
        eng.unload(eng.load_model(path).id)
        worst = max(worst, before - _free_bytes())
    after = _free_bytes()
    print(f"\n50 load/unload cycles of smollm2-135m: device memory {(before - after) / MiB:+.2f} MiB after, "
          f"worst {worst / MiB:+.2f} MiB between cycles")
    assert eng.loaded_models() == []
    assert before - after <= 1 * MiB


def test_twenty_cancelled_loads_leak_nothing(model_dir, tmp_path):
    path = model_dir("smollm2-135m")
    eng = Engine(backend="cuda-native", home=tmp_path / "home", context_length=2048)
    events = []
    eng.unload(eng.load_model(path, progress=events.append).id)     # counts the progress events
    eng.unload(eng.load_model(path).id)
    before = _free_bytes()
    rng = random.Random(16)
    # the cancel is seen at the next progress event, so the last two (warm-up, resident) are no points
    points = sorted(rng.randrange(0, len(events) - 2) for _ in range(20))
    worst = 0
    for point in points:
        cancel, seen = threading.Event(), []

        def progress(event, point=point, cancel=cancel, seen=seen):
            seen.append(event)
            if len(seen) > point:
                cancel.set()        # the next progress event raises Cancelled inside the load
        with pytest.raises(Cancelled) as info:
            eng.load_model(path, progress=progress, cancel=cancel)
        assert info.value.message
        assert eng.loaded_models() == []
        worst = max(worst, before - _free_bytes())
    print(f"\n20 loads cancelled at progress events {points} of {len(events)}: worst "
          f"{worst / MiB:+.2f} MiB of device memory not given back")
    assert worst <= 1 * MiB
    handle = eng.load_model(path)
    assert handle.backend == "cuda-native"
    eng.unload(handle.id)


def test_out_of_memory_at_load_is_clear_and_the_engine_stays_usable(synth, model_dir, tmp_path):
    from engine.backends import cuda_native
    from engine.backends.base import RunnerOptions
    from engine.checkpoint import inspect

    path = model_dir("smollm2-135m")
    # a plan larger than the device: thousands of full-length contexts kept resident
    eng = Engine(backend="cuda-native", home=tmp_path / "home", resident_sessions=4000)
    before = _free_bytes()
    with pytest.raises(EngineOutOfMemory) as refused:
        eng.load_model(path, context_length=8192)
    assert refused.value.needed_bytes > refused.value.free_bytes > 0
    assert "memory" in refused.value.message.lower()
    assert eng.loaded_models() == []
    assert before - _free_bytes() <= 1 * MiB

    # the native allocator itself running out: a KV pool the plan did not size
    info = inspect(path)
    blocks = int(before // (info.decoder.kv_bytes_per_token(2) * 16)) * 2
    with pytest.raises(EngineOutOfMemory) as native_oom:
        cuda_native.load_runner(info, info.plan, RunnerOptions(context_length=2048, max_batch=8, kv_blocks=blocks))
    assert native_oom.value.message
    after_oom = _free_bytes()
    print(f"\nOOM at load: plan refused ({refused.value.message[:90]}...); native OOM freed to "
          f"{(before - after_oom) / MiB:+.2f} MiB")
    assert before - after_oom <= 1 * MiB

    usable = Engine(backend="cuda-native", home=tmp_path / "home2", max_batch=4, prefill_chunk=16)
    mid = usable.load_model(synth("tiny", tokenizer=True, seed=5, **TINY_GPU)).id
    try:
        _chat_works(usable, mid)
    finally:
        usable.unload(mid)


def test_kv_pool_exhausted_mid_reply_is_clear_and_recovers(synth, tmp_path):
    # one resident session of 64 tokens (4 blocks of 16): three chats of ~55 tokens each cannot all fit
    eng = Engine(backend="cuda-native", home=tmp_path / "home", max_batch=4, prefill_chunk=16,
                 context_length=64, resident_sessions=1)
    mid = eng.load_model(synth("tiny", tokenizer=True, seed=5, **TINY_GPU)).id
    try:
        pool = eng._model(mid).runner.memory()
        sids = [eng.create_session(mid) for _ in range(3)]
        outcomes: list = [None] * len(sids)

        def run(i):
            try:
                stats = None
                for event in eng.chat(sids[i], "in an inn", SamplingParams(temperature=0, max_tokens=40)):
                    if isinstance(event, Finished):
                        stats = event.stats
                outcomes[i] = ("finished", stats.stop_reason)
            except HearthError as exc:
                outcomes[i] = (type(exc).__name__, exc.message)
            except BaseException as exc:  # noqa: BLE001 - an untyped error is the failure reported below
                outcomes[i] = ("untyped", repr(exc))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(sids))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not any(t.is_alive() for t in threads), "a chat hung on the full KV pool"
        print(f"\nKV pool of {pool['kv_blocks_total']} blocks, 3 chats of ~50 tokens: {outcomes}")
        assert all(o is not None and o[0] != "untyped" for o in outcomes), outcomes
        cut = [o for o in outcomes if o[0] == ContextOverflow.__name__ or o[1] == "context-full"]
        assert cut, f"the pool was never full: {outcomes}"
        for o in outcomes:
            if o[0] == ContextOverflow.__name__:
                assert "KV cache is full" in o[1] or "context" in o[1].lower(), o
        for sid in sids:
            eng.release_session(sid)
        mem = eng._model(mid).runner.memory()
        assert mem["kv_blocks_free"] == mem["kv_blocks_total"]
        assert _chat_works(eng, mid) is not None
    finally:
        eng.unload(mid)
