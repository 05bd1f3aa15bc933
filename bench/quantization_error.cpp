// Weight-only quantisation, measured: (1) relative error of a Linear's output per mode
// (||y_q - y|| / ||y||, y in float64 from the full-precision weight) on random and on structured
// weights and inputs at flux-dev's shapes; (2) forward time of the dequantise-on-the-fly path
// against the full-precision matmul and, where this LibTorch has FBGEMM, its fused int8 kernel;
// (3) the bytes flux-small holds per mode, from the tracking allocator. Prints numbers only.
//
//   build/bench/quantization_error [--tokens N] [--repeats N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/torch.h>

#include "remat/memory.h"
#include "remat/models/flux.h"
#include "remat/models/quantization.h"
#include "remat/models/quantized_loading.h"

namespace {

using remat::models::BasePrecision;
using remat::models::WeightQuantization;

struct Mode {
  const char* name;
  WeightQuantization mode;
  bool double_quantization;
};

std::vector<Mode> modes() {
  std::vector<Mode> out = {{"int8 (int8-quanto)", WeightQuantization::int8, false},
                           {"nf4", WeightQuantization::nf4, false},
                           {"nf4+dq (nf4-bnb)", WeightQuantization::nf4, true}};
  if (remat::models::float8_supported()) out.push_back({"fp8 e4m3", WeightQuantization::fp8, false});
  return out;
}

double relative_error(const at::Tensor& y, const at::Tensor& reference) {
  return ((y.to(at::kDouble) - reference).norm() / reference.norm()).item<double>();
}

template <typename Fn>
double median_ms(int repeats, Fn fn) {
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Random: kaiming-like N(0, 1/in) weights, N(0, 1) inputs. Structured: heavy-tailed weights
// (a log-normal scale per element) with a few large output rows, and inputs with a handful of
// outlier channels 20x the rest, as transformer activations have.
std::pair<at::Tensor, at::Tensor> case_tensors(bool structured, int64_t out, int64_t in, int64_t tokens) {
  at::Tensor w = torch::randn({out, in}) / std::sqrt(static_cast<double>(in));
  at::Tensor x = torch::randn({tokens, in});
  if (structured) {
    w = w * torch::exp(torch::randn({out, in}) * 0.75);
    w.narrow(0, 0, 8).mul_(10.0);
    x.narrow(1, 0, 6).mul_(20.0);
  }
  return {w, x};
}

}  // namespace

int main(int argc, char** argv) {
  remat::memory::install_cpu_tracking();
  int64_t tokens = 32;
  int repeats = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokens")) tokens = std::stoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--repeats")) repeats = std::stoi(argv[i + 1]);
  }
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);

  std::printf("== relative output error ||y_q - y|| / ||y|| (float64 reference), %lld tokens ==\n",
              static_cast<long long>(tokens));
  std::printf("%-20s %-11s %-14s %12s\n", "mode", "inputs", "shape (out,in)", "rel. error");
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{3072, 3072}, {12288, 3072}};
  for (const bool structured : {false, true}) {
    for (const auto& shape : shapes) {
      const auto wx = case_tensors(structured, shape.first, shape.second, tokens);
      const at::Tensor reference = at::linear(wx.second.to(at::kDouble), wx.first.to(at::kDouble));
      for (const auto& m : modes()) {
        const auto q = remat::models::quantize_weight(wx.first, m.mode, m.double_quantization);
        const double err = relative_error(remat::models::quantized_linear(wx.second, q, at::Tensor()), reference);
        std::printf("%-20s %-11s %5lld x %-6lld %12.3e\n", m.name, structured ? "structured" : "random",
                    static_cast<long long>(shape.first), static_cast<long long>(shape.second), err);
      }
      const double bf16 = relative_error(at::linear(wx.second.to(at::kBFloat16), wx.first.to(at::kBFloat16)), reference);
      std::printf("%-20s %-11s %5lld x %-6lld %12.3e\n", "bf16 (no_change)", structured ? "structured" : "random",
                  static_cast<long long>(shape.first), static_cast<long long>(shape.second), bf16);
    }
  }

  std::printf("\n== forward time, 3072 -> 12288, %lld tokens, float32 activations, median of %d, %d threads ==\n",
              static_cast<long long>(tokens), repeats, torch::get_num_threads());
  const auto wx = case_tensors(false, 12288, 3072, tokens);
  const at::Tensor& w = wx.first;
  const at::Tensor& x = wx.second;
  const at::Tensor reference = at::linear(x.to(at::kDouble), w.to(at::kDouble));
  std::printf("%-34s %10s %12s\n", "path", "ms", "rel. error");
  std::printf("%-34s %10.2f %12.3e\n", "float32 at::linear", median_ms(repeats, [&] { at::linear(x, w); }),
              relative_error(at::linear(x, w), reference));
  for (const auto& m : modes()) {
    const auto q = remat::models::quantize_weight(w, m.mode, m.double_quantization);
    const std::string label = std::string("dequantise + linear, ") + m.name;
    std::printf("%-34s %10.2f %12.3e\n", label.c_str(),
                median_ms(repeats, [&] { remat::models::quantized_linear(x, q, at::Tensor()); }),
                relative_error(remat::models::quantized_linear(x, q, at::Tensor()), reference));
  }
  const auto& engines = at::globalContext().supportedQEngines();
  const bool fbgemm = std::find(engines.begin(), engines.end(), at::QEngine::FBGEMM) != engines.end();
  if (fbgemm) {
    // FBGEMM's fused kernel: per-tensor int8 weight, activations quantised dynamically to uint8,
    // float32 only, forward only (no autograd formula).
    const auto quantized = at::fbgemm_linear_quantize_weight(w);
    const at::Tensor packed = at::fbgemm_pack_quantized_matrix(std::get<0>(quantized));
    const at::Tensor bias = torch::zeros({w.size(0)});
    auto run = [&] {
      return at::fbgemm_linear_int8_weight_fp32_activation(x, std::get<0>(quantized), packed, std::get<1>(quantized),
                                                           std::get<2>(quantized), std::get<3>(quantized), bias);
    };
    std::printf("%-34s %10.2f %12.3e\n", "FBGEMM fused int8 (per tensor)", median_ms(repeats, run),
                relative_error(run(), reference));
  } else {
    std::string names;
    for (const auto e : engines) names += (names.empty() ? "" : ", ") + std::string(c10::toString(e));
    std::printf("FBGEMM fused int8: not available (this LibTorch's quantized engines: %s)\n",
                names.empty() ? "none" : names.c_str());
  }

  // oneDNN / QNNPACK (the engines Debian's build has): quantized::linear_dynamic, per-channel int8
  // weight, activations quantised per call, forward only. Called boxed through the dispatcher.
  for (const auto engine : engines) {
    if (engine != at::QEngine::ONEDNN && engine != at::QEngine::QNNPACK) continue;
    try {
      at::globalContext().setQEngine(engine);
      const at::Tensor scales = (w.abs().amax(1) / 127.0).to(at::kDouble);
      const at::Tensor zeros = torch::zeros({w.size(0)}, at::kLong);
      const at::Tensor qw = at::quantize_per_channel(w, scales, zeros, 0, at::kQInt8);
      auto& dispatcher = c10::Dispatcher::singleton();
      torch::jit::Stack stack{qw, c10::IValue()};
      dispatcher.findSchemaOrThrow("quantized::linear_prepack", "").callBoxed(&stack);
      const c10::IValue packed = stack.at(0);
      const auto op = dispatcher.findSchemaOrThrow("quantized::linear_dynamic", "");
      auto run = [&] {
        torch::jit::Stack s{x, packed, false};
        op.callBoxed(&s);
        return s.at(0).toTensor();
      };
      const std::string label = std::string("linear_dynamic int8, ") + c10::toString(engine);
      std::printf("%-34s %10.2f %12.3e\n", label.c_str(), median_ms(repeats, run), relative_error(run(), reference));
    } catch (const c10::Error& e) {
      std::printf("linear_dynamic int8, %s: unavailable (%s)\n", c10::toString(engine).c_str(),
                  std::string(e.what_without_backtrace()).substr(0, 120).c_str());
    }
  }

  std::printf("\n== flux-small weight bytes held (tracking allocator, float32 model) ==\n");
  const auto config = remat::models::FluxConfig::preset("flux-small");
  for (const char* name : {"no_change", "int8-quanto", "nf4-bnb"}) {
    const BasePrecision precision = remat::models::parse_base_model_precision(name);
    const int64_t before = remat::memory::current_bytes();
    auto model = remat::models::make_quantized_flux(config, precision);
    const int64_t held = remat::memory::current_bytes() - before;
    std::printf("%-12s %12lld B  %s\n", name, static_cast<long long>(held), remat::memory::format_bytes(held).c_str());
  }
  return 0;
}
