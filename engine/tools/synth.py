"""Write random-weight Hugging Face checkpoints in the real shapes, for tests and benchmarks.

    python -m engine.tools.synth --shape llama3.1-8b --out /tmp/llama8b [--seed S] [--dtype bf16]

Weights are drawn N(0, 0.02) (norm weights around 1), in bf16 by default, and streamed tensor by
tensor into safetensors files (on the GPU when torch sees one, so the 8B shape takes seconds, not
minutes). `--tokenizer` adds a byte-level tokenizer and a ChatML template so chat works end to end;
`--tokenizer-from DIR` copies a real model's tokenizer instead (the vocabulary follows it).

`--nvfp4 [modelopt|compressed-tensors]` writes the layer projections as an NVFP4 checkpoint instead (random
e2m1 codes, random e4m3 block scales between 32 and 240, one global scale per tensor: values of about the
same spread as the bf16 ones, drawn directly, so the 8B shape takes seconds; `hearth quantize` is the real
quantizer). In MoE shapes that is attention, dense-layer MLPs, every routed expert and the shared expert;
routers, shared_expert_gate, the embedding, lm_head and norms stay 16-bit, and lm_head, the routers, the
shared-expert gates and any projection kept 16-bit (inputs not a multiple of 32) are listed in the
exclusions (ModelOpt's exclude_modules, compressed-tensors' ignore) by full module name, as the tools
write them.

Mixture-of-experts shapes are written as real checkpoints are on disk: one tensor per expert
(`mlp.experts.{e}.{gate,up,down}_proj.weight`; Mixtral `block_sparse_moe.experts.{e}.{w1,w3,w2}`),
as transformers 5.24 itself saves them (it stacks experts in memory only).
"""
from __future__ import annotations

import argparse
import json
import math
import struct
import sys
from pathlib import Path

from ..moe import layout_from_hf

