// Python bindings for engine._native. No math here: argument conversion and calls only.
// Everything that touches the GPU runs with the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "device_info.h"

#ifdef HEARTH_WITH_CUDA
#include "runtime/kernel_checks.h"
#include "runtime/model.h"
#endif

namespace py = pybind11;

#ifdef HEARTH_WITH_CUDA
namespace {

PyObject* g_cuda_error = nullptr;
PyObject* g_out_of_memory = nullptr;
PyObject* g_cache_full = nullptr;

template <typename T>
T get(const py::dict& d, const char* key, T fallback) {
  return d.contains(key) && !d[key].is_none() ? d[key].cast<T>() : fallback;
}

hearth::ModelConfig model_config(const py::dict& d) {
  hearth::ModelConfig c;
  c.layers = d["layers"].cast<int>();
  c.hidden = d["hidden"].cast<int>();
  c.heads = d["heads"].cast<int>();
  c.kv_heads = d["kv_heads"].cast<int>();
  c.head_dim = d["head_dim"].cast<int>();
  c.intermediate = d["intermediate"].cast<int>();
  c.vocab = d["vocab"].cast<int>();
  c.rms_eps = get<float>(d, "rms_eps", 1e-6f);
  c.rope_theta = get<double>(d, "rope_theta", 10000.0);
  c.rope_type = get<std::string>(d, "rope_type", "default");
  c.rope_factor = get<double>(d, "rope_factor", 1.0);
  c.rope_low_freq_factor = get<double>(d, "rope_low_freq_factor", 1.0);
  c.rope_high_freq_factor = get<double>(d, "rope_high_freq_factor", 4.0);
  c.rope_original_max_positions = get<int>(d, "rope_original_max_positions", 8192);
  c.tied_embeddings = get<bool>(d, "tied_embeddings", false);
  c.qkv_bias = get<bool>(d, "qkv_bias", false);
  c.qk_norm = get<bool>(d, "qk_norm", false);
  c.nvfp4 = get<bool>(d, "nvfp4", false);
  c.qk_norm_whole = get<bool>(d, "qk_norm_whole", false);
  c.moe_experts = get<int>(d, "moe_experts", 0);
  c.moe_top_k = get<int>(d, "moe_top_k", 0);
  c.moe_inter = get<int>(d, "moe_inter", 0);
  c.moe_shared_inter = get<int>(d, "moe_shared_inter", 0);
  c.moe_normalize = get<bool>(d, "moe_normalize", false);
  c.moe_layers = get<std::vector<uint8_t>>(d, "moe_layers", {});
  const std::string precision = get<std::string>(d, "precision", "fast");
  if (precision != "fast" && precision != "exact")
    throw std::invalid_argument("precision must be 'fast' or 'exact', not '" + precision + "'");
  c.precision = precision == "fast" ? hearth::Precision::Fast : hearth::Precision::Exact;
  return c;
}

hearth::CacheConfig cache_config(const py::dict& d) {
  hearth::CacheConfig c;
  c.block_size = get<int>(d, "block_size", 16);
  c.block_count = get<int>(d, "block_count", 0);
  c.max_sequence_blocks = d["max_sequence_blocks"].cast<int>();
  c.max_batch = get<int>(d, "max_batch", 8);
  c.chunk_tokens = get<int>(d, "chunk_tokens", 512);
  return c;
}

py::dict plan_dict(const hearth::MemoryPlan& plan) {
  py::dict d;
  d["weight_bytes"] = plan.weight_bytes;
  d["kv_blocks"] = plan.kv_blocks;
  d["kv_block_bytes"] = plan.kv_block_bytes;
  d["kv_bytes"] = plan.kv_bytes;
  py::dict parts;
  for (const auto& p : plan.workspace) parts[py::str(p.first)] = p.second;
  d["workspace"] = parts;
  d["workspace_bytes"] = plan.workspace_bytes;
  d["runtime_bytes"] = plan.runtime_bytes;
  d["total_bytes"] = plan.total_bytes();
  return d;
}

std::vector<hearth::SampleRequest> sample_requests(const py::list& rows) {
  std::vector<hearth::SampleRequest> out;
  for (const py::handle& h : rows) {
    py::dict d = h.cast<py::dict>();
    hearth::SampleRequest r;
    r.temperature = d["temperature"].cast<float>();
    r.top_k = d["top_k"].cast<int>();
    r.top_p = d["top_p"].cast<float>();
    r.min_p = d["min_p"].cast<float>();
    r.repetition_penalty = d["repetition_penalty"].cast<float>();
    r.seed = d["seed"].cast<uint64_t>();
    r.step = d["step"].cast<int64_t>();
    r.history = d["history"].cast<std::vector<int32_t>>();
    if (d.contains("mask") && !d["mask"].is_none()) r.mask = d["mask"].cast<std::vector<uint32_t>>();
    out.push_back(std::move(r));
  }
  return out;
}

using Bytes = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;

// An NVFP4 weight's codes and block scales (numpy) into a load call, with the GIL released.
template <typename Load>
void load_packed(const Bytes& codes, const Bytes& block_scales, Load load) {
  const uint8_t* c = codes.data();
  const uint8_t* s = block_scales.data();
  const int64_t cb = codes.nbytes(), sb = block_scales.nbytes();
  py::gil_scoped_release unlocked;
  load(c, cb, s, sb);
}

void bind_runtime(py::module_& m) {
  g_cuda_error = PyErr_NewException("engine._native.CudaError", PyExc_RuntimeError, nullptr);
  g_out_of_memory = PyErr_NewException("engine._native.OutOfMemory", PyExc_MemoryError, nullptr);
  g_cache_full = PyErr_NewException("engine._native.CacheFull", PyExc_RuntimeError, nullptr);
  m.attr("CudaError") = py::handle(g_cuda_error);
  m.attr("OutOfMemory") = py::handle(g_out_of_memory);
  m.attr("CacheFull") = py::handle(g_cache_full);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const hearth::DeviceOutOfMemory& e) {
      py::tuple args = py::make_tuple(e.what(), e.needed, e.free_bytes);
      PyErr_SetObject(g_out_of_memory, args.ptr());
    } catch (const hearth::CacheFull& e) {
      PyErr_SetString(g_cache_full, e.what());
    } catch (const hearth::CudaError& e) {
      PyErr_SetString(g_cuda_error, e.what());
    }
  });

  py::enum_<hearth::Slot>(m, "Slot")
      .value("embed", hearth::Slot::Embed).value("final_norm", hearth::Slot::FinalNorm)
      .value("lm_head", hearth::Slot::LmHead).value("attn_norm", hearth::Slot::AttnNorm)
      .value("wqkv", hearth::Slot::Wqkv).value("bqkv", hearth::Slot::Bqkv)
      .value("q_norm", hearth::Slot::QNorm).value("k_norm", hearth::Slot::KNorm)
      .value("wo", hearth::Slot::Wo).value("mlp_norm", hearth::Slot::MlpNorm)
      .value("wgu", hearth::Slot::Wgu).value("wdown", hearth::Slot::Wdown)
      .value("moe_router", hearth::Slot::MoeRouter).value("moe_shared_expert_gate", hearth::Slot::MoeSharedGate)
      .value("moe_gate_up", hearth::Slot::MoeGateUp).value("moe_down", hearth::Slot::MoeDown)
      .value("moe_shared_gate_up", hearth::Slot::MoeSharedGateUp)
      .value("moe_shared_down", hearth::Slot::MoeSharedDown);

  using hearth::Model;
  using release = py::call_guard<py::gil_scoped_release>;
  py::class_<Model>(m, "Model")
      .def(py::init([](const py::dict& config, const py::dict& cache) {
             hearth::ModelConfig c = model_config(config);
             hearth::CacheConfig k = cache_config(cache);
             py::gil_scoped_release unlocked;
             return std::make_unique<Model>(c, k);
           }),
           py::arg("config"), py::arg("cache"))
      .def("load_tensor", &Model::load_tensor, release(), py::arg("slot"), py::arg("layer"),
           py::arg("path"), py::arg("file_offset"), py::arg("nbytes"), py::arg("dtype"),
           py::arg("elem_offset"), py::arg("numel"))
      .def("load_nvfp4",
           [](Model& self, hearth::Slot slot, int layer, const Bytes& codes, const Bytes& block_scales,
              float global_scale) {
             load_packed(codes, block_scales, [&](const uint8_t* c, int64_t cb, const uint8_t* s, int64_t sb) {
               self.load_nvfp4(slot, layer, c, cb, s, sb, global_scale);
             });
           },
           py::arg("slot"), py::arg("layer"), py::arg("codes"), py::arg("block_scales"),
           py::arg("global_scale"))
      .def("load_nvfp4_expert",
           [](Model& self, hearth::Slot slot, int layer, int expert, const Bytes& codes,
              const Bytes& block_scales, float global_scale) {
             load_packed(codes, block_scales, [&](const uint8_t* c, int64_t cb, const uint8_t* s, int64_t sb) {
               self.load_nvfp4_expert(slot, layer, expert, c, cb, s, sb, global_scale);
             });
           },
           py::arg("slot"), py::arg("layer"), py::arg("expert"), py::arg("codes"),
           py::arg("block_scales"), py::arg("global_scale"))
      .def("finish_load", &Model::finish_load, release())
      .def("allocate_sequence", &Model::allocate_sequence)
      .def("release_sequence", &Model::release_sequence)
      .def("length", &Model::length)
      .def("truncate", &Model::truncate)
      .def("prefill",
           [](Model& self, int seq, std::vector<int32_t> tokens) {
             py::gil_scoped_release unlocked;
             self.prefill(seq, tokens, nullptr);
           })
      .def("score_into",
           [](Model& self, int seq, std::vector<int32_t> tokens,
              py::array_t<float, py::array::c_style> out) {
             if (out.ndim() != 2 || out.shape(0) != (py::ssize_t)tokens.size() ||
                 out.shape(1) != self.config().vocab)
               throw std::invalid_argument("score_into: out must be float32 [len(tokens), vocab]");
             float* dst = out.mutable_data();
             py::gil_scoped_release unlocked;
             self.prefill(seq, tokens, dst);
           })
      .def("decode", &Model::decode, release())
      .def("decode_sample",
           [](Model& self, std::vector<int> seqs, std::vector<int32_t> tokens, const py::list& rows) {
             auto requests = sample_requests(rows);
             py::gil_scoped_release unlocked;
             return self.decode_sample(seqs, tokens, requests);
           })
      .def("graph_buckets", &Model::graph_buckets)
      .def("sample",
           [](Model& self, const py::list& rows) {
             auto requests = sample_requests(rows);
             py::gil_scoped_release unlocked;
             return self.sample(requests);
           })
      .def("last_logits",
           [](Model& self) {
             py::array_t<float> out({(py::ssize_t)self.logits_rows(), (py::ssize_t)self.config().vocab});
             float* dst = out.mutable_data();
             {
               py::gil_scoped_release unlocked;
               self.copy_logits(dst);
             }
             return out;
           })
      .def("memory", [](Model& self) {
        hearth::MemoryReport r = self.memory();
        py::dict d;
        d["weight_bytes"] = r.weight_bytes;
        d["kv_bytes"] = r.kv_bytes;
        d["workspace_bytes"] = r.workspace_bytes;
        d["kv_blocks_free"] = r.free_blocks;
        d["kv_blocks_total"] = r.total_blocks;
        d["kv_block_size"] = r.block_size;
        d["sequences"] = r.sequences;
        d["gemm_backend"] = r.gemm_backend;
        d["precision"] = r.precision;
        return d;
      });

  m.def("plan_memory", [](const py::dict& config, const py::dict& cache) {
    return plan_dict(hearth::plan_memory(model_config(config), cache_config(cache)));
  }, py::arg("config"), py::arg("cache"),
        "Every byte a model with this config and cache would allocate (no device needed).");
  m.def("fp16_operand_scale", &hearth::fp16_operand_scale, py::arg("amax"));

  m.def("step_uniform", &hearth::step_uniform, py::arg("seed"), py::arg("step"));
  m.def("cublaslt_available", &hearth::cublaslt_available, release());

  namespace c = hearth::checks;
  py::module_ k = m.def_submodule("kernels", "Single-kernel entry points on raw device pointers (tests)");
  k.def("embedding", &c::embedding, release(), py::arg("ids"), py::arg("tokens"), py::arg("table"),
        py::arg("vocab"), py::arg("hidden"), py::arg("out"), py::arg("fp16") = false,
        py::arg("scale") = 1.f);
  k.def("rmsnorm_residual", &c::rmsnorm_residual, release(), py::arg("residual"), py::arg("delta"),
        py::arg("weight"), py::arg("out"), py::arg("rows"), py::arg("hidden"), py::arg("eps"),
        py::arg("delta_row_scale") = 0, py::arg("out16") = 0, py::arg("out16_scale") = 1.f);
  k.def("add_bias", &c::add_bias, release());
  k.def("head_rmsnorm", &c::head_rmsnorm, release());
  k.def("rope_inv_freq", [](const py::dict& config) { return c::rope_inv_freq(model_config(config)); });
  k.def("rope_kv_write", &c::rope_kv_write, release(), py::arg("qkv"), py::arg("tokens"), py::arg("heads"),
        py::arg("kv_heads"), py::arg("head_dim"), py::arg("positions"), py::arg("slots"), py::arg("inv_freq"),
        py::arg("q_out"), py::arg("k_cache"), py::arg("v_cache"), py::arg("q_norm") = 0, py::arg("k_norm") = 0,
        py::arg("eps") = 0.f);
  k.def("paged_attention", &c::paged_attention, release());
  k.def("prefill_key_splits", &hearth::prefill_key_splits, py::arg("rows"), py::arg("heads"),
        py::arg("head_dim"), py::arg("max_kv_len"), py::arg("part_rows"));
  k.def("swiglu", &c::swiglu, release(), py::arg("gate_up"), py::arg("out"), py::arg("rows"),
        py::arg("inter"), py::arg("out16") = 0, py::arg("row_scale") = 0);
  k.def("gemv_swiglu", &c::gemv_swiglu, release());
  k.def("gemv_nvfp4", &c::gemv_nvfp4, release(), py::arg("x"), py::arg("codes"), py::arg("block_scales"),
        py::arg("global_scale"), py::arg("out"), py::arg("rows"), py::arg("n"), py::arg("k"),
        py::arg("fast") = false, py::arg("x_scale") = 1.f, py::arg("x_amax") = 0, py::arg("x_amax_count") = 0);
  k.def("gemm_nvfp4", &c::gemm_nvfp4, release(), py::arg("x16"), py::arg("x_scale"), py::arg("codes"),
        py::arg("block_scales"), py::arg("global_scale"), py::arg("out"), py::arg("rows"), py::arg("n"), py::arg("k"));
  k.def("gemm_nvfp4_seconds", &c::gemm_nvfp4_seconds, release(), py::arg("x16"), py::arg("codes"),
        py::arg("block_scales"), py::arg("out"), py::arg("rows"), py::arg("n"), py::arg("k"), py::arg("copies"),
        py::arg("reps"), py::arg("expand"));
  k.def("nvfp4_expand", &c::nvfp4_expand, release(), py::arg("codes"), py::arg("block_scales"),
        py::arg("out"), py::arg("n"), py::arg("k"), py::arg("fp16"));
  k.def("decode_attention_launch", &c::decode_attention_launch, release());
  k.def("gemv_fused", &c::gemv_fused, release(), py::arg("x"), py::arg("w"), py::arg("out"),
        py::arg("rows"), py::arg("n"), py::arg("k"), py::arg("norm_weight"), py::arg("norm_partials"),
        py::arg("norm_count"), py::arg("eps"), py::arg("residual_partials"), py::arg("fp16") = false,
        py::arg("w_scale") = 1.f);
  k.def("gemv_blocks", [](int rows, int n, int k) { return hearth::gemv_blocks(rows, n, k); },
        py::arg("rows"), py::arg("n"), py::arg("k"));
  k.def("matmul", &c::matmul, release());
  k.def("gemm_fast", &c::gemm_fast, release());
  k.def("convert_to_f16", &c::convert_to_f16, release());
  k.def("amax_bf16", &c::amax_bf16, release());
  k.def("bf16_to_f16_inplace", &c::bf16_to_f16_inplace, release());
  k.def("convert_to_bf16", &c::convert_to_bf16, release());
  k.def("gemv_seconds", &c::gemv_seconds, release());
  k.def("gemv_nvfp4_seconds", &c::gemv_nvfp4_seconds, release(), py::arg("x"), py::arg("codes"),
        py::arg("block_scales"), py::arg("out"), py::arg("rows"), py::arg("n"), py::arg("k"), py::arg("copies"),
        py::arg("reps"), py::arg("fast") = false);
  k.def("moe_block", [](const py::dict& d) {
    auto pointers = [](const py::dict& e) {
      c::MoeExpertPointers p;
      p.gate_up = get<uintptr_t>(e, "gate_up", 0);
      p.down = get<uintptr_t>(e, "down", 0);
      p.gate_up_block_scales = get<uintptr_t>(e, "gate_up_block_scales", 0);
      p.down_block_scales = get<uintptr_t>(e, "down_block_scales", 0);
      p.gate_up_scales = get<uintptr_t>(e, "gate_up_scales", 0);
      p.down_scales = get<uintptr_t>(e, "down_scales", 0);
      return p;
    };
    c::MoeCheck m;
    m.path = d["path"].cast<std::string>();
    m.x = d["x"].cast<uintptr_t>();
    m.resid = d["resid"].cast<uintptr_t>();
    m.router = d["router"].cast<uintptr_t>();
    m.rows = d["rows"].cast<int>();
    m.hidden = d["hidden"].cast<int>();
    m.experts = d["experts"].cast<int>();
    m.top_k = d["top_k"].cast<int>();
    m.inter = d["inter"].cast<int>();
    m.shared_inter = get<int>(d, "shared_inter", 0);
    m.normalize = get<bool>(d, "normalize", false);
    m.split = get<bool>(d, "split", false);
    m.nvfp4 = get<bool>(d, "nvfp4", false);
    m.routed = pointers(d["routed"].cast<py::dict>());
    if (m.shared_inter > 0) m.shared = pointers(d["shared"].cast<py::dict>());
    py::gil_scoped_release unlocked;
    return c::moe_block(m);
  }, py::arg("spec"));
  k.def("moe_route", &c::moe_route, release(), py::arg("resid"), py::arg("norm_partials"), py::arg("norm_count"),
        py::arg("norm_weight"), py::arg("eps"), py::arg("router"), py::arg("router_rows"), py::arg("rows"),
        py::arg("hidden"), py::arg("experts"), py::arg("top_k"), py::arg("normalize"), py::arg("xn"));
  k.def("sample", [](uintptr_t logits, int rows, int vocab, const py::list& reqs) {
    auto requests = sample_requests(reqs);
    py::gil_scoped_release unlocked;
    return c::sample(logits, rows, vocab, requests);
  });
}

}  // namespace
#endif

PYBIND11_MODULE(_native, m) {
  m.doc() = "Hearth's compiled engine";
  m.def("build_info", [] {
    hearth::BuildInfo info = hearth::build_info();
    py::dict out;
    out["cuda_compiled"] = info.cuda_compiled;
    out["cuda_runtime_version"] = info.cuda_runtime_version;
    out["driver_version"] = info.driver_version;
    out["device_count"] = info.device_count;
    out["reason"] = info.reason;
    out["architectures"] = info.architectures;
#ifdef HEARTH_WITH_CUDA
    out["runtime"] = true;
#else
    out["runtime"] = false;
#endif
    return out;
  }, "What the extension was compiled with and how many CUDA devices it sees.");
#ifdef HEARTH_WITH_CUDA
  bind_runtime(m);
#endif
}
