// The model-family registry: the built-in families as the rest of remat reads them, and a third
// family defined only here, in the test binary, that caches a folder of pictures, trains, samples
// (`remat sample`'s pipeline) and renders validation images through its descriptor alone, without
// any other source file knowing it.
#include <filesystem>
#include <fstream>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "remat/data/caches.h"
#include "remat/image/image_file.h"
#include "remat/image/png_file.h"
#include "remat/encoders/model_encoders.h"
#include "remat/encoders/pipeline_folder.h"
#include "remat/io/safetensors.h"
#include "remat/layout.h"
#include "remat/models/flux.h"
#include "remat/models/layers.h"
#include "remat/train/options/config.h"
#include "remat/train/family/family.h"
#include "remat/train/options/options.h"
#include "remat/train/options/safety_check.h"
#include "remat/sample/pipeline.h"
#include "remat/sample/scheduler.h"
#include "remat/train/family/flow_matching.h"
#include "remat/train/family/text_to_image.h"
#include "remat/train/run/trainer.h"
#include "remat/train/family/transformer.h"
#include "train/quiet_hooks.h"
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

// The toy's sampler: flow-matching Euler steps over its (1, h w, C) latent tokens, from noise drawn
// on a private generator seeded with the picture's seed.
class ToyDenoiser final : public sample::Denoiser {
 public:
  ToyDenoiser(ToyNet net, sample::FlowMatchSchedulerConfig scheduler) : net_(std::move(net)), scheduler_(scheduler) {}
  at::Tensor denoise(const sample::PromptEmbeddings& positive, const sample::PromptEmbeddings*,
                     const sample::SamplingSettings& settings, const sample::StepCallback& on_step) override {
    torch::NoGradGuard no_grad;
    const int64_t h = settings.height / settings.vae_scale_factor, w = settings.width / settings.vae_scale_factor;
    at::Generator generator = at::detail::createCPUGenerator(settings.seed);
    at::Tensor x = at::randn({1, h * w, kToyChannels}, generator, at::TensorOptions().dtype(at::kFloat));
    const auto schedule = sample::flow_match_schedule(scheduler_, settings.num_inference_steps, h * w);
    const at::Tensor text = positive.prompt_embeds.to(at::kFloat).unsqueeze(0);
    for (int64_t i = 0; i < schedule.steps(); ++i) {
      const at::Tensor v = net_->forward(x, text, schedule.sigmas[i].view({1}));
      x = sample::flow_match_euler_step(x, v, schedule, i);
      if (on_step) on_step(i + 1, schedule.steps());
    }
    return x[0].transpose(0, 1).reshape({kToyChannels, h, w}).contiguous();
  }

 private:
  ToyNet net_;
  sample::FlowMatchSchedulerConfig scheduler_;
};

class ToyTransformer final : public Transformer {
 public:
  explicit ToyTransformer(int64_t depth) : net_(depth) {}
  std::unique_ptr<sample::Denoiser> denoiser(const sample::FlowMatchSchedulerConfig& scheduler) override {
    return std::make_unique<ToyDenoiser>(net_, scheduler);
  }
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

// ---- the toy's encoders and pipeline folder ----

constexpr int64_t kToyFactor = 2;  // pixels per latent pixel along each side

// A caption becomes `tokens` rows of kToyText: each byte adds to one entry of its row.
class ToyPromptEncoder final : public encoders::PromptEncoder {
 public:
  explicit ToyPromptEncoder(int64_t tokens) : tokens_(tokens) {}
  encoders::EncodedPrompt encode_caption(const std::string& caption) override {
    at::Tensor embeds = at::zeros({tokens_, kToyText});
    auto e = embeds.accessor<float, 2>();
    for (size_t i = 0; i < caption.size(); ++i) {
      e[static_cast<int64_t>(i) % tokens_][static_cast<unsigned char>(caption[i]) % kToyText] += 0.25f;
    }
    return {embeds, at::Tensor(), {}};  // no pooled vector
  }