SHAPES = {
    "tiny": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, intermediate_size=160, vocab_size=384,
                 max_position_embeddings=1024, rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
    "tiny-llama3": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=1, intermediate_size=96, vocab_size=320,
                        max_position_embeddings=4096, rope_theta=500000.0, rms_norm_eps=1e-5,
                        tie_word_embeddings=False,
                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 256}),
    "tiny-qwen2": dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, vocab_size=320,
                       max_position_embeddings=1024, rope_theta=1000000.0, rms_norm_eps=1e-6,
                       tie_word_embeddings=False),
    "tiny-qwen3": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=128,
                       vocab_size=320, max_position_embeddings=1024, rope_theta=1000000.0, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, attention_bias=False),
    "tiny-mistral": dict(architectures=["MistralForCausalLM"], model_type="mistral", hidden_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                         vocab_size=320, max_position_embeddings=1024, rope_theta=10000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=False, sliding_window=None),
    "smollm2-135m": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=576,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         intermediate_size=1536, vocab_size=49152, max_position_embeddings=8192,
                         rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
    "llama3.2-1b": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=2048,
                        num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                        intermediate_size=8192, vocab_size=128256, max_position_embeddings=131072,
                        rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "llama3.1-8b": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096,
                        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                        intermediate_size=14336, vocab_size=128256, max_position_embeddings=131072,
                        rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "qwen3-0.6b": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=1024,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       intermediate_size=3072, vocab_size=151936, max_position_embeddings=40960,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False),
    "qwen3-8b": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=4096,
                     num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     intermediate_size=12288, vocab_size=151936, max_position_embeddings=40960,
                     rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False),
    # ---- mixture of experts. Tiny shapes for CI: each family's router, a hybrid dense / MoE stack
    # (Qwen3-MoE: mlp_only_layers; Qwen2-MoE: decoder_sparse_step 2) and Qwen2-MoE's shared expert.
    "tiny-qwen3-moe": dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=64,
                           num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                           intermediate_size=128, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                           norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1], vocab_size=320,
                           max_position_embeddings=1024, rope_theta=1000000.0, rms_norm_eps=1e-6,
                           tie_word_embeddings=False, attention_bias=False),
    "tiny-qwen2-moe": dict(architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", hidden_size=64,
                           num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                           moe_intermediate_size=32, shared_expert_intermediate_size=96, num_experts=6,
                           num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=2, mlp_only_layers=[],
                           qkv_bias=True, vocab_size=320, max_position_embeddings=1024, rope_theta=1000000.0,
                           rms_norm_eps=1e-6, tie_word_embeddings=False),
    "tiny-mixtral": dict(architectures=["MixtralForCausalLM"], model_type="mixtral", hidden_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                         num_local_experts=4, num_experts_per_tok=2, vocab_size=320, max_position_embeddings=1024,
                         rope_theta=1000000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, sliding_window=None),
    "tiny-olmoe": dict(architectures=["OlmoeForCausalLM"], model_type="olmoe", hidden_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, intermediate_size=48, num_experts=8,
                       num_experts_per_tok=3, norm_topk_prob=False, vocab_size=320, max_position_embeddings=1024,
                       rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False,
                       clip_qkv=None),
    # ---- mixture of experts, real shapes. Qwen3-30B-A3B is 61 GB in bf16 (NVFP4 is about 17 GB);
    # the 16-layer variant (10.6 B parameters, 21.2 GB in bf16) fits the GPU machine's 64 GB disk.
    "qwen3-30b-a3b": dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=2048,
                          num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                          intermediate_size=6144, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                          norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], vocab_size=151936,
                          max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                          tie_word_embeddings=False, attention_bias=False),
    "mixtral-8x7b": dict(architectures=["MixtralForCausalLM"], model_type="mixtral", hidden_size=4096,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
                         num_local_experts=8, num_experts_per_tok=2, vocab_size=32000, max_position_embeddings=32768,
                         rope_theta=1000000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, sliding_window=None),
    "olmoe-1b-7b": dict(architectures=["OlmoeForCausalLM"], model_type="olmoe", hidden_size=2048,
                        num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16, intermediate_size=1024,
                        num_experts=64, num_experts_per_tok=8, norm_topk_prob=False, vocab_size=50304,
                        max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-5,
                        tie_word_embeddings=False, attention_bias=False, clip_qkv=None),
    "qwen1.5-moe-a2.7b": dict(architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", hidden_size=2048,
                              num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16,
                              intermediate_size=5632, moe_intermediate_size=1408,
                              shared_expert_intermediate_size=5632, num_experts=60, num_experts_per_tok=4,
                              norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[], qkv_bias=True,
                              vocab_size=151936, max_position_embeddings=8192, rope_theta=1000000.0,
                              rms_norm_eps=1e-6, tie_word_embeddings=False),
}
SHAPES["qwen3-30b-a3b-16l"] = dict(SHAPES["qwen3-30b-a3b"], num_hidden_layers=16)

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_DTYPES = {"bf16": ("BF16", 2), "fp16": ("F16", 2), "fp32": ("F32", 4)}
_SHARD_BYTES = 5 * 1024 ** 3


