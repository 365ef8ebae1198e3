// The one Python module of the CPU kernels (strand/kernels/_cpu_build.py builds it from every source in
// this folder). pybind11 rather than TORCH_LIBRARY: a call costs about 0.8 us here against about
// 4 us through the dispatcher, and a decode step makes some 200 of them.
#include <torch/csrc/utils/pybind.h>

#include "decode_stack.h"
#include "kernels.h"
#include "linear_panels_bf16.h"

// The calls that run long (a whole decode step, attention, products: tens of microseconds to
// milliseconds) let go of the GIL while they compute (`release`), as torch's own ops do: another
// thread of the process (the engine service's event loop) runs meanwhile instead of waiting for
// the step to end. Measured on the ring, this moved neither TTFT nor throughput beyond the
// spread; it is kept for the loop taking adds and aborts during
// a step. Short elementwise calls keep the GIL: they take microseconds, and each release is a
// chance for the other thread to take it for longer.
namespace {
const auto release = py::call_guard<py::gil_scoped_release>();
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attention", &decode_attention, "paged decode attention, float32 or bfloat16",
        release);
  m.def("prefill_attention", &prefill_attention,
        "varlen causal prefill attention over the paged cache, float32 or bfloat16", release);
  m.def("prefill_attention_pairs", &prefill_attention_pairs,
        "the same for bfloat16 by VDPBF16PS (only where prefill_attention_pairs_available())",
        release);
  m.def("prefill_attention_pairs_available", &prefill_attention_pairs_available,
        "whether this build and the CPU have AVX512_BF16's VDPBF16PS");
  m.def("prefill_attention_amx", &prefill_attention_amx,
        "the same, bfloat16 on AMX tiles (only where prefill_attention_amx_available())",
        release);
  m.def("prefill_attention_amx_available", &prefill_attention_amx_available,
        "whether this build, the CPU and the OS allow AMX bfloat16 tiles");
  m.def("linear_small", &linear_small, "x @ w.T (+ bias) for 1 to 4 rows of x, float32 or bfloat16",
        py::arg("out"), py::arg("x"), py::arg("weight"), py::arg("bias") = py::none(), release);
  m.def("linear_batch", &linear_batch,
        "x @ w.T (+ bias) on the dense weight for a decode batch of rows, float32 or bfloat16",
        py::arg("out"), py::arg("x"), py::arg("weight"), py::arg("bias") = py::none(), release);
  m.def("linear_panel_width", &linear_panel_width, "output columns a panel of pack_panels");
  m.def("pack_panels", &pack_panels,
        "a float32 weight [N, K] regrouped into [ceil(N / width), K, width] panels for linear_panels",
        release);
  m.def("linear_panels", &linear_panels,
        "x @ w.T (+ bias), float32, w as pack_panels left it (any number of rows)",
        py::arg("out"), py::arg("x"), py::arg("panels"), py::arg("bias") = py::none(), release);
  m.def("linear_panel_bf16_width", &linear_panel_bf16_width,
        "output columns a panel of pack_panels_bf16");
  m.def("linear_panels_bf16_dp", &linear_panels_bf16_dp,
        "whether linear_panels_bf16 runs on VDPBF16PS here (else it widens to float32)");
  m.def("pack_panels_bf16", &pack_panels_bf16,
        "a bfloat16 weight [N, K] regrouped into [ceil(N / width), ceil(K / 2), width, 2] panels",
        release);
  m.def("linear_panels_bf16", &linear_panels_bf16,
        "x @ w.T (+ bias), bfloat16, w as pack_panels_bf16 left it (any number of rows)",
        py::arg("out"), py::arg("x"), py::arg("panels"), py::arg("bias") = py::none(), release);
  m.def("gguf_linear_small", &gguf_linear_small,
        "x @ w.T (+ bias) for 1 to 4 rows of x, w packed in GGUF Q8_0 / Q4_0 / Q4_1 blocks",
        py::arg("out"), py::arg("x"), py::arg("packed"), py::arg("qtype"),
        py::arg("bias") = py::none(), release);
  m.def("gguf_tiled_linear", &gguf_tiled_linear,
        "x @ w.T (+ bias) for any number of rows of x, w in GGUF 16-row tiles (gguf_tile), x "
        "rounded to int8 blocks once",
        py::arg("out"), py::arg("x"), py::arg("tiles"), py::arg("qtype"),
        py::arg("bias") = py::none(), release);
  m.def("gguf_dequantize", &gguf_dequantize,
        "GGUF Q8_0 / Q4_0 / Q4_1 blocks (rows or 16-row tiles) to float32 rows", release);
  m.def("gguf_tile", &gguf_tile, "GGUF rows regrouped into 16-row tiles for the decode kernel");
  m.def("gguf_untile", &gguf_untile, "16-row tiles back to GGUF rows");
  m.def("gguf_q6k_to_q6f", &gguf_q6k_to_q6f, "Q6_K rows rewritten as Q6_F blocks", release);
  py::class_<DecodeStack>(m, "DecodeStack",
                          "a model's Llama-family decoder layers for decode steps of 1 to 64 "
                          "rows (past 4: dense weights or GGUF tiles)")
      .def(py::init<at::Tensor, int64_t, int64_t, int64_t, double, double>(),
           py::arg("cos_sin"), py::arg("num_heads"), py::arg("num_kv_heads"),
           py::arg("head_dim"), py::arg("eps"), py::arg("scale"))
      .def("add_layer", &DecodeStack::add_layer)
      .def("add_part", &DecodeStack::add_part, py::arg("projection"), py::arg("w"),
           py::arg("qtype"))
      .def("forward", &DecodeStack::forward, release)
      .def("set_ends", &DecodeStack::set_ends, py::arg("embedding"), py::arg("norm"),
           py::arg("head_weight"), py::arg("qtype"), py::arg("eps"), py::arg("vocab"),
           py::arg("head_rows"), py::arg("embed_qtype") = 0)
      .def("set_batch_weights", &DecodeStack::set_batch_weights, py::arg("packed"),
           py::arg("head") = py::none())
      .def("logits", &DecodeStack::logits, release);
  m.def("rms_norm", &rms_norm, "RMSNorm over rows, float32 or bfloat16");
  m.def("add_rms_norm", &add_rms_norm, "residual add then RMSNorm, float32 or bfloat16");
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up over rows, float32 or bfloat16");
  m.def("rotary_neox", &rotary_neox, "NeoX rotary embedding in place, float32 or bfloat16");
  m.def("write_kv", &write_kv, "key/value rows into the paged cache by slot, any dtype");
  m.def("argmax", &argmax, "first index of each row's maximum, float32");
}
