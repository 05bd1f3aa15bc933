// The model-family registry: the built-in families as the rest of remat reads them, and a third
// family defined only here, in the test binary, that trains through remat::train without any
// other source file knowing it.
#include <filesystem>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/io/safetensors.h"
#include "remat/layout.h"
#include "remat/models/layers.h"
#include "remat/train/config.h"
#include "remat/train/family.h"
#include "remat/train/options.h"
#include "remat/train/safety_check.h"
#include "remat/train/schedule.h"
#include "remat/train/trainer.h"
#include "remat/train/transformer.h"
#include "temp_dir.h"

namespace remat::train {
namespace {
namespace family_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

namespace fs = std::filesystem;

// ---- a toy family: tokens of (C, H, W) latents, one stack of residual MLP blocks ----

constexpr int64_t kToyChannels = 4, kToyText = 8, kToyWidth = 16;

// Forward passes that ran the checkpoint plan's layout (the trainer owns and frees the model).
int g_checkpointed_forwards = 0;

struct ToyNetImpl : torch::nn::Module {
  explicit ToyNetImpl(int64_t depth) {
    in = register_module("img_in", models::Linear(kToyChannels, kToyWidth));
    text = register_module("txt_in", models::Linear(kToyText, kToyWidth));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t k = 0; k < depth; ++k) {
      linears.push_back(models::Linear(kToyWidth, kToyWidth));
      blocks->push_back(linears.back());
    }
    out = register_module("proj_out", models::Linear(kToyWidth, kToyChannels));
  }

  // x (B, N, C) noisy tokens, text (B, L, D), sigma (B): the velocity prediction (B, N, C).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& text_states, const at::Tensor& sigma) {
    at::Tensor h = in->forward(x) + text->forward(text_states).mean(1, /*keepdim=*/true) +
                   sigma.view({-1, 1, 1});
    const auto layers = linears;  // segments keep the closure until backward
    const RunBlock run = [layers](int64_t k, const Tensors& s) -> Tensors {
      return {s[0] + torch::gelu(layers[static_cast<size_t>(k)].ptr()->forward(s[0]))};
    };
    const auto depth = static_cast<int64_t>(linears.size());
    Tensors state{h};
    if (plan.active(is_training())) {
      state = run_layout(plan.layout_for(0, depth), state, run);
      ++g_checkpointed_forwards;
    } else {
      for (int64_t k = 0; k < depth; ++k) state = run(k, state);
    }
    return out->forward(state[0]);
  }

  models::Linear in{nullptr}, text{nullptr}, out{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  std::vector<models::Linear> linears;  // the blocks, typed
  CheckpointPlan plan;
};
TORCH_MODULE(ToyNet);

class ToyTransformer final : public Transformer {
 public:
  explicit ToyTransformer(int64_t depth) : net_(depth) {}
  std::string family() const override { return "toy"; }
  torch::nn::Module& module() override { return *net_; }
  std::vector<int64_t> stack_sizes() const override { return {static_cast<int64_t>(net_->blocks->size())}; }
  void set_checkpoint_plan(const CheckpointPlan& plan) override { net_->plan = plan; }

  at::Tensor flow_matching_loss(const Batch& batch, const FlowMatchingOptions& options,
                                at::Generator& generator) override {
    const int64_t B = batch.latents.size(0);
    const at::Tensor x0 = batch.latents.flatten(2).transpose(1, 2);  // (B, HW, C)
    const at::Tensor noise = at::randn(x0.sizes(), generator, x0.options());
    const at::Tensor sigmas = sample_sigmas(B, SigmaSampling::Uniform, 1.0, 0.0, generator);
    const auto [x_t, target] = flow_matching_pair(x0, noise, sigmas);
    return at::mse_loss(net_->forward(x_t, batch.prompt_embeds, sigmas), target);
  }
  at::Tensor forward_named(const std::map<std::string, at::Tensor>& inputs) override {
    return net_->forward(inputs.at("x"), inputs.at("text"), inputs.at("sigma"));
  }
  std::vector<BlockProbe> block_probes(const Batch&, std::optional<Backend>) override { return {}; }
  void set_stage_observer(StageObserver) override {}
  Batch synthetic_batch(int64_t batch, int64_t image_tokens, int64_t text_tokens, at::Generator& generator,
                        const at::Device& device) override {
    Batch b;
    b.latents = at::randn({batch, kToyChannels, 1, image_tokens}, generator).to(device);
    b.prompt_embeds = at::randn({batch, text_tokens, kToyText}, generator).to(device);
    return b;
  }

