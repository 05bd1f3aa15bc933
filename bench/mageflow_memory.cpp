// MageFlow's memory model: the bytes of each component's weights at the published sizes, from the
// configs alone (nothing is allocated), as admission counts them: Qwen3-VL-4B's language model
// (the text encoder; the vision tower is never loaded), Mage-VAE, and the 4B transformer, each at
// bfloat16 and with its Linear layers stored int8 or NF4 (models::quantized_weight_bytes; the other
// parameters bfloat16). remat quantises only the transformer's Linears (base_model_precision); the
// text encoder's rows say what the same storage would take. Mage-VAE is convolutions: no Linear to
// quantise. Also the activation peak of one VAE decode (mage_vae_peak_bytes) per picture side, and
// a LoRA run's demand (predict_model_memory: weights, rank-16 factors with their gradients and
// AdamW state) per base precision.
//
// usage: mageflow_memory

#include <cstdio>
#include <string>
#include <vector>

#include "remat/encoders/mage_vae.h"
#include "remat/encoders/mageflow_encoders.h"
#include "remat/encoders/qwen3_text_model.h"
#include "remat/memory.h"
#include "remat/models/quantization.h"
#include "remat/train/family/transformer.h"
#include "remat/train/memory/admission.h"

using namespace remat;

namespace {

double gib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0); }

// Qwen3's Linear layers per decoder layer: q, k, v, o, gate, up, down.
int64_t text_encoder_bytes(const encoders::Qwen3TextConfig& c, const models::BasePrecision& precision) {
  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  const std::vector<std::pair<int64_t, int64_t>> linears = {
      {q, c.hidden_size}, {kv, c.hidden_size}, {kv, c.hidden_size}, {c.hidden_size, q},
      {c.intermediate_size, c.hidden_size}, {c.intermediate_size, c.hidden_size}, {c.hidden_size, c.intermediate_size}};
  int64_t linear_parameters = 0, linear_bytes = 0;
  for (const auto& [out, in] : linears) {
    linear_parameters += out * in;
    const bool bf16 = precision.mode == models::WeightQuantization::none;
    linear_bytes += bf16 ? 2 * out * in : models::quantized_weight_bytes(out, in, precision);
  }
  const int64_t others = c.parameter_count() - c.num_hidden_layers * linear_parameters;
  return c.num_hidden_layers * linear_bytes + 2 * others;
}

}  // namespace

int main() {
  const encoders::Qwen3TextConfig text;  // Qwen3-VL-4B's
  const encoders::MageVaeConfig vae;     // the published Mage-VAE
  std::printf("MageFlow weights by component (published sizes, from the configs alone)\n");
  std::printf("%-16s %14s %12s %12s %12s\n", "component", "parameters", "bf16 GiB", "int8 GiB", "nf4 GiB");
  const std::vector<std::string> precisions = {"no_change", "int8-quanto", "nf4-bnb"};
  std::printf("%-16s %14lld", "text_encoder", static_cast<long long>(text.parameter_count()));
  for (const auto& p : precisions) {
    std::printf(" %12.3f", gib(text_encoder_bytes(text, models::parse_base_model_precision(p))));
  }
  std::printf("\n%-16s %14lld %12.3f %12s %12s\n", "vae", static_cast<long long>(vae.parameter_count()),
              gib(2 * vae.parameter_count()), "-", "-");
  train::TransformerSpec spec;
  spec.family = "mageflow";
  spec.flavour = "base";
  int64_t transformer_parameters = 0;
  std::vector<int64_t> transformer_bytes;
  for (const auto& p : precisions) {
    spec.base_precision = models::parse_base_model_precision(p);
    train::ModelUse use;
    use.weight_element_bytes = 2;
    use.base_precision = spec.base_precision;
    const auto demand = train::predict_model_memory(spec, use);
    transformer_parameters = demand->parameters;
    transformer_bytes.push_back(demand->weight_bytes);
  }
  std::printf("%-16s %14lld", "transformer", static_cast<long long>(transformer_parameters));
  for (const int64_t b : transformer_bytes) std::printf(" %12.3f", gib(b));
  std::printf("\n\nMage-VAE activation peak of one decode (the larger of encode and decode), bfloat16\n");
  for (const int64_t side : {512, 768, 1024, 1536}) {
    std::printf("  %4lld x %-4lld %s\n", static_cast<long long>(side), static_cast<long long>(side),
                memory::format_bytes(encoders::mage_vae_peak_bytes(vae, side, side, 2)).c_str());
  }
  std::printf("\nA LoRA run's transformer demand (rank 16 on the default targets, bf16 weights)\n");
  for (const auto& p : precisions) {
    spec.base_precision = models::parse_base_model_precision(p);
    train::ModelUse use;
    use.weight_element_bytes = 2;
    use.base_precision = spec.base_precision;
    use.training = true;
    use.lora_rank = 16;
    use.lora_target = "default";
    const auto demand = train::predict_model_memory(spec, use);
    std::printf("  %-12s weights %s, LoRA %lld trainable, gradients + AdamW %s, total %s\n", p.c_str(),
                memory::format_bytes(demand->weight_bytes).c_str(), static_cast<long long>(demand->trainable),
                memory::format_bytes(demand->gradient_bytes + demand->optimizer_bytes).c_str(),
                memory::format_bytes(demand->total()).c_str());
  }
  return 0;
}