def tensor_shapes(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    h, v, inter = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // heads
    bias = cfg["model_type"] == "qwen2" or cfg.get("attention_bias", cfg.get("qkv_bias", False))
    moe = layout_from_hf(cfg, cfg["num_hidden_layers"])
    shapes = [("model.embed_tokens.weight", (v, h))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes += [(p + "input_layernorm.weight", (h,)),
                   (p + "self_attn.q_proj.weight", (heads * hd, h)),
                   (p + "self_attn.k_proj.weight", (kv * hd, h)),
                   (p + "self_attn.v_proj.weight", (kv * hd, h)),
                   (p + "self_attn.o_proj.weight", (h, heads * hd))]
        if bias:
            shapes += [(p + "self_attn.q_proj.bias", (heads * hd,)), (p + "self_attn.k_proj.bias", (kv * hd,)),
                       (p + "self_attn.v_proj.bias", (kv * hd,))]
        if cfg["model_type"] in ("qwen3", "qwen3_moe"):
            shapes += [(p + "self_attn.q_norm.weight", (hd,)), (p + "self_attn.k_norm.weight", (hd,))]
        if cfg["model_type"] == "olmoe":         # over the whole projection, not per head
            shapes += [(p + "self_attn.q_norm.weight", (heads * hd,)), (p + "self_attn.k_norm.weight", (kv * hd,))]
        shapes.append((p + "post_attention_layernorm.weight", (h,)))
        if moe is not None and moe.is_moe_layer(i):
            shapes += _moe_shapes(cfg, p, moe)
        else:
            shapes += [(p + "mlp.gate_proj.weight", (inter, h)),
                       (p + "mlp.up_proj.weight", (inter, h)),
                       (p + "mlp.down_proj.weight", (h, inter))]
    shapes.append(("model.norm.weight", (h,)))
    if not cfg.get("tie_word_embeddings"):
        shapes.append(("lm_head.weight", (v, h)))
    return shapes


def _moe_shapes(cfg: dict, p: str, moe) -> list[tuple[str, tuple[int, ...]]]:
    """One MoE layer's tensors under their on-disk names, in the order transformers saves them."""
    h, e = cfg["hidden_size"], moe.expert_intermediate_size
    if cfg["model_type"] == "mixtral":
        block, names = p + "block_sparse_moe.", ("w1", "w2", "w3")      # w1 = gate, w2 = down, w3 = up
    else:
        block, names = p + "mlp.", ("gate_proj", "down_proj", "up_proj")
    shapes = [(block + "gate.weight", (moe.num_experts, h))]
    for x in range(moe.num_experts):
        shapes += [(f"{block}experts.{x}.{names[0]}.weight", (e, h)),
                   (f"{block}experts.{x}.{names[1]}.weight", (h, e)),
                   (f"{block}experts.{x}.{names[2]}.weight", (e, h))]
    if moe.has_shared_expert:
        s = moe.shared_expert_intermediate_size
        shapes += [(block + "shared_expert.gate_proj.weight", (s, h)), (block + "shared_expert.up_proj.weight", (s, h)),
                   (block + "shared_expert.down_proj.weight", (h, s)), (block + "shared_expert_gate.weight", (1, h))]
    return shapes


def _random_tensor(torch, name: str, shape, seed: int, index: int, dtype, device):
    gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + index)
    x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
    if name.endswith("norm.weight"):
        x = 1.0 + 0.1 * x
    else:
        x = 0.02 * x
    return x.to(dtype)


_NVFP4_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_NVFP4_EXPERT_PROJECTIONS = _NVFP4_PROJECTIONS[4:] + ("w1", "w2", "w3")      # Mixtral's experts: w1 w3 w2
_NVFP4_GLOBAL = 7e-5  # mean |e2m1| (2.25) x a typical block scale (128) x this = 0.02
NVFP4_LAYOUTS = ("modelopt", "compressed-tensors")


def _nvfp4_entries(name: str, shape, layout: str = "modelopt") -> list:
    """(name, safetensors dtype, shape, bytes) of a projection written as NVFP4 in `layout`'s names:
    ModelOpt weight / weight_scale / weight_scale_2 (a scalar), compressed-tensors weight_packed /
    weight_scale / weight_global_scale ([1], the inverse)."""
    n, k = shape
    module = name[: -len(".weight")]
    if layout == "modelopt":
        weight, glob, glob_shape = name, module + ".weight_scale_2", ()
    else:
        weight, glob, glob_shape = module + ".weight_packed", module + ".weight_global_scale", (1,)
    return [(weight, "U8", (n, k // 2), n * k // 2), (module + ".weight_scale", "F8_E4M3", (n, k // 16), n * k // 16),
            (glob, "F32", glob_shape, 4)]


def _is_projection(name: str, shape) -> bool:
    """A decoder-layer projection NVFP4 applies to: attention, dense MLP, each routed expert's, the
    shared expert's. Not the routers (mlp.gate, block_sparse_moe.gate) nor shared_expert_gate."""
    parts = name.split(".")
    if len(shape) != 2 or not name.startswith("model.layers.") or len(parts) < 2 or parts[-1] != "weight":
        return False
    return parts[-2] in (_NVFP4_EXPERT_PROJECTIONS if "experts" in parts else _NVFP4_PROJECTIONS)


def _is_nvfp4_projection(name: str, shape) -> bool:
    # inputs a multiple of 32: what the native kernels take (native/src/kernels/nvfp4.cu); the rest
    # stay 16-bit and are listed in the exclusions
    return _is_projection(name, shape) and shape[1] % 32 == 0


def _nvfp4_exclusions(cfg: dict, shapes: list) -> list:
    """Modules left 16-bit, as ModelOpt (exclude_modules) and llm-compressor (ignore) list them once
    expanded: lm_head, every router, every shared-expert gate, and projections kept 16-bit."""
    out = {"lm_head"}
    for name, shp in shapes:
        module, leaf = name.rsplit(".", 1)
        if leaf != "weight":
            continue
        if module.endswith((".mlp.gate", ".block_sparse_moe.gate", ".mlp.shared_expert_gate")):
            out.add(module)
        elif _is_projection(name, shp) and not _is_nvfp4_projection(name, shp):
            out.add(module)
    return sorted(out)


def _random_nvfp4(torch, name: str, dtype: str, shape, seed: int, index: int, device):
    gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + index)
    if dtype == "U8":       # uniform random codes, both nibbles
        return torch.randint(0, 256, shape, generator=gen, device=device, dtype=torch.uint8)
    if dtype == "F8_E4M3":  # e4m3 exponents 12..14 (32 .. 240), any mantissa
        exponent = torch.randint(12, 15, shape, generator=gen, device=device, dtype=torch.int32)
        mantissa = torch.randint(0, 8, shape, generator=gen, device=device, dtype=torch.int32)
        return (exponent * 8 + mantissa).to(torch.uint8)
    if name.endswith(".weight_global_scale"):       # compressed-tensors stores the divisor
        return torch.tensor([1.0 / _NVFP4_GLOBAL], dtype=torch.float32)
    return torch.tensor(_NVFP4_GLOBAL, dtype=torch.float32)


def tensor_entries(cfg: dict, dtype: str = "bf16", layout: str | None = None) -> tuple[list, set]:
    """([(name, safetensors dtype, shape, bytes)] of the checkpoint, in file order; the names of the
    NVFP4 codes and scales among them). `layout`: None (16-bit), "modelopt" or "compressed-tensors"."""
    if layout is not None and layout not in NVFP4_LAYOUTS:
        raise SystemExit(f"unknown NVFP4 layout {layout!r}; choose one of {', '.join(NVFP4_LAYOUTS)}")
    st_dtype, itemsize = _DTYPES[dtype]
    entries, packed = [], set()
    for name, shp in tensor_shapes(cfg):
        if layout and _is_nvfp4_projection(name, shp):
            entries += _nvfp4_entries(name, shp, layout)
            packed.update(e[0] for e in entries[-3:])
        else:
            entries.append((name, st_dtype, shp, math.prod(shp) * itemsize))
    return entries, packed


def nvfp4_quantization_config(cfg: dict, layout: str) -> dict:
    """config.json's quantization_config for an NVFP4 checkpoint of `cfg` in `layout` (weight-only)."""
    from ..quantize import _quantization_config

    return _quantization_config(layout, _nvfp4_exclusions(cfg, tensor_shapes(cfg)))


def write_checkpoint(shape: str, out: Path, seed: int = 0, dtype: str = "bf16", tokenizer: bool = False,
                     overrides: dict | None = None, device: str | None = None,
                     tokenizer_from: Path | None = None, nvfp4: bool | str = False) -> Path:
    """`nvfp4`: False, True (ModelOpt) or a layout name ("modelopt", "compressed-tensors")."""
    import torch

    if shape not in SHAPES:
        raise SystemExit(f"unknown shape {shape!r}; choose one of {', '.join(SHAPES)}")
    cfg = dict(SHAPES[shape], **(overrides or {}))
    cfg.update(torch_dtype={"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[dtype],
               bos_token_id=1, eos_token_id=2, hidden_act="silu")
    if tokenizer_from is not None:      # the embedding and head follow the real vocabulary
        cfg.update(_tokenizer_ids(Path(tokenizer_from)))
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    out.mkdir(parents=True, exist_ok=True)
    layout = ("modelopt" if nvfp4 is True else nvfp4) if nvfp4 else None
    entries, packed = tensor_entries(cfg, dtype, layout)
    if layout:
        cfg["quantization_config"] = nvfp4_quantization_config(cfg, layout)
        if layout == "modelopt":
            with open(out / "hf_quant_config.json", "w") as f:
                json.dump({"producer": {"name": "hearth-synth"}, "quantization": {
                    "quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                    "exclude_modules": cfg["quantization_config"]["exclude_modules"]}}, f, indent=2)
    # Split into shards of at most ~5 GB, as Hugging Face does.
    shards, current, size = [], [], 0
    for entry in entries:
        nbytes = entry[3]
        if current and size + nbytes > _SHARD_BYTES:
            shards.append(current)
            current, size = [], 0
        current.append(entry)
        size += nbytes
    shards.append(current)
    names = ["model.safetensors"] if len(shards) == 1 else [
        f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map, index = {}, 0
    for file_name, shard in zip(names, shards):
        header, offset = {}, 0
        for name, st, shp, nbytes in shard:
            header[name] = {"dtype": st, "shape": list(shp), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            weight_map[name] = file_name
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        with open(out / file_name, "wb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            for name, st, shp, _ in shard:
                if name not in packed:
                    t = _random_tensor(torch, name, shp, seed, index, torch_dtype, device)
                else:
                    t = _random_nvfp4(torch, name, st, shp, seed, index, device)
                index += 1
                f.write(t.contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    if len(shards) > 1:
        total = sum(e[3] for e in entries)
        with open(out / "model.safetensors.index.json", "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    with open(out / "config.json", "w") as f:
        json.dump(cfg, f, indent=2)
    with open(out / "generation_config.json", "w") as f:
        json.dump({"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"]}, f, indent=2)
    if tokenizer_from is not None:
        copy_tokenizer(Path(tokenizer_from), out)
    elif tokenizer:
        write_byte_tokenizer(out)
    return out


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def _tokenizer_ids(src: Path) -> dict:
    """vocab_size, bos and eos of a real model folder, so random weights fit its tokenizer."""
    from tokenizers import Tokenizer

    config = json.loads((src / "config.json").read_text()) if (src / "config.json").exists() else {}
    vocab = Tokenizer.from_file(str(src / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    return {"vocab_size": max(vocab, int(config.get("vocab_size") or 0)),
            "bos_token_id": config.get("bos_token_id", 1), "eos_token_id": config.get("eos_token_id", 2)}


def copy_tokenizer(src: Path, out: Path) -> None:
    """Copy a real model's tokenizer and chat template (e.g. the default model's) beside the weights."""
    import shutil

    if not (src / "tokenizer.json").exists():
        raise SystemExit(f"{src} has no tokenizer.json to copy")
    for name in _TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copyfile(src / name, out / name)


def write_byte_tokenizer(out: Path) -> None:
    """A byte-level BPE tokenizer (256 byte tokens + a few merges + ChatML specials) and its config."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    merges = []
    for a, b in [("t", "h"), ("th", "e"), ("Ġ", "t"), ("Ġt", "h"), ("Ġth", "e"), ("i", "n"), ("a", "n"), ("e", "r")]:
        merges.append((a, b))
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.save(str(out / "tokenizer.json"))
    with open(out / "tokenizer_config.json", "w") as f:
        json.dump({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                   "chat_template": CHATML_TEMPLATE, "model_max_length": 1024,
                   "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=2)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(bos_token_id=1, eos_token_id=2)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.tools.synth", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", required=True, choices=sorted(SHAPES))
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="bf16", choices=sorted(_DTYPES))
    parser.add_argument("--tokenizer", action="store_true", help="also write a byte-level tokenizer and chat template")
    parser.add_argument("--tokenizer-from", type=Path, default=None,
                        help="copy this model folder's tokenizer and chat template (the vocabulary follows it)")
    parser.add_argument("--device", default=None, help="where to draw the weights (default: cuda if present)")
    parser.add_argument("--nvfp4", nargs="?", const="modelopt", default=None, choices=NVFP4_LAYOUTS,
                        help="the layer projections (experts and shared expert included; routers, embedding, "
                             "lm_head and norms stay 16-bit) as an NVFP4 checkpoint with random codes and scales, "
                             "in ModelOpt's layout (default) or compressed-tensors'")
    args = parser.parse_args(argv)
    path = write_checkpoint(args.shape, args.out, args.seed, args.dtype, args.tokenizer, device=args.device,
                            tokenizer_from=args.tokenizer_from, nvfp4=args.nvfp4 or False)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