 private:
  ToyNet net_;
};

void register_toy_family() {
  ModelFamily toy;
  toy.name = "toy";
  toy.display_name = "Toy";
  toy.flavour_specs = {{"toy-3", "toy-3", "three blocks", ""}, {"toy-6", "toy-6", "six blocks", ""}};
  toy.default_flavour = "toy-3";
  toy.latents = LatentLayout{"toy", kToyChannels, 1, /*pooled=*/false, /*variable_text_length=*/false};
  toy.checkpointing = {/*interval=*/true, /*segment_stride=*/false, /*ffn_scope=*/false, {"blocks"}};
  toy.lora_target_presets = {"default"};
  toy.lora_target_modules = [](const std::string&) { return std::vector<std::string>{"blocks.0", "blocks.1"}; };
  toy.build = [](const TransformerSpec& spec, const c10::Device& device) -> std::unique_ptr<Transformer> {
    auto model = std::make_unique<ToyTransformer>(spec.flavour == "toy-6" ? 6 : 3);
    model->module().to(device);
    return model;
  };
  toy.conditioning = [](const TransformerSpec&) { return ConditioningWidths{kToyText, 0}; };
  register_family(std::move(toy));
}

TEST(FamilyRegistry, BuiltInFamiliesDescribeThemselves) {
  const auto names = model_family_names();
  ASSERT_GE(names.size(), 2u);
  EXPECT_EQ(names[0], "flux");
  EXPECT_EQ(names[1], "mageflow");
  const ModelFamily& flux = model_family("flux");
  EXPECT_EQ(flux.latents.channels, 16);
  EXPECT_TRUE(flux.latents.pooled);
  EXPECT_EQ(flux.checkpointing.stacks.size(), 2u);
  EXPECT_EQ(flux.default_flavour, "krea");  // SimpleTuner's
  EXPECT_EQ(flux.preset_of("krea"), "flux-dev");
  EXPECT_EQ(flux.preset_of("schnell"), "flux-schnell");
  EXPECT_EQ(flux.preset_of("flux-dev"), "flux-dev");  // an older flavour name
  EXPECT_EQ(flux.preset_of("flux-tiny"), "flux-tiny");
  EXPECT_FALSE(flux.flavour("kontext")->unsupported.empty());
  EXPECT_TRUE(flux.flavour("dev")->unsupported.empty());
  EXPECT_EQ(model_family("mageflow").default_flavour, "base");
  EXPECT_EQ(model_family("mageflow").preset_of("turbo"), "mageflow-4b");
  const ModelFamily& mageflow = model_family("mageflow");
  EXPECT_EQ(mageflow.latents.channels, 128);
  EXPECT_FALSE(mageflow.latents.pooled);
  EXPECT_EQ(mageflow.lora_target_presets, std::vector<std::string>{"default"});
  try {
    model_family("sdxl");
    FAIL() << "no error";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("got 'sdxl'"), std::string::npos) << e.what();
  }
}

// A third family, defined in this file alone, trains 3 steps through remat::train with segmented
// checkpointing and LoRA; the options, the safety check and the data loader all know it.
TEST(FamilyRegistry, AToyFamilyTrainsThroughTheTrainer) {
  register_toy_family();
  const OptionSpec* family_option = find_option("model_family");
  ASSERT_NE(family_option, nullptr);
  EXPECT_NE(std::find(family_option->choices.begin(), family_option->choices.end(), "toy"),
            family_option->choices.end());
  bool toy_in_support = false;
  for (const auto& [name, capabilities] : checkpointing_support()) toy_in_support = toy_in_support || name == "toy";
  EXPECT_TRUE(toy_in_support);

  remat::testing::TempDir dir{"remat_toy_family"};
  DemoDatasetOptions data;
  data.sizes = {{2, 4}};
  data.text_tokens = 3;
  data.joint_attention_dim = kToyText;
  make_demo_dataset((dir.path() / "data").string(), model_family("toy").latents, 6, 1, data);

  std::vector<std::string> warnings;
  const auto args = std::vector<std::string>{
      "--model_family=toy", "--model_type=lora", "--lora_rank=2", "--max_train_steps=3",
      "--train_batch_size=2", "--learning_rate=1e-2", "--mixed_precision=no",
      "--gradient_checkpointing_interval=2", "--seed=5", "--checkpointing_steps=0",
      "--instance_data_dir=" + (dir.path() / "data").string(),
      "--output_dir=" + (dir.path() / "out").string(), "--resume_from_checkpoint=latest"};
  const TrainConfig config = load_train_config(args, warnings);
  EXPECT_EQ(config.model_flavour, "toy-3");  // the family's default flavour
  // The toy has no stride support: the safety check drops it with the family named.
  std::vector<std::string> stride_warnings;
  auto with_stride = args;
  with_stride.push_back("--gradient_checkpointing_segment_stride=3");
  load_train_config(with_stride, stride_warnings);
  bool dropped = false;
  for (const auto& w : stride_warnings) dropped = dropped || w.find("not supported with toy") != std::string::npos;
  EXPECT_TRUE(dropped);

  TrainerHooks hooks;
  hooks.log = [](const std::string&) {};
  hooks.progress_stream = std::fopen("/dev/null", "w");
  const TrainResult result = run_training(config, hooks);
  std::fclose(hooks.progress_stream);
  ASSERT_EQ(result.records.size(), 3u);
  for (const auto& r : result.records) EXPECT_TRUE(std::isfinite(r.loss)) << r.step;
  EXPECT_EQ(g_checkpointed_forwards, 3);  // every step ran the segmented layout
  // The adapter file holds lora_A and lora_B of blocks.0 and blocks.1, under the PEFT names.
  const auto weights = io::SafetensorsFile::open(result.weights_path);
  EXPECT_EQ(weights.names().size(), 4u);
  EXPECT_TRUE(weights.contains("transformer.blocks.0.lora_A.weight"));
}

}  // namespace family_test
}  // namespace
}  // namespace remat::train
