"""Tensor parallel (issue 15), the CPU half: the sharded forward over gloo equals the one-process torch
backend, the split refuses what it cannot do, and the per-GPU memory plan adds up.

One group of 4 rank processes serves the whole module (splits over 2, 3 and 4 use ranks 0..N-1);
every call has a watchdog, so a hung collective fails the test instead of hanging CI."""
import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest

from engine.backends.base import RunnerOptions
from engine.backends.torch_ref import load_runner
from engine.checkpoint import decoder_config_from_hf, inspect
from engine.tensor_parallel import (ShardLayout, TensorParallelFailed, TensorParallelGroup,
                                    TensorParallelUnsupported, check_shardable, generate_greedy, workable_ways)

CONTEXT = 256
OPTIONS = RunnerOptions(context_length=CONTEXT)       # fp32 compute, the oracle's precision


def _rel(a, b):
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(np.asarray(b)))


@pytest.fixture(scope="module")
def group():
    with TensorParallelGroup(4, timeout_s=120) as g:
        yield g


# ----------------------------------------------------------------------------- the layout
@pytest.mark.parametrize("shape,ways", [("smollm2-135m", 3), ("llama3.1-8b", 2), ("llama3.1-8b", 4),
                                        ("llama3.1-8b", 8), ("qwen3-8b", 4), ("tiny", 2)])
