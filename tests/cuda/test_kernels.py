"""Each kernel family against a torch reference, on fresh random inputs at several sizes (odd ones too)."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.cuda


def K():
    from engine import _native

    return _native.kernels


def ptr(t):
    return t.data_ptr()


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def poison(shape, dtype):
    return torch.full(shape, float("nan"), device="cuda", dtype=dtype)


@pytest.mark.parametrize("tokens,vocab,hidden", [(1, 10, 64), (37, 1000, 577), (512, 49152, 576)])
def test_embedding(tokens, vocab, hidden):
    table = torch.randn(vocab, hidden, device="cuda").bfloat16()
    ids = torch.randint(0, vocab, (tokens,), device="cuda", dtype=torch.int32)
    out = poison((tokens, hidden), torch.float32)
    K().embedding(ptr(ids), tokens, ptr(table), vocab, hidden, ptr(out))
    assert torch.equal(out, table[ids.long()].float())


@pytest.mark.parametrize("rows,hidden", [(1, 64), (7, 1000), (5, 2048), (33, 4096), (2, 8192), (3, 577)])
@pytest.mark.parametrize("with_delta", [False, True])
def test_rmsnorm_residual(rows, hidden, with_delta):
    resid = torch.randn(rows, hidden, device="cuda")
    delta = torch.randn(rows, hidden, device="cuda")
    w = (1 + 0.1 * torch.randn(hidden, device="cuda")).bfloat16()
    out = poison((rows, hidden), torch.float32)
    expect_resid = resid + delta if with_delta else resid.clone()
    x = expect_resid.double()
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    K().rmsnorm_residual(ptr(resid), ptr(delta) if with_delta else 0, ptr(w), ptr(out), rows, hidden, 1e-5)
    assert torch.allclose(resid, expect_resid)
    assert rel(out, ref) < 1e-5 and not out.isnan().any()


@pytest.mark.parametrize("rows,cols", [(1, 5), (9, 1152), (64, 4097)])
def test_add_bias(rows, cols):
    x = torch.randn(rows, cols, device="cuda")
    b = torch.randn(cols, device="cuda").bfloat16()
    ref = x + b.float()
    K().add_bias(ptr(x), ptr(b), rows, cols)
    assert torch.allclose(x, ref)


@pytest.mark.parametrize("rows,heads,hd", [(1, 2, 64), (13, 8, 128), (5, 3, 96)])
def test_head_rmsnorm(rows, heads, hd):
    stride = heads * hd + 3 * hd + 5
    col0 = hd
    x = torch.randn(rows, stride, device="cuda")
    w = torch.randn(hd, device="cuda").bfloat16()
    view = x[:, col0:col0 + heads * hd].reshape(rows, heads, hd).double()
    ref = x.clone()
    ref[:, col0:col0 + heads * hd] = (view * torch.rsqrt(view.pow(2).mean(-1, keepdim=True) + 1e-6)
                                      * w.double()).reshape(rows, -1).float()
    K().head_rmsnorm(ptr(x), rows, stride, col0, heads, hd, ptr(w), 1e-6)
    assert rel(x, ref) < 1e-6


def _inv_freq_config(hd, scaling):
    cfg = {"layers": 1, "hidden": 64, "heads": 1, "kv_heads": 1, "head_dim": hd, "intermediate": 64,
           "vocab": 8, "rope_theta": 500000.0}
    if scaling:
        cfg.update(rope_type="llama3", rope_factor=32.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                   rope_original_max_positions=8192)
    return cfg


@pytest.mark.parametrize("scaling", [False, True])
def test_rope_inverse_frequencies_match_reference(scaling):
    from engine.backends.torch_ref import rope_inverse_frequencies
    from engine.checkpoint import DecoderConfig

    rs = ({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 8192} if scaling else None)
    d = DecoderConfig(architecture="LlamaForCausalLM", model_type="llama", num_layers=1, hidden_size=64,
                      num_heads=1, num_kv_heads=1, head_dim=128, intermediate_size=64, vocab_size=8,
                      max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=rs)
    ours = torch.tensor(K().rope_inv_freq(_inv_freq_config(128, scaling)), dtype=torch.float64)
    ref = rope_inverse_frequencies(d)
    assert torch.allclose(ours, ref, rtol=1e-6, atol=0)


@pytest.mark.parametrize("head_norm", [False, True])
@pytest.mark.parametrize("tokens,heads,kvh,hd", [(1, 9, 3, 64), (37, 32, 8, 64), (5, 16, 8, 128), (3, 4, 2, 96)])
def test_rope_kv_write(tokens, heads, kvh, hd, head_norm):
    """Rope of q and k and the KV write; with Qwen3's per-head norms, each q / k head normalized
    first (the reference: head_rmsnorm's formula in float64), values untouched."""
    bs, blocks = 16, 64
    qkv = torch.randn(tokens, (heads + 2 * kvh) * hd, device="cuda") * 3
    positions = torch.randint(0, 5000, (tokens,), device="cuda", dtype=torch.int32)
    slots = torch.randperm(bs * blocks, device="cuda")[:tokens].int()
    inv = torch.tensor(K().rope_inv_freq(_inv_freq_config(hd, True)), device="cuda")
    q_out = poison((tokens, heads * hd), torch.float32)
    kc = torch.zeros(bs * blocks, kvh, hd, device="cuda", dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    qn, kn = torch.randn(hd, device="cuda").bfloat16(), torch.randn(hd, device="cuda").bfloat16()
    norms = dict(q_norm=ptr(qn), k_norm=ptr(kn), eps=1e-6) if head_norm else {}
    K().rope_kv_write(ptr(qkv), tokens, heads, kvh, hd, ptr(positions), ptr(slots), ptr(inv), ptr(q_out),
                      ptr(kc), ptr(vc), **norms)
    ang = positions.double()[:, None] * inv.double()[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]

    def rot(x):
        a, b = x.chunk(2, -1)
        return x * cos + torch.cat((-b, a), -1) * sin

    def norm(v, w):
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double() if head_norm else v

    x = qkv.double().view(tokens, heads + 2 * kvh, hd)
    q_ref = rot(norm(x[:, :heads], qn))
    k_ref = rot(norm(x[:, heads:heads + kvh], kn))
    assert rel(q_out.view(tokens, heads, hd), q_ref) < 1e-4  # fp32 angle at positions up to 5000
    assert rel(kc[slots.long()], k_ref) < 1e-2
    assert torch.equal(vc[slots.long()], x[:, heads + kvh:].float().bfloat16())


def _attention_case(lens, heads, kvh, hd, bs=16):
    max_blocks = max(-(-n // bs) for n in lens)
    total_blocks = max_blocks * len(lens) + 3
    kc = torch.randn(total_blocks * bs, kvh, hd, device="cuda").bfloat16()
    vc = torch.randn_like(kc)
    perm = torch.randperm(total_blocks, device="cuda").int()
    tables = perm[:max_blocks * len(lens)].view(len(lens), max_blocks).contiguous()
    return kc, vc, tables, max_blocks


def _attention_ref(q, kc, vc, table, n, heads, kvh, hd, bs=16):
    pos = torch.arange(n, device="cuda")
    slots = table.long()[pos // bs] * bs + pos % bs
    k = kc[slots].double().repeat_interleave(heads // kvh, dim=1)  # [n, heads, hd]
    v = vc[slots].double().repeat_interleave(heads // kvh, dim=1)
    s = torch.einsum("hd,nhd->hn", q.double().view(heads, hd), k) / math.sqrt(hd)
    return torch.einsum("hn,nhd->hd", torch.softmax(s, -1), v).reshape(-1)


def _decode_attention(q, kc, vc, tables, lens, heads, kvh, hd, max_blocks, split_len):
    """Decode attention of one row per entry of `lens`, row r over table r."""
    rows = len(lens)
    kv_lens = torch.tensor(lens, device="cuda", dtype=torch.int32)
    row_table = torch.arange(rows, device="cuda", dtype=torch.int32)
    out = poison((rows, heads * hd), torch.float32)
    K().paged_attention("decode", ptr(q), ptr(kc), ptr(vc), ptr(tables), ptr(row_table), ptr(kv_lens), ptr(out),
                        rows, heads, kvh, hd, 16, max_blocks, 1 / math.sqrt(hd), split_len)
    return out


@pytest.mark.parametrize("lens,heads,kvh,hd", [([1], 4, 4, 64), ([17, 300], 9, 3, 64), ([4099, 1, 640], 32, 8, 128),
                                               ([1000], 16, 8, 96), ([300, 1, 129, 2000] * 3, 32, 4, 128),
                                               ([300, 5], 8, 2, 256)])  # 256: the register kernel
@pytest.mark.parametrize("split_len", [160, 0])  # 0: each row picks its own pieces (graph path)
def test_decode_attention(lens, heads, kvh, hd, split_len):
    kc, vc, tables, max_blocks = _attention_case(lens, heads, kvh, hd)
    q = torch.randn(len(lens), heads * hd, device="cuda")
    out = _decode_attention(q, kc, vc, tables, lens, heads, kvh, hd, max_blocks, split_len)
    for r, n in enumerate(lens):
        assert rel(out[r], _attention_ref(q[r], kc, vc, tables[r], n, heads, kvh, hd)) < 1e-5


# (32, 4, 128): eight heads a KV head, in blocks of four; (9, 3, 64): the 135M's groups of three;
# (16, 8, 96): pairs
@pytest.mark.parametrize("heads,kvh,hd", [(32, 8, 128), (32, 4, 128), (9, 3, 64), (16, 8, 96)])
def test_decode_attention_rows_do_not_depend_on_batch(heads, kvh, hd):
    """A row's output is bit-identical alone (one head per block) and among 40 rows (the KV head's
    query group, or four heads of it, per block, fewer blocks per (row, group) walking more pieces
    each): batched decoding equals unbatched decoding."""
    lens = [4099, 1, 300, 257, 2000] * 8
    kc, vc, tables, max_blocks = _attention_case(lens, heads, kvh, hd)
    q = torch.randn(len(lens), heads * hd, device="cuda")
    together = _decode_attention(q, kc, vc, tables, lens, heads, kvh, hd, max_blocks, 0)
    for r in range(5):
        # row r alone: its query, length and table as row 0 of a one-row launch
        alone = _decode_attention(q[r:r + 1], kc, vc, tables[r:r + 1], lens[r:r + 1], heads, kvh, hd, max_blocks, 0)
        assert torch.equal(alone[0], together[r])
        assert rel(alone[0], _attention_ref(q[r], kc, vc, tables[r], lens[r], heads, kvh, hd)) < 1e-5


@pytest.mark.parametrize("name,rows,heads,kvh,hd,kv", [("135M b1", 1, 9, 3, 64, 256), ("135M b1 kv 32", 1, 9, 3, 64, 32),
                                                      ("8B b1", 1, 32, 8, 128, 256), ("8B b1 265", 1, 32, 8, 128, 265),
                                                      ("8B b64", 64, 32, 8, 128, 144), ("8B b64 265", 64, 32, 8, 128, 265),
                                                      ("135M b64", 64, 9, 3, 64, 265),
                                                      ("30B-A3B b64", 64, 32, 4, 128, 144),
                                                      ("8B b1 4k", 1, 32, 8, 128, 4096)])
def test_decode_attention_latency(name, rows, heads, kvh, hd, kv):
    """Prints the decode attention's GPU time per launch, back to back (warm
    caches; the launches are queued behind a GPU sleep so the host's launch cost is not what is
    timed) and right after a 1 GiB read (cold caches and TLB, as after a layer's GEMVs); checks the
    output of each. A diagnostic for docs/PERF_NOTES.md, not a speed assertion. (Spreading the KV
    blocks over an 8 GiB pool made no difference in an earlier run.)"""
    bs = 16
    blocks = -(-kv // bs)
    total = rows * blocks + 1
    kc = torch.empty(total * bs, kvh, hd, device="cuda", dtype=torch.bfloat16).normal_()
    vc = torch.empty_like(kc).normal_()
    ids = torch.randperm(total, device="cuda")[:rows * blocks].int().view(rows, blocks).contiguous()
    q = torch.randn(rows, heads * hd, device="cuda")
    kv_lens = torch.full((rows,), kv, device="cuda", dtype=torch.int32)
    row_table = torch.arange(rows, device="cuda", dtype=torch.int32)
    ml = torch.empty(rows * heads * 32 * 2, device="cuda")
    acc = torch.empty(rows * heads * 32 * hd, device="cuda")
    counters = torch.zeros(rows * heads, device="cuda", dtype=torch.int32)
    flush = torch.empty(1 << 29, device="cuda", dtype=torch.bfloat16).normal_()
    expected = _attention_ref(q[0], kc, vc, ids[0], kv, heads, kvh, hd)
    results = []
    for variant in ("default",):
        out = poison((rows, heads * hd), torch.float32)

        def launch():
            K().decode_attention_launch(ptr(q), ptr(kc), ptr(vc), ptr(ids), ptr(row_table), ptr(kv_lens), ptr(out),
                                        rows, heads, kvh, hd, bs, blocks, 1 / math.sqrt(hd), ptr(ml), ptr(acc),
                                        ptr(counters))

        launch()
        torch.cuda.synchronize()
        assert rel(out[0], expected) < 1e-5, variant
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(20_000_000)  # ~10 ms of GPU time: the 50 launches below queue up behind it
        t0.record()
        for _ in range(50):
            launch()
        t1.record()
        torch.cuda.synchronize()
        hot = t0.elapsed_time(t1) / 50 * 1e3
        cold = []
        for _ in range(10):
            flush.sum(dtype=torch.float32)
            t0.record()
            launch()
            t1.record()
            torch.cuda.synchronize()
            cold.append(t0.elapsed_time(t1) * 1e3)
        results.append(f"{variant} {hot:.1f} / {sorted(cold)[len(cold) // 2]:.1f} us")
    print(f"\n[decode attention {name}: rows {rows}, heads {heads}/{kvh}, hd {hd}, kv {kv}; back to back / "
          "after 1 GiB read] " + ", ".join(results))


@pytest.mark.parametrize("start,n,heads,kvh,hd", [(0, 1, 4, 2, 64), (0, 37, 9, 3, 64), (100, 65, 16, 8, 128),
                                                  (7, 13, 32, 8, 128)])
def test_prefill_attention(start, n, heads, kvh, hd):
    kc, vc, tables, max_blocks = _attention_case([start + n], heads, kvh, hd)
    q = torch.randn(n, heads * hd, device="cuda")
    kv_lens = torch.arange(start + 1, start + n + 1, device="cuda", dtype=torch.int32)
    row_table = torch.zeros(n, device="cuda", dtype=torch.int32)
    out = poison((n, heads * hd), torch.float32)
    K().paged_attention("prefill_scalar", ptr(q), ptr(kc), ptr(vc), ptr(tables), ptr(row_table), ptr(kv_lens),
                        ptr(out), n, heads, kvh, hd, 16, max_blocks, 1 / math.sqrt(hd), 0)
    for r in range(n):
        assert rel(out[r], _attention_ref(q[r], kc, vc, tables[0], start + r + 1, heads, kvh, hd)) < 1e-5


def _prefill_ref(q, kc, vc, table, start, n, heads, kvh, hd, bs=16):
    """Causal attention of n new rows (positions start..start+n-1) over start + n cached keys, float64."""
    total = start + n
    pos = torch.arange(total, device="cuda")
    slots = table.long()[pos // bs] * bs + pos % bs
    k = kc[slots].double().repeat_interleave(heads // kvh, dim=1)  # [total, heads, hd]
    v = vc[slots].double().repeat_interleave(heads // kvh, dim=1)
    s = torch.einsum("nhd,lhd->hnl", q.double().view(n, heads, hd), k) / math.sqrt(hd)
    visible = pos[None, :] <= (start + torch.arange(n, device="cuda"))[:, None]  # [n, total]
    s = s.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("hnl,lhd->nhd", torch.softmax(s, -1), v).reshape(n, heads * hd)


@pytest.mark.parametrize("start,n,heads,kvh,hd", [(0, 1, 4, 2, 64), (0, 37, 9, 3, 64), (100, 65, 16, 8, 128),
                                                  (7, 130, 32, 8, 128), (0, 512, 32, 8, 128),
                                                  (4096, 64, 32, 8, 128), (33, 200, 16, 8, 96),
                                                  (5, 77, 8, 8, 32), (1000, 300, 14, 2, 64), (63, 1, 32, 8, 128)])
@pytest.mark.parametrize("mode,bar", [("prefill_tc", 1e-3), ("prefill_tc1", 1e-2)])
def test_prefill_attention_tensor_cores(start, n, heads, kvh, hd, mode, bar):
    """Flash-attention on tensor cores vs float64 (tc, exact: q and P as bf16 hi + lo; tc1, fast:
    bf16 only), with and without history (second turn), odd lengths, GQA groups 1-7, every row
    written."""
    kc, vc, tables, max_blocks = _attention_case([start + n], heads, kvh, hd)
    q = torch.randn(n, heads * hd, device="cuda")
    kv_lens = torch.arange(start + 1, start + n + 1, device="cuda", dtype=torch.int32)
    row_table = torch.zeros(n, device="cuda", dtype=torch.int32)
    out = poison((n, heads * hd), torch.float32)
    K().paged_attention(mode, ptr(q), ptr(kc), ptr(vc), ptr(tables), ptr(row_table), ptr(kv_lens),
                        ptr(out), n, heads, kvh, hd, 16, max_blocks, 1 / math.sqrt(hd), 0)
    assert torch.isfinite(out).all()
    ref = _prefill_ref(q, kc, vc, tables[0], start, n, heads, kvh, hd)
    err = rel(out, ref)
    worst = max(rel(out[r], ref[r]) for r in range(0, n, max(1, n // 16)))
    print(f"\n[{mode}] start {start} n {n} heads {heads}/{kvh} hd {hd}: rel {err:.2e}, worst row {worst:.2e}")
    assert err < bar and worst < 2 * bar


@pytest.mark.parametrize("start,n,heads,kvh,hd,splits", [(4096, 64, 32, 8, 128, 9), (1000, 300, 14, 2, 64, 3),
                                                         (0, 37, 9, 3, 64, 4), (63, 1, 32, 8, 128, 2),
                                                         (33, 200, 16, 8, 96, 5), (5, 77, 8, 8, 32, 2),
                                                         (2047, 16, 8, 2, 128, 32)])
@pytest.mark.parametrize("mode,bar", [("prefill_tc_ksplit", 1e-3), ("prefill_tc1_ksplit", 1e-2)])
def test_prefill_attention_key_split(start, n, heads, kvh, hd, splits, mode, bar):
    """Keys split over `splits` blocks per (head, query tile), partials merged (second turn over long
    history); splits past the key tiles stay empty (m = -inf) and must not disturb the merge."""
    kc, vc, tables, max_blocks = _attention_case([start + n], heads, kvh, hd)
    q = torch.randn(n, heads * hd, device="cuda")
    kv_lens = torch.arange(start + 1, start + n + 1, device="cuda", dtype=torch.int32)
    row_table = torch.zeros(n, device="cuda", dtype=torch.int32)
    out = poison((n, heads * hd), torch.float32)
    K().paged_attention(mode, ptr(q), ptr(kc), ptr(vc), ptr(tables), ptr(row_table), ptr(kv_lens),
                        ptr(out), n, heads, kvh, hd, 16, max_blocks, 1 / math.sqrt(hd), splits)
    assert torch.isfinite(out).all()
    ref = _prefill_ref(q, kc, vc, tables[0], start, n, heads, kvh, hd)
    err = rel(out, ref)
    worst = max(rel(out[r], ref[r]) for r in range(0, n, max(1, n // 16)))
    print(f"\n[{mode} x{splits}] start {start} n {n} heads {heads}/{kvh} hd {hd}: rel {err:.2e}, worst row {worst:.2e}")
    assert err < bar and worst < 2 * bar


def test_prefill_key_split_choice():
    """The model splits the keys only when (query tiles x heads) leaves SMs idle and history is long."""
    f = K().prefill_key_splits
    assert f(64, 32, 128, 4160, 2048) >= 4            # 8B second turn: 32 blocks -> split
    assert f(512, 32, 128, 4608, 2048) == 1           # 8 query tiles x 32 heads: a full wave already
    assert f(64, 32, 128, 64, 2048) == 1              # no history: nothing to split
    assert f(64, 32, 128, 4160, 64) == 1              # no room for partials
    assert f(64, 9, 64, 4160, 2048) * 64 <= 2048


def _fp16_scaled(t):
    """t as the fast precision stores it: fp16(t / s), s the power of two that puts max |t| in [2^14, 2^15)."""
    from engine import _native

    s = _native.fp16_operand_scale(float(t.abs().max()))
    return (t.double() / s).half(), s


def test_fp16_operand_scale():
    from engine import _native

    for amax in (1e-30, 3e-5, 0.02, 1.0, 1.5, 65504.0, 1e9):
        s = _native.fp16_operand_scale(amax)
        assert 2 ** 14 <= amax / s < 2 ** 15 and math.log2(s) == int(math.log2(s))
    assert _native.fp16_operand_scale(0.0) == 1.0


@pytest.mark.parametrize("rows,n,k", [(9, 1001, 576), (16, 4096, 4096), (64, 6144, 4096), (512, 3072, 1024),
                                      (2048, 1536, 576)])
def test_gemm_fast_one_fp16_product(rows, n, k):
    """The fast product: scaled fp16 operands, one tensor-core product, the scales undone by alpha.
    Equal (to fp32 accumulation order) to the float64 product of the same fp16 values, and within
    fp16 rounding of the fp32 product."""
    from engine import _native

    if not _native.cublaslt_available():
        pytest.skip("cuBLASLt not loaded")
    x = torch.randn(rows, k, device="cuda") * 30
    w = torch.randn(n, k, device="cuda") * 0.02
    x16, xs = _fp16_scaled(x)
    w16, ws = _fp16_scaled(w)
    out = poison((rows, n), torch.float32)
    K().gemm_fast(ptr(x16), xs, ptr(w16), ws, ptr(out), rows, n, k)
    same_inputs = (x16.double() @ w16.double().T) * xs * ws
    err_same = rel(out, same_inputs)
    err = rel(out, x.double() @ w.double().T)
    print(f"\n[gemm fast] {rows}x{n}x{k}: rel vs the fp16 values {err_same:.2e}, vs fp64 {err:.2e}")
    assert err_same < 1e-5 and err < 2e-3


@pytest.mark.parametrize("rows,n,k", [(1, 1001, 576), (3, 4096, 4096), (8, 49152, 576), (5, 28672, 4096)])
def test_gemv_fp16_weights(rows, n, k):
    """The GEMV over scaled fp16 weights: the fp32 product of the true (stored * scale) weights."""
    x = torch.randn(rows, k, device="cuda")
    w = torch.randn(n, k, device="cuda") * 0.02
    w16, ws = _fp16_scaled(w)
    out = poison((rows, n), torch.float32)
    K().gemv_fused(ptr(x), ptr(w16), ptr(out), rows, n, k, 0, 0, 0, 0.0, 0, fp16=True, w_scale=ws)
    assert rel(out, x.double() @ (w16.double() * ws).T) < 1e-5


def test_bf16_weights_become_scaled_fp16_in_place():
    w = (torch.randn(4097, 577, device="cuda") * 0.02).bfloat16()
    amax = K().amax_bf16(ptr(w), w.numel())
    assert amax == float(w.float().abs().max())
    from engine import _native

    s = _native.fp16_operand_scale(amax)
    data = w.clone()
    K().bf16_to_f16_inplace(ptr(data), data.numel(), s)
    as_f16 = data.view(torch.float16)
    assert torch.equal(as_f16.double() * s, w.double())  # bf16 values are exact in scaled fp16
    assert float(as_f16.abs().max()) >= 2 ** 14


@pytest.mark.parametrize("rows,hidden", [(9, 576), (64, 4096)])
def test_rmsnorm_fp16_operand_with_delta_row_scale(rows, hidden):
    """The norm adds delta * row_scale[r] (a product over a row-scaled operand) and writes the fast
    operand fp16(y / scale)."""
    resid = torch.randn(rows, hidden, device="cuda")
    delta = torch.randn(rows, hidden, device="cuda")
    row_scale = torch.tensor([2.0 ** (r % 5 - 2) for r in range(rows)], device="cuda")
    w = (1 + 0.1 * torch.randn(hidden, device="cuda")).bfloat16()
    out16 = torch.full((rows, hidden), float("nan"), device="cuda", dtype=torch.float16)
    scale = 2.0 ** -7
    expect = resid.double() + delta.double() * row_scale.double()[:, None]
    K().rmsnorm_residual(ptr(resid), ptr(delta), ptr(w), 0, rows, hidden, 1e-5, delta_row_scale=ptr(row_scale),
                         out16=ptr(out16), out16_scale=scale)
    assert rel(resid, expect) < 1e-6
    y = expect * torch.rsqrt(expect.pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    assert rel(out16.double() * scale, y) < 1e-3 and not out16.isnan().any()


@pytest.mark.parametrize("rows,inter", [(9, 1536), (64, 14336), (3, 18944), (2, 100)])
def test_swiglu_fp16_operand_row_scaled(rows, inter):
    """SwiGLU as the fast down product's operand: each row scaled into [2^14, 2^15) by a power of two,
    values within fp16 rounding; rows of huge activations (past fp16's range) survive."""
    gu = torch.randn(rows, 2 * inter, device="cuda") * 3
    gu[0] *= 300  # silu(g) * u of ~1e6: past 65504 unscaled
    out16 = torch.full((rows, inter), float("nan"), device="cuda", dtype=torch.float16)
    row_scale = torch.full((rows,), float("nan"), device="cuda")
    K().swiglu(ptr(gu), 0, rows, inter, out16=ptr(out16), row_scale=ptr(row_scale))
    g, u = gu.double().chunk(2, -1)
    y = torch.nn.functional.silu(g) * u
    got = out16.double() * row_scale.double()[:, None]
    assert torch.isfinite(got).all()
    assert rel(got, y) < 1e-3
    top = out16.double().abs().amax(1)
    assert bool(((top >= 2 ** 13) & (top <= 2 ** 15)).all())


@pytest.mark.parametrize("rows,inter", [(1, 7), (9, 1536), (64, 14336)])
def test_swiglu(rows, inter):
    gu = torch.randn(rows, 2 * inter, device="cuda") * 3
    out = poison((rows, inter), torch.float32)
    K().swiglu(ptr(gu), ptr(out), rows, inter)
    g, u = gu.double().chunk(2, -1)
    assert rel(out, torch.nn.functional.silu(g) * u) < 1e-6


@pytest.mark.parametrize("tokens,vocab,hidden", [(37, 1000, 577), (64, 49152, 576)])
def test_embedding_fp16_table(tokens, vocab, hidden):
    table = torch.randn(vocab, hidden, device="cuda") * 0.02
    t16, s = _fp16_scaled(table)
    ids = torch.randint(0, vocab, (tokens,), device="cuda", dtype=torch.int32)
    out = poison((tokens, hidden), torch.float32)
    K().embedding(ptr(ids), tokens, ptr(t16), vocab, hidden, ptr(out), fp16=True, scale=s)
    assert torch.equal(out, (t16[ids.long()].float() * s))


@pytest.mark.parametrize("rows,inter,k", [(1, 1536, 576), (1, 8192, 2048), (1, 14336, 4096), (3, 3072, 1024),
                                           (8, 1536, 576), (5, 14336, 4096), (2, 64, 4096)])
def test_gemv_swiglu_equals_gemv_then_swiglu(rows, inter, k):
    """The fused gate/up GEMV + SwiGLU epilogue equals the two kernels bit for bit (same sums, same
    expression), and torch in float64."""
    x = torch.randn(rows, k, device="cuda")
    w = (torch.randn(2 * inter, k, device="cuda") * 0.02).bfloat16()
    out = poison((rows, inter), torch.float32)
    if not K().gemv_swiglu(ptr(x), ptr(w), ptr(out), rows, inter, k):
        pytest.skip(f"fused path does not take {rows}x{inter}x{k}")
    gu = poison((rows, 2 * inter), torch.float32)
    K().matmul("gemv", ptr(x), ptr(w), ptr(gu), rows, 2 * inter, k)
    two = poison((rows, inter), torch.float32)
    K().swiglu(ptr(gu), ptr(two), rows, inter)
    assert torch.equal(out, two)
    g, u = (x.double() @ w.double().T).chunk(2, -1)
    assert rel(out, torch.nn.functional.silu(g) * u) < 1e-4


@pytest.mark.parametrize("rows,n,k,count", [(1, 960, 576, 1), (3, 6144, 4096, 7), (8, 3072, 1024, 512), (5, 1001, 2048, 1)])
def test_gemv_norm_prologue_equals_rmsnorm_then_gemv(rows, n, k, count):
    """x normalized on the fly from its producer's partial sums of squares (any count) equals RMSNorm
    then the product, against float64."""
    x = torch.randn(rows, k, device="cuda") * 3
    w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    norm_w = (1 + 0.1 * torch.randn(k, device="cuda")).bfloat16()
    # the producer's partials: row sums of squares split unevenly into `count` pieces
    gen = torch.Generator().manual_seed(count)
    cuts = sorted(torch.randint(1, k, (count - 1,), generator=gen).tolist())  # repeats: empty pieces
    pieces = torch.tensor_split(x.double() ** 2, cuts, dim=1)
    partials = torch.stack([p.sum(1) for p in pieces], 1).float().contiguous()
    assert partials.shape == (rows, count)
    out = poison((rows, n), torch.float32)
    K().gemv_fused(ptr(x), ptr(w), ptr(out), rows, n, k, ptr(norm_w), ptr(partials), count, 1e-5, 0)
    xd = x.double()
    xn = xd * torch.rsqrt((xd ** 2).mean(1, keepdim=True) + 1e-5) * norm_w.double()
    assert rel(out, xn @ w.double().T) < 1e-5


@pytest.mark.parametrize("rows,n,k", [(1, 576, 576), (2, 4096, 4096), (8, 2048, 8192), (3, 4096, 14336)])
def test_gemv_residual_epilogue(rows, n, k):
    """out += product, and the per-block partials sum to each new row's sum of squares."""
    x = torch.randn(rows, k, device="cuda")
    w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    resid = torch.randn(rows, n, device="cuda")
    before = resid.clone()
    blocks = K().gemv_blocks(rows, n, k)
    partials = poison((rows, blocks), torch.float32)
    K().gemv_fused(ptr(x), ptr(w), ptr(resid), rows, n, k, 0, 0, 0, 0.0, ptr(partials))
    want = before.double() + x.double() @ w.double().T
    assert rel(resid, want) < 1e-6
    assert rel(partials.double().sum(1), (resid.double() ** 2).sum(1)) < 1e-5


@pytest.mark.parametrize("path,rows,n,k", [("gemv", 1, 1001, 576), ("gemv", 3, 4096, 4096), ("gemv", 8, 49152, 576),
                                           ("gemv", 1, 6144, 4096), ("gemv", 2, 4096, 14336), ("gemv", 5, 28672, 4096),
                                           ("gemv", 1, 4097, 1032), ("gemv", 8, 3, 14336),
                                           ("gemm", 9, 1001, 576), ("gemm", 512, 3072, 1024),
                                           ("gemm", 16, 4096, 4096), ("gemm", 64, 6144, 4096),
                                           ("tiled", 37, 1001, 584), ("tiled", 130, 256, 2048)])
def test_matmul(path, rows, n, k):
    x = torch.randn(rows, k, device="cuda")  # fp32 activations
    w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    out = poison((rows, n), torch.float32)
    K().matmul(path, ptr(x), ptr(w), ptr(out), rows, n, k)
    assert rel(out, x.double() @ w.double().T) < 1e-4


@pytest.mark.parametrize("n,k", [(4096, 4096), (2048, 8192), (49152, 576), (1001, 576), (6, 1032)])
def test_gemv_rows_do_not_depend_on_batch(n, k):
    """A row's GEMV result is bit-identical alone and among 2..8 rows (batched == unbatched greedy)."""
    x = torch.randn(8, k, device="cuda")
    w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    alone = torch.empty(8, n, device="cuda")
    for r in range(8):
        K().matmul("gemv", ptr(x[r]), ptr(w), ptr(alone[r]), 1, n, k)
    for rows in (2, 3, 5, 8):
        out = poison((rows, n), torch.float32)
        K().matmul("gemv", ptr(x), ptr(w), ptr(out), rows, n, k)
        assert torch.equal(out, alone[:rows])
    assert rel(alone, x.double() @ w.double().T) < 1e-4


def test_gemv_bandwidth_8b_shapes():
    """Prints the decode GEMV's weight-read bandwidth on the Llama-3.1-8B shapes against the read
    bandwidth measured here (a bf16 sum); asserts only a loose floor (the figures go to docs)."""
    big = torch.ones(1 << 30, dtype=torch.bfloat16, device="cuda")
    big.sum(dtype=torch.float32)
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(10):
        big.sum(dtype=torch.float32)
    t1.record()
    torch.cuda.synchronize()
    peak = big.numel() * 2 * 10 / (t0.elapsed_time(t1) / 1e3)
    del big
    total_bytes = total_s = 0.0
    for name, n, k in [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336),
                       ("lm_head", 128256, 4096)]:
        copies = max(1, (1 << 30) // (n * k * 2))
        w = torch.empty(copies * n * k, dtype=torch.bfloat16, device="cuda").normal_(0, 0.02)
        for rows in (1, 2, 4, 8):
            x = torch.randn(rows, k, device="cuda")
            out = torch.empty(rows, n, device="cuda")
            s = K().gemv_seconds(ptr(x), ptr(w), ptr(out), rows, n, k, copies, 50)
            bw = n * k * 2 / s
            print(f"\n[gemv 8B {name} {n}x{k} rows={rows}] "
                  f"{s * 1e6:.1f} us, {bw / 1e12:.2f} TB/s, "
                  f"{100 * bw / peak:.0f} % of measured read bandwidth {peak / 1e12:.2f} TB/s", end="")
            if rows == 1 and name != "lm_head":
                total_bytes += n * k * 2
                total_s += s
        del w
    print(f"\n[gemv 8B one layer, batch 1] {100 * total_bytes / total_s / peak:.0f} % of measured read bandwidth")
    assert total_bytes / total_s > 0.5 * peak


@pytest.mark.parametrize("src_dtype,code", [(torch.float16, 1), (torch.float32, 2)])
@pytest.mark.parametrize("count", [1, 1001, 1 << 20])
def test_convert(src_dtype, code, count):
    src = torch.randn(count, device="cuda").to(src_dtype)
    dst = torch.empty(count, device="cuda", dtype=torch.bfloat16)
    K().convert_to_bf16(ptr(src), code, ptr(dst), count)
    assert torch.equal(dst, src.float().bfloat16())


def _request(params, seed, step, history=()):
    return {"temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
            "min_p": params.min_p, "repetition_penalty": params.repetition_penalty, "seed": seed,
            "step": step, "history": list(history)}


SAMPLING_CASES = [
    dict(temperature=0.0),
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=40),
    dict(temperature=1.0, top_p=0.9),
    dict(temperature=0.8, min_p=0.05),
    dict(temperature=1.2, top_k=50, top_p=0.8, min_p=0.02, repetition_penalty=1.3),
    dict(temperature=0.5, top_k=1),
]


@pytest.mark.parametrize("vocab", [257, 49152, 151936])
@pytest.mark.parametrize("case", range(len(SAMPLING_CASES)))
def test_sampling_matches_reference_sets(vocab, case):
    from engine.sampling import SamplerState, SamplingParams, allowed_tokens, sample_token

    params = SamplingParams(**SAMPLING_CASES[case])
    g = torch.Generator(device="cpu").manual_seed(1000 + case)
    rows = 4
    logits = (torch.randn(rows, vocab, generator=g) * 4).cuda()
    history = torch.randint(0, vocab, (30,), generator=g).tolist()
    agree, draws = 0, 0
    for seed in range(6):
        reqs = [_request(params, seed * 7 + r, r, history) for r in range(rows)]
        got = K().sample(ptr(logits), rows, vocab, reqs)
        assert got == K().sample(ptr(logits), rows, vocab, reqs)  # reproducible
        for r in range(rows):
            allowed = allowed_tokens(logits[r].cpu(), params, history)
            assert got[r] in allowed
            state = SamplerState(params=params, seed=seed * 7 + r, step=r, history=list(history))
            agree += got[r] == sample_token(logits[r].cpu(), state)
            draws += 1
    assert agree >= draws - 1  # the same draw as the reference, barring a rounding at a CDF edge


@pytest.mark.parametrize("vocab", [257, 49152])
@pytest.mark.parametrize("case", [0, 1, 5])
def test_sampling_with_a_token_mask(vocab, case):
    """Structured output's mask applied by the device sampler before every filter: each draw is an
    allowed token, the same draw as the host sampler with the same mask; a row without a mask in the
    same call is unaffected."""
    from engine.sampling import SamplerState, SamplingParams, mask_words, sample_token

    class Allowed:
        def __init__(self, mask):
            self.mask = mask

        def allowed_mask(self, vocab_size):
            return self.mask

    params = SamplingParams(**SAMPLING_CASES[case])
    g = torch.Generator(device="cpu").manual_seed(77 + case)
    rows = 3
    logits = (torch.randn(rows, vocab, generator=g) * 4).cuda()
    masks = [torch.rand(vocab, generator=g) < frac for frac in (0.01, 0.5)]
    masks[0][vocab - 1] = True                      # the last id, past the last full word for 257
    history = torch.randint(0, vocab, (20,), generator=g).tolist()
    agree = draws = 0
    for seed in range(5):
        reqs = [_request(params, seed * 5 + r, r, history) for r in range(rows)]
        for r in range(2):
            reqs[r]["mask"] = mask_words(Allowed(masks[r]), vocab)
        got = K().sample(ptr(logits), rows, vocab, reqs)
        plain = K().sample(ptr(logits[2:]), 1, vocab, [reqs[2]])
        assert got[2] == plain[0]
        for r in range(2):
            assert bool(masks[r][got[r]])
            state = SamplerState(params=params, seed=seed * 5 + r, step=r, history=list(history))
            state.constraint = Allowed(masks[r])
            agree += got[r] == sample_token(logits[r].cpu(), state)
            draws += 1
    assert agree >= draws - 1


def _nvfp4_weight(n, k, seed):
    """A fresh NVFP4 weight (engine.nvfp4.quantize of random values, with an all-zero block and a block
    of tiny magnitudes whose e4m3 scales are subnormal) and its float64 value on the GPU."""
    import numpy as np

    from engine import nvfp4

    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
    w[0, :16] = 0.0
    w[min(1, n - 1), 16:32] *= 1e-4
    t = nvfp4.quantize(w)
    codes = torch.from_numpy(np.ascontiguousarray(t.packed)).cuda()
    scales = torch.from_numpy(np.ascontiguousarray(t.block_scales)).cuda()
    value = torch.from_numpy(t.dequantize().astype(np.float64)).cuda()
    return t, codes, scales, value


@pytest.mark.parametrize("rows,n,k", [(1, 960, 576), (3, 1536, 576), (8, 576, 1536), (1, 6144, 4096),
                                      (5, 4096, 14336), (2, 100, 32)])
def test_gemv_nvfp4_weights(rows, n, k):
    """The GEMV reads NVFP4 codes and block scales directly: the fp32 product of the dequantized
    weights (engine.nvfp4's reference), against float64."""
    t, codes, scales, value = _nvfp4_weight(n, k, seed=rows * 7 + n)
    x = torch.randn(rows, k, device="cuda")
    out = poison((rows, n), torch.float32)
    K().gemv_nvfp4(ptr(x), ptr(codes), ptr(scales), float(t.global_scale), ptr(out), rows, n, k)
    assert rel(out, x.double() @ value.T) < 1e-5


@pytest.mark.parametrize("n,k", [(6144, 4096), (28672, 4096), (4096, 14336), (1001, 576), (100, 32)])
def test_gemv_nvfp4_rows_do_not_depend_on_batch(n, k):
    """An NVFP4 GEMV row is bit-identical alone and among 2..8 rows (the launcher takes 2 or 4 tiles
    per warp by batch and width: 6144 and 28672 cross from 2 to 4, and the sums may not change with
    it; 4096, 1001 and 100 take 16 warps a block on a GPU of >= 128 SMs), and near float64."""
    t, codes, scales, value = _nvfp4_weight(n, k, seed=n + k)
    x = torch.randn(8, k, device="cuda")
    g = float(t.global_scale)
    alone = torch.empty(8, n, device="cuda")
    for r in range(8):
        K().gemv_nvfp4(ptr(x[r]), ptr(codes), ptr(scales), g, ptr(alone[r]), 1, n, k)
    for rows in (2, 3, 5, 8):
        out = poison((rows, n), torch.float32)
        K().gemv_nvfp4(ptr(x), ptr(codes), ptr(scales), g, ptr(out), rows, n, k)
        assert torch.equal(out, alone[:rows]), rows
    assert rel(alone, x.double() @ value.T) < 1e-5


@pytest.mark.parametrize("rows,n,k", [(1, 960, 576), (3, 6144, 4096), (8, 6144, 4096), (8, 4096, 14336),
                                      (2, 100, 32)])
def test_gemv_nvfp4_fast_one_fp16_product(rows, n, k):
    """The fast precision's NVFP4 GEMV (one fp16 product): the activations divided by a static scale,
    or each row by the power of two its max |x| asks for (the producer's max partials, here three per
    row), against float64; rows bit-identical alone and in the batch (8 rows of 6144 take 4 tiles per
    warp, one row 2)."""
    t, codes, scales, value = _nvfp4_weight(n, k, seed=rows * 3 + k)
    g = float(t.global_scale)
    x = torch.randn(rows, k, device="cuda") * torch.logspace(0, 4, rows, device="cuda")[:, None]  # rows far apart
    want = x.double() @ value.T
    amax = torch.stack([x.abs().amax(1) * f for f in (0.5, 1.0, 0.25)], 1).contiguous()  # a max, any split
    out = poison((rows, n), torch.float32)
    K().gemv_nvfp4(ptr(x), ptr(codes), ptr(scales), g, ptr(out), rows, n, k, fast=True, x_amax=ptr(amax),
                   x_amax_count=3)
    err = rel(out, want)
    print(f"\n[gemv nvfp4 fast {rows}x{n}x{k}] rel {err:.2e}", end="")
    assert torch.isfinite(out).all() and err < 1e-3
    for r in range(rows):
        alone = poison((1, n), torch.float32)
        K().gemv_nvfp4(ptr(x[r]), ptr(codes), ptr(scales), g, ptr(alone), 1, n, k, fast=True, x_amax=ptr(amax[r]),
                       x_amax_count=3)
        assert torch.equal(alone[0], out[r]), r
    # A static scale: rows bounded by it (x / scale below fp16's 65504).
    xs = torch.randn(rows, k, device="cuda") * 2000
    out = poison((rows, n), torch.float32)
    K().gemv_nvfp4(ptr(xs), ptr(codes), ptr(scales), g, ptr(out), rows, n, k, fast=True, x_scale=0.25)
    assert torch.isfinite(out).all() and rel(out, xs.double() @ value.T) < 1e-3


_GEMM_NVFP4_SHAPES = [(9, 1536, 576), (16, 4096, 4096), (17, 6144, 4096), (24, 1001, 2048), (33, 100, 32),
                      (40, 4096, 14336), (64, 2000, 1024), (64, 28672, 4096)]


@pytest.mark.parametrize("rows,n,k", _GEMM_NVFP4_SHAPES)
def test_gemm_nvfp4_small_batch(rows, n, k):
    """The small-batch product reads NVFP4 codes in place (9-64 rows, one fp16 product): against
    float64 over the same fp16 operand and dequantized weights, one 16-row tile a warp (up to 16
    rows) or two, k split over a cluster's blocks or not (the shapes above take 1 to 8 slices, n not
    a multiple of the tile), every output written, and the same sums on a second launch."""
    t, codes, scales, value = _nvfp4_weight(n, k, seed=rows + n)
    x = (torch.randn(rows, k, device="cuda") * 4096).half()  # the fast operand: scaled near fp16's top
    x_scale = 2.0 ** -12
    out = poison((rows, n), torch.float32)
    K().gemm_nvfp4(ptr(x), x_scale, ptr(codes), ptr(scales), float(t.global_scale), ptr(out), rows, n, k)
    assert torch.isfinite(out).all()
    err = rel(out, (x.double() * x_scale) @ value.T)
    print(f"\n[gemm nvfp4 {rows}x{n}x{k}] rel {err:.2e}", end="")
    assert err < 2e-5
    again = poison((rows, n), torch.float32)  # slices added in slice order: the same sums again
    K().gemm_nvfp4(ptr(x), x_scale, ptr(codes), ptr(scales), float(t.global_scale), ptr(again), rows, n, k)
    assert torch.equal(again, out)


def test_gemv_nvfp4_bandwidth_8b_shapes():
    """Prints the NVFP4 decode GEMV's time and packed-weight read rate (codes + block scales) on the
    Llama-3.1-8B shapes, weights rotated through more memory than L2 holds (figures for docs)."""
    import numpy as np

    rng = np.random.default_rng(5)
    total_bytes = total_s = 0.0
    for name, n, k in [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]:
        per = n * k // 2 + n * k // 16
        copies = max(1, (1 << 30) // per)
        codes = torch.from_numpy(rng.integers(0, 256, copies * n * k // 2, dtype=np.uint8)).cuda()
        scales = torch.from_numpy(rng.integers(0x28, 0x58, copies * n * k // 16, dtype=np.uint8)).cuda()
        for rows in (1, 2, 4, 8):
            x = torch.randn(rows, k, device="cuda")
            out = torch.empty(rows, n, device="cuda")
            s = K().gemv_nvfp4_seconds(ptr(x), ptr(codes), ptr(scales), ptr(out), rows, n, k, copies, 50)
            assert torch.isfinite(out).all()
            sf = K().gemv_nvfp4_seconds(ptr(x), ptr(codes), ptr(scales), ptr(out), rows, n, k, copies, 50, fast=True)
            print(f"\n[gemv nvfp4 8B {name} {n}x{k} rows={rows}] exact {s * 1e6:.1f} us, fast {sf * 1e6:.1f} us "
                  f"({per / sf / 1e12:.2f} TB/s)", end="")
            if rows == 1:
                total_bytes += per
                total_s += sf
        del codes, scales
    print(f"\n[gemv nvfp4 8B one layer, batch 1, fast] {total_s * 1e6:.1f} us, {total_bytes / total_s / 1e12:.2f} TB/s")


def test_gemm_nvfp4_bandwidth():
    """Prints the small-batch NVFP4 product's time and packed-weight read rate at 16 / 32 / 64 rows on
    the Llama-3.1-8B and Qwen3-30B-A3B shapes, weights rotated through more memory than L2 holds
    (figures for docs)."""
    import numpy as np

    rng = np.random.default_rng(6)
    for name, n, k in [("8B qkv", 6144, 4096), ("8B o", 4096, 4096), ("8B gate_up", 28672, 4096),
                       ("8B down", 4096, 14336), ("MoE qkv", 5120, 2048), ("MoE o", 2048, 4096)]:
        per = n * k // 2 + n * k // 16
        copies = max(1, (1 << 30) // per)
        codes = torch.from_numpy(rng.integers(0, 256, copies * n * k // 2, dtype=np.uint8)).cuda()
        scales = torch.from_numpy(rng.integers(0x28, 0x58, copies * n * k // 16, dtype=np.uint8)).cuda()
        for rows in (16, 32, 64):
            x16 = (torch.randn(rows, k, device="cuda") * 4096).half()
            out = torch.empty(rows, n, device="cuda")
            s = K().gemm_nvfp4_seconds(ptr(x16), ptr(codes), ptr(scales), ptr(out), rows, n, k, copies, 30, False)
            assert torch.isfinite(out).all()
            print(f"\n[gemm nvfp4 {name} {n}x{k} rows={rows}] {s * 1e6:.1f} us ({per / s / 1e12:.2f} TB/s)", end="")
        del codes, scales


@pytest.mark.parametrize("fp16", [True, False])
def test_nvfp4_expands_exactly_into_16_bits(fp16):
    """e2m1 * e4m3 is exact in fp16 and bf16: the expansion times the global scale is the reference's
    dequantized weight bit for bit (in float64), subnormal block scales and zero blocks included."""
    n, k = 1000, 576
    t, codes, scales, value = _nvfp4_weight(n, k, seed=11)
    out = poison((n, k), torch.float16 if fp16 else torch.bfloat16)
    K().nvfp4_expand(ptr(codes), ptr(scales), ptr(out), n, k, fp16)
    assert torch.isfinite(out).all()
    g = float(t.global_scale)
    import numpy as np

    from engine import nvfp4

    exact = (nvfp4.e2m1_decode(nvfp4.unpack_codes(t.packed)).reshape(n, k // 16, 16).astype(np.float64)
             * nvfp4.e4m3_decode(t.block_scales).reshape(n, k // 16, 1)).reshape(n, k)
    assert torch.equal(out.double().cpu(), torch.from_numpy(exact))
    assert rel(out.double() * g, value) < 1e-7
