"""The imported default model, inspected through the engine as a user's first model would be."""
from engine import Engine


def test_inspect_imported_default_model(default_model, hearth_home):
    info = Engine(backend="torch", home=hearth_home).inspect(default_model.id)
    m, d = info.metadata, info.decoder
    assert m.model_type == "llama" and m.architecture == "LlamaForCausalLM"
    assert (d.num_layers, d.num_heads, d.num_kv_heads, d.hidden_size) == (30, 9, 3, 576)
    assert m.parameter_count == 134_515_008
    assert m.tied_embeddings and "lm_head.weight" not in {t.name for t in info.tensors}
    assert info.plan.archetype == "dense-swiglu" and info.plan.attention == "grouped-query"
    assert m.has_tokenizer and m.has_chat_template and m.quantization == "bf16"
    assert default_model.quantization == "Q4_1"          # what it was before import


def test_memory_plan_of_default_model(default_model, hearth_home):
    eng = Engine(backend="torch", home=hearth_home)
    plan = eng.memory_plan(default_model.id, context_length=4096)
    assert plan.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2
    assert plan.weight_bytes == 134_515_008 * 4             # fp32 on the torch backend
    free, total, where = eng.free_memory()
    assert where == "RAM" and 0 < free <= total
    assert plan.fits(free, where).ok