def test_layout_covers_everything_once_and_keeps_attention_local(shape, ways):
    from engine.tools.synth import SHAPES

    d = decoder_config_from_hf(SHAPES[shape])
    layouts = [ShardLayout(d, ways, r) for r in range(ways)]
    assert [h for lay in layouts for h in lay.query_heads] == list(range(d.num_heads))
    assert [h for lay in layouts for h in lay.kv_heads] == list(range(d.num_kv_heads))
    assert sum(lay.ffn_rows.stop - lay.ffn_rows.start for lay in layouts) == d.intermediate_size
    assert sum(lay.vocab.stop - lay.vocab.start for lay in layouts) == d.vocab_size
    assert layouts[-1].vocab.stop == d.vocab_size
    group = d.num_heads // d.num_kv_heads
    for lay in layouts:     # grouped-query attention: a rank's query heads read only its KV heads
        assert {j // group for j in lay.query_heads} == set(lay.kv_heads)


def test_a_split_that_does_not_divide_is_refused_with_the_ways_that_work(default_model):
    d = inspect(default_model.path).decoder        # SmolLM2-135M: 9 heads, 3 KV heads, 1536 wide
    assert workable_ways(d) == [1, 3]
    ShardLayout(d, 3, 0)
    with pytest.raises(TensorParallelUnsupported) as e:
        check_shardable(d, 2)
    assert "over 2 GPUs" in e.value.message and "3 KV heads" in e.value.message
    assert "9 query heads" in e.value.message and "3 GPUs would work" in e.value.message
    with pytest.raises(TensorParallelUnsupported, match="over 4 GPUs"):
        check_shardable(d, 4)


def test_mixture_of_experts_is_refused(synth):
    with pytest.raises(TensorParallelUnsupported, match="mixture-of-experts"):
        check_shardable(inspect(synth("tiny-qwen3-moe")).decoder, 2)


def test_the_group_refuses_before_any_rank_loads(group, default_model):
    with pytest.raises(TensorParallelUnsupported, match="3 GPUs would work"):
        group.load(default_model.path, 2, OPTIONS)
    with pytest.raises(TensorParallelUnsupported, match="has 4 ranks"):
        group.load(default_model.path, 6, OPTIONS)


# ----------------------------------------------------------------------------- the oracle
def _check_against_one_process(group, folder, ways, prompt, decode_steps=4, greedy_steps=6):
    info = inspect(folder)
    ref = load_runner(info, info.plan, OPTIONS)
    tp = group.load(folder, ways, OPTIONS)
    # teacher-forced: every position's logits
    whole = ref.score(prompt)
    assert _rel(tp.score(prompt), whole) <= 1e-5
    # prefill, then decode steps on the sharded KV cache, compared step by step
    seq_ref, seq_tp = ref.allocate_sequence(), tp.allocate_sequence()
    ref.prefill(seq_ref, prompt)
    tp.prefill(seq_tp, prompt)
    assert _rel(tp.last_logits(), ref.last_logits()) <= 1e-5
    for token in prompt[:decode_steps]:
        ref.decode([seq_ref], [token])
        tp.decode([seq_tp], [token])
        assert _rel(tp.last_logits(), ref.last_logits()) <= 1e-5
    assert tp.length(seq_tp) == len(prompt) + decode_steps
    # each rank keeps 1/N of the KV cache, and its shard of the weights
    ranks = tp.memory()
    assert [m["kv_bytes"] * ways for m in ranks] == [ref.memory()["kv_bytes"]] * ways
    tp.release_sequence(seq_tp)
    # greedy token for token; two sequences decoded together equal each alone
    other = prompt[3:][::-1]
    alone = [generate_greedy(tp, [p], greedy_steps)[0] for p in (prompt, other)]
    assert alone == [generate_greedy(ref, [p], greedy_steps)[0] for p in (prompt, other)]
    assert generate_greedy(tp, [prompt, other], greedy_steps) == alone
    return info, ref, tp


TINY = [("tiny", 2, {}), ("tiny-qwen3", 2, {}), ("tiny-qwen2", 2, {}), ("tiny-llama3", 1, {}),
        # four ways: 8 query heads over 4 KV heads, and a vocabulary 4 does not divide (padded slices)
        ("tiny", 4, dict(num_attention_heads=8, num_key_value_heads=4, vocab_size=322)),
        ("tiny-qwen3", 4, dict(num_attention_heads=8, num_key_value_heads=4)),
        ("tiny-qwen2", 4, dict(num_attention_heads=8, num_key_value_heads=4, vocab_size=318))]


@pytest.mark.parametrize("shape,ways,overrides", TINY, ids=[f"{s}-x{n}" for s, n, _ in TINY])
def test_sharded_forward_equals_one_process(group, synth, shape, ways, overrides):
    folder = synth(shape, seed=5, **overrides)
    vocab = inspect(folder).decoder.vocab_size
    prompt = np.random.RandomState(11).randint(0, vocab, 37).tolist()
    info, ref, tp = _check_against_one_process(group, folder, ways, prompt)
    # the shards hold the whole model once, plus the replicated norms and the vocabulary padding
    d = info.decoder
    norms = (d.num_layers * (2 * d.hidden_size + (2 * d.head_dim if d.qk_norm else 0)) + d.hidden_size) * 4
    padding = (ways * -(-d.vocab_size // ways) - d.vocab_size) * d.hidden_size * 4 * (1 if info.catalog.tied else 2)
    assert sum(tp.shard_weight_bytes) == ref.weight_bytes + (ways - 1) * norms + padding


def test_default_model_split_three_ways(group, default_model):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(default_model.path) / "tokenizer.json"))
    prompt = tok.encode("The capital of France is Paris, and the capital of Italy is").ids
    _check_against_one_process(group, default_model.path, 3, prompt, decode_steps=3, greedy_steps=5)


def test_a_dead_rank_fails_the_call_instead_of_hanging(synth):
    folder = synth("tiny", seed=5)
    with TensorParallelGroup(2, timeout_s=60) as g:
        tp = g.load(folder, 2, OPTIONS)
        g._procs[1].kill()
        # the driver sees rank 1 gone, or rank 0 reports its collective broken: either way, at once
        with pytest.raises(TensorParallelFailed, match="rank 1 exited|Rank 0 failed"):
            tp.score([1, 2, 3])
        with pytest.raises(TensorParallelFailed, match="closed"):
            tp.score([1, 2, 3])


# ----------------------------------------------------------------------------- the memory plan
GiB = 1024 ** 3


def _shape(name):
    from engine.tools.synth import SHAPES

    if name == "llama-70b-like":     # Llama 3.1 70B's shape (about 141 GB in bf16)
        return dict(SHAPES["llama3.1-8b"], hidden_size=8192, num_hidden_layers=80, num_attention_heads=64,
                    num_key_value_heads=8, intermediate_size=28672)
    return dict(SHAPES[name])


def _header_only_checkpoint(folder, name):
    """config.json and a safetensors header naming every tensor, the data a hole of zeros (a sparse
    file): inspect and the plan read only headers, so a 70B shape takes a few kilobytes of disk."""
    from engine.tools.synth import tensor_shapes

    cfg = _shape(name)
    folder.mkdir(parents=True, exist_ok=True)
    header, offset = {}, 0
    for tensor, shape in tensor_shapes(cfg):
        size = math.prod(shape) * 2
        header[tensor] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)       # a sparse file: the size inspect checks, no blocks written
    (folder / "config.json").write_text(json.dumps(dict(cfg, torch_dtype="bfloat16")))
    return folder


