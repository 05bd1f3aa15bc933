// Memory and time of every checkpoint mode on a small Flux, beside the analytical prediction of
// the activation model in docs/SEGMENTED_CHECKPOINTING.md ("Activation model"; the printed
// "model" columns are that model). For each mode: the tracked peak of a LoRA training step (forward, loss,
// backward, AdamW step), the median step time, and the peak that the model's per-block activation
// counts predict when fed through remat's memory timeline (remat::predict).
//
// The model counts saved tensors in units of B*n*D elements: a double block keeps 18 units per
// stream (10 + 2M with M = 4), a single block 17 (9 + 2M), LoRA (no modulation gradients). On
// LibTorch 1.13 the attention is a composite that also keeps its softmax, (B, H, N, N) float32,
// which the model's fused-attention count does not have; the prediction adds it and says so.
//
// usage: flux_memory_modes [preset=flux-small] [image_tokens=256] [text_tokens=64] [steps=3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include <torch/torch.h>

#include "remat/memory.h"
#include "remat/models/flux.h"
#include "remat/plan.h"
#include "remat/train/family/transformer.h"

namespace {

using namespace remat;

struct Mode {
  std::string name;
  CheckpointPlan plan;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The activation model's per-block costs (float32: 4 bytes per element) for a chain of blocks.
Chain analytical_chain(const models::FluxConfig& c, int64_t B, int64_t n_img, int64_t n_txt,
                       int64_t fixed_bytes, bool with_attention_matrix) {
  const double D = static_cast<double>(c.hidden_size()), M = 4, bytes = 4;
  const double N = static_cast<double>(n_img + n_txt);
  const double attention = with_attention_matrix ? B * c.num_attention_heads * N * N * bytes : 0;
  const auto block = [&](const std::string& kind, double units) {
    const double s = B * N * D * bytes;  // the state: both streams, or the joint sequence
    BlockCost cost;
    cost.kind = kind;
    cost.retained_input_bytes = static_cast<int64_t>(s);                     // the LN input
    cost.activation_bytes = static_cast<int64_t>((units - 1) * s + attention);
    cost.boundary_bytes = cost.output_bytes = static_cast<int64_t>(s);
    cost.boundary_grad_bytes = cost.output_grad_bytes = static_cast<int64_t>(s);
    cost.forward_peak_bytes = cost.activation_bytes + cost.output_bytes;
    cost.backward_peak_bytes = static_cast<int64_t>((M + 1) * s);  // FFN hidden + input gradient
    return cost;
  };
  Chain chain;
  for (int64_t i = 0; i < c.num_layers; ++i) chain.blocks.push_back(block("double", 10 + 2 * M));
  for (int64_t i = 0; i < c.num_single_layers; ++i) chain.blocks.push_back(block("single", 9 + 2 * M));
  chain.forced_boundaries = {c.num_layers};
  chain.fixed_bytes = fixed_bytes;
  return chain;
}

}  // namespace

int main(int argc, char** argv) {
  memory::install_cpu_tracking();
  torch::set_num_threads(1);  // see docs/PERFORMANCE.md, "Threads"
  const std::string preset = argc > 1 ? argv[1] : "flux-small";
  const int64_t n_img = argc > 2 ? std::atoll(argv[2]) : 256, n_txt = argc > 3 ? std::atoll(argv[3]) : 64;
  const int64_t steps = argc > 4 ? std::atoll(argv[4]) : 3;
  const int64_t side = static_cast<int64_t>(std::sqrt(static_cast<double>(n_img)));
  TORCH_CHECK_VALUE(side * side == n_img, "image_tokens must be a square number, got ", n_img);
  const int64_t B = 1;

  torch::manual_seed(0);
  train::TransformerSpec spec;
  spec.family = "flux";
  spec.flavour = preset;
  auto model = train::make_transformer(spec, at::Device(at::kCPU));
  model->apply_lora("all", 16, 16.0);
  model->module().train();
  const auto config = models::FluxConfig::preset(preset);
  std::vector<at::Tensor> params;
  for (auto& [name, p] : model->trainable_parameters()) params.push_back(p);
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(1e-4));

