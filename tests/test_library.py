"""The model library: importing Hugging Face folders and GGUF files, listing, resolving, removing."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engine.errors import (CheckpointNotFound, CorruptCheckpoint, HearthError, ImportFailed, NotACheckpoint,
                           UnknownModel)
from engine.library import MANIFEST, ModelLibrary, ModelManifest, default_home, slugify

HIDDEN, HEADS, KV, FFN, VOCAB, LAYERS = 32, 4, 2, 64, 128, 2


def write_hf_folder(folder: Path, seed: int = 0) -> Path:
    """A tiny, complete Llama checkpoint: config.json and one bf16 safetensors file."""
    folder.mkdir(parents=True)
    head_dim = HIDDEN // HEADS
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
              "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
              "num_key_value_heads": KV, "head_dim": head_dim, "vocab_size": VOCAB, "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0, "max_position_embeddings": 512, "tie_word_embeddings": False,
              "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"}
    (folder / "config.json").write_text(json.dumps(config))
    g = torch.Generator().manual_seed(seed)
    shapes = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,),
              "lm_head.weight": (VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (HIDDEN,), p + "post_attention_layernorm.weight": (HIDDEN,),
            p + "self_attn.q_proj.weight": (HEADS * head_dim, HIDDEN),
            p + "self_attn.k_proj.weight": (KV * head_dim, HIDDEN),
            p + "self_attn.v_proj.weight": (KV * head_dim, HIDDEN),
            p + "self_attn.o_proj.weight": (HIDDEN, HEADS * head_dim),
            p + "mlp.gate_proj.weight": (FFN, HIDDEN), p + "mlp.up_proj.weight": (FFN, HIDDEN),
            p + "mlp.down_proj.weight": (HIDDEN, FFN)})
    save_file({k: torch.randn(s, generator=g).to(torch.bfloat16) for k, s in shapes.items()},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


@pytest.fixture
def library(tmp_path, monkeypatch):
    monkeypatch.setenv("HEARTH_HOME", str(tmp_path / "home"))
    return ModelLibrary()


def test_home_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("HEARTH_HOME", str(tmp_path / "h"))
    assert default_home() == tmp_path / "h"
    assert ModelLibrary().models_dir == tmp_path / "h" / "models"
    monkeypatch.delenv("HEARTH_HOME")
    assert default_home().name.lower() == "hearth"
    assert ModelLibrary(tmp_path / "x").home == tmp_path / "x"


def test_import_folder_list_get_remove(library, tmp_path):
    src = write_hf_folder(tmp_path / "Tiny Llama")
    events = []
    m = library.import_path(src, progress=events.append)
    assert m.id == "tiny-llama" and m.name == "Tiny Llama"
    assert m.architecture == "LlamaForCausalLM" and m.quantization == "bf16" and m.context_length == 512
    folder = Path(m.path)
    assert folder == library.models_dir / "tiny-llama"
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", MANIFEST, "model.safetensors"]
    assert m.bytes == (src / "model.safetensors").stat().st_size
    assert set(m.sha256) == {"model.safetensors"} and len(m.sha256["model.safetensors"]) == 64
    assert m.source == str(src.resolve()) and m.format == "safetensors"
    assert events[0].current_bytes == 0 and events[-1].current_bytes == events[-1].total_bytes > 0
    # The copy is independent of the source folder.
    (src / "model.safetensors").unlink()
    assert library.verify("tiny-llama")

    assert [x.id for x in library.list()] == ["tiny-llama"]
    assert library.get("tiny-llama").to_dict() == m.to_dict()
    assert library.resolve("tiny-llama") == folder
    assert "tiny-llama" in library

    library.remove("tiny-llama")
    assert library.list() == [] and not folder.exists()
    assert list(library.models_dir.iterdir()) == []


def test_ids_are_unique_slugs(library, tmp_path):
    src = write_hf_folder(tmp_path / "My Model v2!")
    a = library.import_path(src)
    b = library.import_path(src)
    c = library.import_path(src, name="Another Name", model_id="custom-id")
    assert (a.id, b.id, c.id) == ("my-model-v2", "my-model-v2-2", "custom-id")
    assert c.name == "Another Name"
    assert sorted(m.id for m in library.list()) == ["custom-id", "my-model-v2", "my-model-v2-2"]
    with pytest.raises(ImportFailed, match="already"):
        library.import_path(src, model_id="custom-id")
    with pytest.raises(ImportFailed, match="not a valid model id"):
        library.import_path(src, model_id="../escape")
    assert slugify("SmolLM2-135M-Instruct.Q4_1") == "smollm2-135m-instruct-q4-1"
    assert slugify("???") == "model"


def test_unknown_id_lists_known_ids(library, tmp_path):
    with pytest.raises(UnknownModel, match="empty"):
        library.get("nope")
    library.import_path(write_hf_folder(tmp_path / "alpha"))
    library.import_path(write_hf_folder(tmp_path / "beta", seed=1))
    with pytest.raises(UnknownModel) as err:
        library.get("gamma")
    assert "alpha" in err.value.message and "beta" in err.value.message
    with pytest.raises(UnknownModel, match="alpha"):
        library.remove("gamma")
    with pytest.raises(UnknownModel):
        library.resolve("gamma")


def test_resolve_paths(library, tmp_path):
    src = write_hf_folder(tmp_path / "direct")
    assert library.resolve(src) == src
    assert library.resolve(str(src)) == src
    with pytest.raises(CheckpointNotFound):
        library.resolve(str(tmp_path / "missing" / "model.gguf"))


def test_manifest_round_trip(library, tmp_path):
    m = library.import_path(write_hf_folder(tmp_path / "rt"))
    data = json.loads((Path(m.path) / MANIFEST).read_text())
    assert ModelManifest.from_dict(data) == m
    assert ModelManifest.from_dict(json.loads(json.dumps(m.to_dict()))).to_dict() == m.to_dict()
    assert set(data) >= {"id", "name", "path", "architecture", "quantization", "context_length", "bytes",
                         "sha256", "source", "added_at"}
    with pytest.raises(CorruptCheckpoint, match="lacks"):
        ModelManifest.from_dict({"id": "x"})
    # Unknown keys from a newer version are ignored.
    assert ModelManifest.from_dict({**data, "future_field": 1}) == m


def test_broken_or_unfinished_entries_are_not_listed(library, tmp_path):
    library.import_path(write_hf_folder(tmp_path / "good"))
    (library.models_dir / "half-done").mkdir()                # no manifest: an unfinished import
    (library.models_dir / "garbled").mkdir()
    (library.models_dir / "garbled" / MANIFEST).write_text("{not json")
    assert [m.id for m in library.list()] == ["good"]
    assert library.import_path(write_hf_folder(tmp_path / "half done", seed=2)).id == "half-done-2"


def test_verify_detects_changed_weights(library, tmp_path):
    m = library.import_path(write_hf_folder(tmp_path / "v"))
    weights = Path(m.path) / "model.safetensors"
    weights.unlink()                                           # break the hard link, then change bytes
    data = bytearray((tmp_path / "v" / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert not library.verify(m.id)


def test_bad_sources_leave_nothing(library, tmp_path):
    with pytest.raises(CheckpointNotFound):
        library.import_path(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(HearthError):
        library.import_path(empty)
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text("{}")
    with pytest.raises(NotACheckpoint):
        library.import_path(no_weights)
    text = tmp_path / "readme.txt"
    text.write_text("hi")
    with pytest.raises(NotACheckpoint):
        library.import_path(text)
    assert library.list() == []
    assert not library.models_dir.exists() or list(library.models_dir.iterdir()) == []
