"""Shared fixtures: synthetic checkpoints made on the fly, and the real default model imported once."""
from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def synth(tmp_path_factory):
    """synth(shape, tokenizer=False, **config_overrides) -> a random-weight checkpoint folder (cached)."""
    from engine.tools.synth import write_checkpoint

    made: dict = {}

    def make(shape: str, tokenizer: bool = False, dtype: str = "bf16", seed: int = 0, **overrides) -> Path:
        key = (shape, tokenizer, dtype, seed, tuple(sorted(overrides.items())))
        if key not in made:
            out = tmp_path_factory.mktemp(shape.replace(".", "_"))
            made[key] = write_checkpoint(shape, out, seed=seed, dtype=dtype, tokenizer=tokenizer,
                                         overrides=overrides, device="cpu")
        return made[key]

    return make


@pytest.fixture(scope="session")
def hearth_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("hearth-home")
    os.environ["HEARTH_HOME"] = str(home)
    return home


@pytest.fixture(scope="session")
def default_model(hearth_home):
    """The real default model (SmolLM2-135M-Instruct), imported from its GGUF into a test library."""
    from engine.default_model import install_default_model
    from engine.library import ModelLibrary

    return install_default_model(ModelLibrary(hearth_home))


@pytest.fixture(scope="session")
def default_engine(default_model, hearth_home):
    """A torch-backend engine (fp32) with the default model resident."""
    from engine import Engine

    eng = Engine(backend="torch", home=hearth_home)
    eng.load_model(default_model.id)
    return eng


@pytest.fixture(scope="session")
def moe_chat_checkpoint(default_model, tmp_path_factory):
    """A tiny hybrid Qwen3-MoE checkpoint (random weights) with the default model's real tokenizer."""
    from engine.tools.synth import write_checkpoint

    return write_checkpoint("tiny-qwen3-moe", tmp_path_factory.mktemp("tiny-moe-chat"), seed=1, device="cpu",
                            tokenizer_from=Path(default_model.path))
