// Memory admission (remat/train/memory/admission.h): predictions from the config alone, and the refusal
// with both figures and the options that would fit. flux-dev is never built here.
#include <gtest/gtest.h>

#include "remat/models/flux.h"
#include "remat/models/lora.h"
#include "remat/train/memory/admission.h"
#include "remat/train/options/config.h"

namespace remat::train {
namespace {
namespace admission_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

TransformerSpec flux(const std::string& flavour) {
  TransformerSpec spec;
  spec.family = "flux";
  spec.flavour = flavour;
  return spec;
}

TEST(Admission, PredictsWeightsGradientsAndOptimizerState) {
  const int64_t dev = 11901408320LL;  // models::parameter_count(flux-dev)
  const auto weights = predict_model_memory(flux("flux-dev"), ModelUse{});
  ASSERT_TRUE(weights.has_value());
  EXPECT_EQ(weights->parameters, dev);
  EXPECT_EQ(weights->weight_bytes, 4 * dev);
  EXPECT_EQ(weights->total(), 4 * dev);

  ModelUse full;
  full.training = true;
  EXPECT_EQ(predict_model_memory(flux("flux-dev"), full)->total(), 16 * dev);

  ModelUse lora = full;
  lora.lora_rank = 16;
  lora.lora_target = "all";
  const int64_t factors = models::lora_parameter_count(models::linear_layers(models::FluxConfig::preset("flux-dev")),
                                                       models::flux_lora_target_modules("all"), 16);
  const auto d = predict_model_memory(flux("flux-dev"), lora);
  EXPECT_EQ(d->trainable, factors);
  EXPECT_EQ(d->weight_bytes, 4 * (dev + factors));
  EXPECT_EQ(d->gradient_bytes, 4 * factors);
  EXPECT_EQ(d->optimizer_bytes, 8 * factors);
}

// Block swap: the swapped blocks' Linear weights leave the device and the ring comes in; the
// figures are those of the model's own block swap, less the few norm weights inside the blocks.
TEST(Admission, BlockSwapMovesTheLastBlocksWeightsToTheHost) {
  ModelUse lora;
  lora.training = true;
  lora.lora_rank = 4;
  lora.lora_target = "all";
  const auto without = predict_model_memory(flux("flux-small"), lora);
  lora.blocks_to_swap = 9;  // flux-small: 4 double and 8 single blocks; the last 9 = 1 double + 8 single
  const auto with = predict_model_memory(flux("flux-small"), lora);
  ASSERT_TRUE(without && with);

  models::Flux model(models::FluxConfig::preset("flux-small"));
  models::apply_lora(*model, models::flux_lora_target_modules("all"), 4, 4.0);
  int64_t norm_bytes = 0;
  for (const auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    const bool swapped = name.rfind("transformer_blocks.3.", 0) == 0 || name.rfind("single_transformer_blocks.", 0) == 0;
    if (swapped && !item.value().requires_grad() && name.find("norm") != std::string::npos &&
        name.find(".linear.") == std::string::npos) {  // RMSNorm weights, not the AdaLayerNorm Linears
      norm_bytes += item.value().numel() * 4;
    }
  }
  model->set_block_swap(9);
  const WeightStreamStats s = model->block_swap()->stats();
  EXPECT_EQ(with->swapped_weight_bytes + norm_bytes, s.host_bytes);
  EXPECT_GT(with->swapped_weight_bytes, 0);
  // The ring: two of the largest swapped block (the double block), each tensor 256-byte aligned.
  EXPECT_LE(with->swap_ring_bytes, s.device_bytes);
  EXPECT_GE(static_cast<double>(with->swap_ring_bytes), 0.99 * static_cast<double>(s.device_bytes));
  EXPECT_EQ(without->weight_bytes - with->weight_bytes, with->swapped_weight_bytes - with->swap_ring_bytes);
}

// use_ema where the average lives on the device: 4 bytes per trainable parameter, in the total
// and named in the refusal.
TEST(Admission, CountsTheEmaWeightsWhereTheyLive) {
  ModelUse full;
  full.training = true;
  const auto without = predict_model_memory(flux("flux-small"), full);
  full.ema = true;
  const auto with = predict_model_memory(flux("flux-small"), full);
  ASSERT_TRUE(without && with);
  EXPECT_EQ(with->ema_bytes, 4 * with->trainable);
  EXPECT_EQ(with->total() - without->total(), with->ema_bytes);
  try {
    admit_model(flux("flux-small"), full, at::Device(at::kCPU), int64_t{32} << 20);
    FAIL();
  } catch (const ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find(", EMA weights "), std::string::npos) << e.what();
  }
  TrainConfig config;
  config.use_ema = true;
  EXPECT_TRUE(ema_lives_on(config, at::Device(at::kCPU)));       // a CPU run: always
  EXPECT_FALSE(ema_lives_on(config, at::Device(at::kCUDA, 0)));  // ema_device cpu
  config.ema_device = "accelerator";
  EXPECT_TRUE(ema_lives_on(config, at::Device(at::kCUDA, 0)));
  config.ema_cpu_only = true;
  EXPECT_FALSE(ema_lives_on(config, at::Device(at::kCUDA, 0)));
}

TEST(Admission, RefusesWithBothFiguresAndWhatWouldFit) {
  ModelUse lora;
  lora.training = true;
  lora.lora_rank = 16;
  lora.lora_target = "all";
  lora.lora_flag = "--model_type=lora";
  const int64_t available = int64_t{24} << 30;
  try {
    admit_model(flux("flux-dev"), lora, at::Device(at::kCPU), available);
    FAIL() << "flux-dev needs about 44 GiB";
  } catch (const ValidationError& e) {
    const std::string text = e.what();
    EXPECT_EQ(e.option(), "model_flavour");
    EXPECT_NE(text.find("[memory] flux-dev (11,927,557,184 parameters, 26,148,864 trainable)"), std::string::npos) << text;
    EXPECT_NE(text.find("LoRA training needs 44."), std::string::npos) << text;
    EXPECT_NE(text.find("(weights 44."), std::string::npos) << text;
    EXPECT_NE(text.find("but cpu has 24.00 GiB available"), std::string::npos) << text;
    EXPECT_NE(text.find("--model_flavour=flux-tiny"), std::string::npos) << text;
    EXPECT_NE(text.find("--model_flavour=flux-small"), std::string::npos) << text;
    EXPECT_EQ(text.find("--model_flavour=flux-schnell"), std::string::npos) << text;  // as large as dev
    EXPECT_NE(text.find("--skip_memory_check"), std::string::npos) << text;
  }
  // Full training of flux-small (~4.5M parameters x 16 bytes) does not fit 32 MiB; LoRA of it
  // (its float32 weights and small factors) does, and is suggested.
  ModelUse full;
  full.training = true;
  full.lora_flag = "--model_type=lora";
  try {
    admit_model(flux("flux-small"), full, at::Device(at::kCPU), int64_t{32} << 20);
    FAIL();
  } catch (const ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("These would fit: --model_type=lora ("), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(admit_model(flux("flux-tiny"), full, at::Device(at::kCPU), int64_t{32} << 20));
}

}  // namespace admission_test
}  // namespace
}  // namespace remat::train