  train::Batch batch;
  batch.latents = torch::randn({B, 16, 2 * side, 2 * side});
  batch.prompt_embeds = torch::randn({B, n_txt, config.joint_attention_dim});
  batch.pooled_prompt_embeds = torch::randn({B, config.pooled_projection_dim});
  at::Generator generator = at::detail::createCPUGenerator(1);
  const train::FlowMatchingOptions flow;

  const auto interval = [](int64_t n, std::optional<int64_t> stride = std::nullopt,
                           const std::string& backend = "torch") {
    return CheckpointPlan::simpletuner(true, n, stride, backend);
  };
  const CheckpointPlan off = CheckpointPlan::off(), ffn = interval(1, std::nullopt, "torch-ffn"),
                       unsloth = interval(1, std::nullopt, "unsloth"),
                       unsloth_ffn = interval(1, std::nullopt, "unsloth-ffn");
  const std::vector<Mode> modes{{"off", off},          {"per-block", interval(1)},
                                {"interval 2", interval(2)}, {"interval 3", interval(3)},
                                {"2 stride 3", interval(2, 3)}, {"torch-ffn", ffn},
                                {"unsloth", unsloth},  {"unsloth-ffn", unsloth_ffn}};

  const auto step = [&](const Mode& mode) {
    model->set_checkpoint_plan(mode.plan);
    memory::reset_peak();
    const auto start = std::chrono::steady_clock::now();
    model->flow_matching_loss(batch, flow, generator).backward();
    optimizer.step();
    for (auto& p : params) p.mutable_grad().reset();
    return std::make_pair(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                          memory::peak_bytes());
  };
  step(modes[0]);  // creates the optimizer state: from here on the fixed bytes are fixed
  const int64_t fixed = memory::current_bytes();

  std::vector<std::vector<double>> times(modes.size());
  std::vector<int64_t> peaks(modes.size(), 0);
  for (int64_t round = 0; round < steps; ++round) {
    for (size_t m = 0; m < modes.size(); ++m) {
      const auto [seconds, peak] = step(modes[m]);
      times[m].push_back(seconds);
      peaks[m] = std::max(peaks[m], peak);
    }
  }

  // Interval layouts through the analytical chain (the ffn modes have no chain layout).
  const Chain chain = analytical_chain(config, B, n_img, n_txt, fixed, /*with_attention_matrix=*/true);
  const Chain chain_fused = analytical_chain(config, B, n_img, n_txt, fixed, false);
  const auto layout_of = [&](const CheckpointPlan& s) -> std::optional<Layout> {
    if (!s.enabled) return layout_keep_all(chain.num_blocks());
    if (s.ffn_scope()) return std::nullopt;
    return split_layout(layout_from_interval(chain.num_blocks(), s.interval.value_or(1), s.segment_stride),
                        chain.forced_boundaries);
  };
  std::printf("%s LoRA r16 step, B=%lld, %lld image + %lld text tokens, float32, 1 thread; fixed "
              "bytes (weights, LoRA grads, AdamW state) %s\n",
              preset.c_str(), static_cast<long long>(B), static_cast<long long>(n_img),
              static_cast<long long>(n_txt), memory::format_bytes(fixed).c_str());
  std::printf("| mode | median step | measured peak | model prediction (+composite attention) | error | model, fused attention |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (size_t m = 0; m < modes.size(); ++m) {
    const auto layout = layout_of(modes[m].plan);
    std::string predicted = "n/a (ffn scope)", error = "", fused = "";
    if (layout) {
      const int64_t p = predict(chain, *layout).peak_bytes;
      predicted = memory::format_bytes(p);
      char text[32];
      std::snprintf(text, sizeof(text), "%+.1f%%", 100.0 * (p - peaks[m]) / peaks[m]);
      error = text;
      fused = memory::format_bytes(predict(chain_fused, *layout).peak_bytes);
    }
    std::printf("| %s | %.1f ms | %s | %s | %s | %s |\n", modes[m].name.c_str(), median(times[m]) * 1e3,
                memory::format_bytes(peaks[m]).c_str(), predicted.c_str(), error.c_str(), fused.c_str());
  }
  return 0;
}