def _bf16_plan(name, context=8192, sessions=4):
    from engine.plan import MemoryPlan

    cfg = _shape(name)
    d = decoder_config_from_hf(cfg)
    from engine.tools.synth import tensor_shapes

    weights = sum(math.prod(s) for _, s in tensor_shapes(cfg)) * 2
    return d, bool(cfg["tie_word_embeddings"]), MemoryPlan.for_model(d, weights, context, sessions=sessions,
                                                                      reserve_bytes=GiB)


SPLITS = [("smollm2-135m", 3), ("llama3.2-1b", 2), ("llama3.2-1b", 4), ("llama3.1-8b", 2), ("llama3.1-8b", 4),
          ("llama3.1-8b", 8), ("llama-70b-like", 2), ("llama-70b-like", 4), ("llama-70b-like", 8)]


@pytest.mark.parametrize("name,ways", SPLITS)
def test_split_plan_parts_add_up_and_shards_sum_to_the_whole(name, ways):
    d, tied, plan = _bf16_plan(name)
    split = plan.split(d, ways, tied)
    assert len(split.ranks) == ways and split.total_bytes == sum(r.total_bytes for r in split.ranks)
    for rank in split.ranks:
        assert sum(n for _, n in rank.breakdown()) == rank.total_bytes
        assert rank.reserve_bytes == plan.reserve_bytes and rank.context_length == plan.context_length
    # weights: the shards add up to the whole, plus the norms every rank keeps and the vocabulary
    # padding, up to one byte of rounding per rank
    norms = (d.num_layers * (2 * d.hidden_size + (2 * d.head_dim if d.qk_norm else 0)) + d.hidden_size) * 2
    padding = (ways * -(-d.vocab_size // ways) - d.vocab_size) * d.hidden_size * 2 * (1 if tied else 2)
    extra = sum(r.weight_bytes for r in split.ranks) - plan.weight_bytes - (ways - 1) * norms - padding
    assert 0 <= extra <= ways
    # the KV cache splits exactly by KV head; the workspace shrinks but keeps the whole residual stream
    assert sum(r.kv_bytes for r in split.ranks) == plan.kv_bytes
    assert all(r.workspace_bytes < plan.workspace_bytes for r in split.ranks) or d.vocab_size > 8 * d.intermediate_size
    assert all(r.runtime_bytes > plan.runtime_bytes for r in split.ranks)      # NCCL's buffers


def test_split_workspace_rescales_the_native_parts():
    """The native plan's named parts: head- and width-sized ones shrink, the sampler stays on rank 0,
    each rank adds its slice of the logits before the gather."""
    from engine.plan import MemoryPlan

    d, tied, base = _bf16_plan("llama3.1-8b")
    parts = (("residual", 4096 * 4 * 8), ("qkv", 6144 * 4 * 8), ("gate_up", 28672 * 4 * 8),
             ("activations", 14336 * 4 * 8), ("logits", 128256 * 4 * 8), ("sampler", 128256 * 4 * 8))
    plan = MemoryPlan(base.weight_bytes, base.kv_bytes_per_token, 8192, 16, sum(n for _, n in parts),
                      workspace_parts=parts, runtime_bytes=64 << 20)
    r0, r1 = (dict(r.workspace_parts) for r in plan.split(d, 2, tied).ranks)
    assert r0["residual"] == r1["residual"] == 4096 * 4 * 8
    assert r0["qkv"] == 3072 * 4 * 8 and r0["gate_up"] == 14336 * 4 * 8
    assert r0["activations"] == 7168 * 4 * 8          # max(hidden, q/2, intermediate/2)
    assert r0["logits"] == 128256 * 4 * 8 and r0["logits_slice"] == 64128 * 4 * 8
    assert r0["sampler"] == 128256 * 4 * 8 and r1["sampler"] == 0
    assert plan.split(d, 2, tied).ranks[1].workspace_bytes == sum(r1.values())


def test_advice_picks_the_smallest_split_that_fits():
    from engine.plan import smallest_split

    d, tied, plan = _bf16_plan("llama-70b-like")
    two, four = (plan.split(d, n, tied).ranks[0] for n in (2, 4))
    room = lambda rank: rank.total_bytes + rank.reserve_bytes
    assert plan.total_bytes > 141e9 and not plan.fits(room(two)).ok
    advice = smallest_split(plan, d, [room(two)] * 8, tied)
    assert advice.ways == 2 and advice.gpus == (0, 1) and "no single GPU" in advice.message
    assert smallest_split(plan, d, [room(two) - GiB] * 8, tied).ways == 4     # 2 is short, 8 would also fit
    assert smallest_split(plan, d, [room(four)] * 3, tied).ways == 0          # 3 GPUs: 64 heads do not split 3 ways
    # the freest GPUs are chosen, rank 0 (which also samples) on the freest of all
    assert smallest_split(plan, d, [GiB, room(two), room(two) + GiB, GiB], tied).gpus == (2, 1)
    assert smallest_split(plan, d, [plan.total_bytes + plan.reserve_bytes], tied).ways == 1
    assert plan.split(d, 1, tied).ranks == (plan,)
    nothing = smallest_split(plan, d, [10 * GiB] * 8, tied)
    assert nothing.ways == 0 and "splits over 2, 4, 8 GPUs" in nothing.message


def test_advice_skips_splits_the_heads_refuse():
    from engine.plan import smallest_split

    d, tied, plan = _bf16_plan("smollm2-135m", context=8192, sessions=64)
    three = plan.split(d, 3, tied).ranks[0]
    advice = smallest_split(plan, d, [three.total_bytes + three.reserve_bytes] * 4, tied)
    assert advice.ways == 3            # 2 would not divide 3 KV heads
    with pytest.raises(TensorParallelUnsupported, match="3 GPUs would work"):
        plan.split(d, 2, tied)


def test_inspect_prints_the_split(tmp_path):
    from tests.test_cli import hearth

    folder = _header_only_checkpoint(tmp_path / "llama-70b-like", "llama-70b-like")
    out = hearth("inspect", str(folder), "--plan", "--backend", "torch", "--gpus", "4", "--context", "8192",
                 "--gpu-free", "80,80,80,80").stdout
    assert "split over 4" in out and "GPU 3" in out and "samples" in out
    assert "Fits split over 4 GPUs" in out
    assert "Fits on no single GPU" in out and "but split over" in out
    refused = hearth("inspect", str(folder), "--plan", "--backend", "torch", "--gpus", "3").stdout
    assert "cannot be split over 3 GPUs" in refused and "2 or 4 or 8 GPUs would work" in refused
    assert "pass --gpu-free" in refused