 private:
  int64_t tokens_;
};

// Pictures to latents: 2 x 2 average pooling and a fixed 3 -> 4 channel map (plus noise drawn from
// the generator for the posterior's sample); back: each latent pixel repeated 2 x 2 and mapped to
// 3 channels, squashed into [-1, 1].
class ToyAutoencoder final : public encoders::ImageAutoencoder {
 public:
  static at::Tensor channel_map() { return at::arange(12, at::kFloat).view({kToyChannels, 3}).sin(); }
  at::Tensor encode_image(const at::Tensor& vae_input, c10::optional<at::Generator> generator) override {
    const at::Tensor pooled = at::avg_pool2d(vae_input.to(at::kFloat), {kToyFactor, kToyFactor})[0];
    at::Tensor z = at::einsum("oc,chw->ohw", {channel_map(), pooled});
    if (generator) z = z + 0.1 * at::randn(z.sizes(), *generator, z.options());
    return z.contiguous();
  }
  at::Tensor decode_latents(const at::Tensor& latents) override {
    const at::Tensor up = latents.repeat_interleave(kToyFactor, 1).repeat_interleave(kToyFactor, 2);
    return at::einsum("oc,ohw->chw", {channel_map(), up}).tanh().unsqueeze(0);
  }
  void set_tiling(bool) override {}
  int64_t vae_scale_factor() const override { return kToyFactor; }
};

// "ToyPipeline" folders: model_index.json, text_encoder/ and vae/ (a config.json each: the toy
// encoders have no weights), transformer/ (config.json and safetensors weights), scheduler/.
encoders::PipelineLayout toy_layout() {
  return {{"ToyPipeline"},
          "the toy family reads ToyPipeline folders",
          {{"scheduler", "diffusers", {"FlowMatchEulerDiscreteScheduler"}, "scheduler_config.json", false},
           {"text_encoder", "toy", {"ToyTextEncoder"}, "config.json", false},
           {"transformer", "toy", {"ToyTransformer"}, "config.json", true},
           {"vae", "toy", {"ToyAutoencoder"}, "config.json", false}}};
}

encoders::FamilyEncoders toy_encoders() {
  encoders::FamilyEncoders e;
  e.layout = toy_layout();
  e.text_components = {"text_encoder"};
  e.image_components = {"vae"};
  e.pooled = false;
  e.pixel_multiple = kToyFactor;
  e.load_text = [](const encoders::PipelineFolder&, const encoders::EncoderSettings& settings) {
    return std::unique_ptr<encoders::PromptEncoder>(new ToyPromptEncoder(settings.max_sequence_length));
  };
  e.load_image = [](const encoders::PipelineFolder&, const encoders::EncoderSettings&) {
    return std::unique_ptr<encoders::ImageAutoencoder>(new ToyAutoencoder());
  };
  e.vae_scale_factor = [](const encoders::PipelineFolder&) { return kToyFactor; };
  e.image_weight_bytes = [](const encoders::PipelineFolder&, at::ScalarType) { return int64_t{0}; };
  e.image_peak_bytes = [](const encoders::PipelineFolder&, int64_t width, int64_t height, at::ScalarType, bool) {
    return width * height * 3 * 4 * 4;
  };
  return e;
}

void write_toy_pipeline(const fs::path& root) {
  fs::create_directories(root / "text_encoder");
  fs::create_directories(root / "vae");
  fs::create_directories(root / "scheduler");
  std::ofstream(root / "model_index.json")
      << R"({"_class_name": "ToyPipeline", "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
            "text_encoder": ["toy", "ToyTextEncoder"], "transformer": ["toy", "ToyTransformer"],
            "vae": ["toy", "ToyAutoencoder"]})";
  std::ofstream(root / "text_encoder/config.json") << "{}";
  std::ofstream(root / "vae/config.json") << "{}";
  std::ofstream(root / "scheduler/scheduler_config.json")
      << R"({"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0, "use_dynamic_shifting": false})";
  torch::manual_seed(7);
  ToyNet net(3);
  models::save_component((root / "transformer").string(), *net, R"({"_class_name": "ToyTransformer", "depth": 3})");
}

void register_toy_family() {
  ModelFamily toy;
  toy.name = "toy";
  toy.display_name = "Toy";
  toy.flavour_specs = {{"toy-3", "toy-3", "three blocks", "", ""}, {"toy-6", "toy-6", "six blocks", "", ""}};
  toy.default_flavour = "toy-3";
  toy.latents = LatentLayout{"toy", kToyChannels, 1, /*pooled=*/false, /*variable_text_length=*/false};
  toy.checkpointing = {/*interval=*/true, /*segment_stride=*/false, /*ffn_scope=*/false, {"blocks"}, /*block_swap=*/false, {}};
  toy.lora_target_presets = {"default"};
  toy.lora_target_modules = [](const std::string&) { return std::vector<std::string>{"blocks.0", "blocks.1"}; };
  toy.build = [](const TransformerSpec& spec, const c10::Device& device) -> std::unique_ptr<Transformer> {
    // A config.json (a pipeline folder's transformer/) says its depth; otherwise the flavour does.
    const int64_t depth = spec.config_json ? nlohmann::json::parse(std::ifstream(*spec.config_json)).at("depth").get<int64_t>()
                                           : spec.flavour == "toy-6" ? 6 : 3;
    auto model = std::make_unique<ToyTransformer>(depth);
    if (spec.weights) models::load_component(*spec.weights, model->module());
    model->module().to(device);
    return model;
  };
  toy.conditioning = [](const TransformerSpec&) { return ConditioningWidths{kToyText, 0}; };
  toy.linear_layers = [](const TransformerSpec&) {
    return std::vector<models::LinearShape>{{"blocks.0", kToyWidth, kToyWidth}, {"blocks.1", kToyWidth, kToyWidth}};
  };
  // What it needs to cache pictures, sample and validate.
  toy.encoders = toy_encoders();
  toy.pipeline_classes = {"ToyPipeline"};
  toy.max_sequence_length = 16;
  toy.scheduler = [](const encoders::PipelineFolder& folder, const std::string&) {
    return sample::FlowMatchSchedulerConfig::from_json_file(folder.directory("scheduler") + "/scheduler_config.json");
  };
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
  EXPECT_TRUE(flux.flavour("kontext")->unsupported.empty());  // trains on picture pairs
  EXPECT_TRUE(flux.flavour("kontext")->trains_on_pairs);
  EXPECT_FALSE(flux.flavour("krea")->trains_on_pairs);
  EXPECT_FALSE(flux.flavour("libreflux")->unsupported.empty());
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

// The toy family caches a folder of pictures with its own encoders, trains on the cache, renders
// validation images, and samples with `remat sample`'s pipeline, each through its descriptor: the
// cache holds what its autoencoder and prompt encoder make, validation before the first step is
// the base model's picture as the pipeline samples it, and the trained LoRA samples (merged) what
// validation rendered with the live LoRA at the last step.
TEST(FamilyRegistry, AToyFamilyCachesTrainsSamplesAndValidatesThroughItsDescriptor) {
  register_toy_family();
  remat::testing::TempDir dir{"remat_toy_pipeline"};
  write_toy_pipeline(dir.path() / "pipeline");
  const auto write_picture = [&](const std::string& name, int r, int g, int b) {
    auto picture = at::empty({16, 16, 3}, at::kByte);
    picture.select(2, 0).fill_(r);
    picture.select(2, 1).fill_(g);
    picture.select(2, 2).fill_(b);
    picture.slice(0, 4, 12).slice(1, 2, 8).fill_(255 - r);
    image::write_png((dir.path() / "pictures" / name).string(), picture);
  };
  fs::create_directories(dir.path() / "pictures");
  write_picture("a red square.png", 220, 10, 10);
  write_picture("a green square.png", 10, 220, 10);
  write_picture("a blue square.png", 10, 10, 220);
  write_picture("a grey square.png", 120, 120, 120);

  std::vector<std::string> warnings;
  const TrainConfig config = load_train_config(
      {"--model_family=toy", "--model_type=lora", "--lora_rank=2", "--max_train_steps=2", "--train_batch_size=2",
       "--learning_rate=1e-1", "--lr_scheduler=constant", "--mixed_precision=no", "--seed=3",
       "--checkpointing_steps=0", "--resolution=16", "--resolution_type=pixel", "--tokenizer_max_length=4",
       "--pretrained_model_name_or_path=" + (dir.path() / "pipeline").string(),
       "--instance_data_dir=" + (dir.path() / "pictures").string(), "--cache_dir=" + (dir.path() / "cache").string(),
       "--output_dir=" + (dir.path() / "out").string(), "--validation_prompt=a red square",
       "--validation_step_interval=2", "--validation_resolution=16", "--validation_num_inference_steps=3",
       "--validation_seed=11"},
      warnings);
  const TrainResult result = run_training(config, remat::testing::quiet_hooks());
  ASSERT_EQ(result.records.size(), 2u);
  for (const auto& r : result.records) EXPECT_TRUE(std::isfinite(r.loss)) << r.step;

  // Caching: the entry of a picture is the toy autoencoder's posterior sample of it, drawn as the
  // cache draws it; a caption's entry is the toy prompt encoder's, without a pooled vector.
  const fs::path latents_entry = dir.path() / "cache/vae/toy/instance_data_dir/a red square.png.safetensors";
  ASSERT_TRUE(fs::is_regular_file(latents_entry));
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(data::latent_sample_seed(3, "a red square.png"));
  const at::Tensor expected_latents = ToyAutoencoder().encode_image(
      image::picture_to_vae_input(image::read_image((dir.path() / "pictures/a red square.png").string())),
      generator);
  EXPECT_TRUE(at::equal(io::SafetensorsFile::open(latents_entry.string()).tensor("latents"), expected_latents));
  int64_t text_entries = 0;
  for (const auto& entry : fs::recursive_directory_iterator(dir.path() / "cache/text/toy")) {
    if (entry.path().extension() != ".safetensors") continue;
    const auto file = io::SafetensorsFile::open(entry.path().string());
    EXPECT_TRUE(file.contains("prompt_embeds"));
    EXPECT_FALSE(file.contains("pooled_prompt_embeds"));
    ++text_entries;
  }
  EXPECT_EQ(text_entries, 5);  // four captions and the empty one

  // Validation rendered before the first step and after the last, each prompt.
  const fs::path pictures = dir.path() / "out/validation_images";
  for (const char* name : {"step_0_unconditional_0_16x16.png", "step_0_validation_0_16x16.png",
                           "step_2_unconditional_0_16x16.png", "step_2_validation_0_16x16.png"}) {
    EXPECT_TRUE(fs::is_regular_file(pictures / name)) << name;
  }

  // Sampling: the family is found by the folder's class; the base model's picture is validation's
  // before the first step (the LoRA's up factors start at zero), bit for bit.
  EXPECT_EQ(&family_of_pipeline((dir.path() / "pipeline").string()), &model_family("toy"));
  sample::PipelineOptions options;
  options.folder = (dir.path() / "pipeline").string();
  options.dtype = at::kFloat;
  options.max_sequence_length = 4;
  sample::SampleRequest request;
  request.prompt = "a red square";
  request.settings.width = request.settings.height = 16;
  request.settings.num_inference_steps = 3;
  request.settings.seed = 11;
  const at::Tensor base = run_text_to_image(options, {request}).at(0);
  EXPECT_TRUE(at::equal(base, image::read_image((pictures / "step_0_validation_0_16x16.png").string())));
  // With the trained LoRA merged: validation's picture at the last step (the live LoRA branch),
  // within one level of rounding, and not the base model's.
  options.loras = {{result.weights_path, 1.0}};
  const at::Tensor trained = run_text_to_image(options, {request}).at(0);
  const at::Tensor validated = image::read_image((pictures / "step_2_validation_0_16x16.png").string());
  EXPECT_LE((trained.to(at::kInt) - validated.to(at::kInt)).abs().max().item<int>(), 1);
  EXPECT_FALSE(at::equal(trained, base));
}


// The planner's probe of Flux's single blocks runs single block 0, which streams when 38 or more of
// FLUX.1's blocks are swapped: the probe brings its weights in (on a GPU they would otherwise be
// on the host while its inputs are on the device).
TEST(FluxFamily, TheSingleBlockProbeStreamsItsBlockIn) {
  TransformerSpec spec;
  spec.family = "flux";
  spec.flavour = "flux-tiny";  // 2 double + 2 single blocks
  torch::manual_seed(0);
  auto transformer = make_transformer(spec, at::kCPU);
  transformer->apply_lora(model_family("flux").lora_target_presets.front(), 2, 2.0);
  ASSERT_EQ(transformer->set_block_swap(3, at::kCPU), 3);  // doubles 1, singles 0 and 1
  auto& flux = dynamic_cast<models::FluxImpl&>(transformer->module());
  const auto& config = flux.config();
  Batch batch;
  batch.latents = torch::randn({1, 16, 4, 4});
  batch.prompt_embeds = torch::randn({1, 5, config.joint_attention_dim});
  batch.pooled_prompt_embeds = torch::randn({1, config.pooled_projection_dim});
  const auto probes = transformer->block_probes(batch);
  ASSERT_EQ(probes.size(), 2u);
  const models::BlockSwap& swap = *transformer->block_swap();
  EXPECT_FALSE(swap.resident(2));
  const Tensors out = probes[1].run(0, probes[1].state);
  EXPECT_TRUE(swap.resident(2)) << "single block 0 (block 2) was not streamed in for the probe";
  EXPECT_EQ(out[0].sizes(), probes[1].state[0].sizes());
}

}  // namespace family_test
}  // namespace
}  // namespace remat::train
