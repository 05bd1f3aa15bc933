// run_pipeline on the demo pipeline folder (tiny random models, CPU): the same pictures as the
// stages run by hand with the lower-level APIs, deterministic per seed, LoRAs merged as their
// live branches compute (scale 0: the base model bit for bit), and every bad input refused
// before any model loads.

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "remat/encoders/demo_pipeline.h"
#include "remat/encoders/flux_encoders.h"
#include "remat/encoders/pipeline_folder.h"
#include "remat/image/image_file.h"
#include "remat/image/png_file.h"
#include "remat/io/safetensors.h"
#include "remat/memory.h"
#include "remat/models/flux.h"
#include "remat/models/lora.h"
#include "remat/sample/flux_sampler.h"
#include "remat/sample/kontext.h"
#include "remat/sample/pipeline.h"
#include "remat/train/family/text_to_image.h"
#include "temp_dir.h"
#include "value_error.h"
#include "variant_folder.h"

namespace remat::sample {
namespace {
namespace pipeline_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

namespace fs = std::filesystem;
using remat::testing::error_of;
using remat::testing::TempDir;

// A PEFT LoRA file as remat's trainer writes it, for a random model of `config`, with random
// (non-zero) factors. Returns the factors by module-less key ("<module>.lora_A.weight").
std::map<std::string, at::Tensor> write_peft_lora(const std::string& path, const models::FluxConfig& config,
                                                  uint64_t seed, int64_t rank = 4, double alpha = 2.0) {
  torch::manual_seed(seed);
  models::Flux model(config);
  models::apply_lora(*model, models::flux_lora_target_modules("all"), rank, alpha);
  std::vector<io::NamedTensor> entries;
  std::map<std::string, at::Tensor> factors;
  for (const auto& [key, tensor] : models::lora_state_dict(*model)) {
    at::Tensor value = tensor.detach().clone();
    if (key.find("lora_B") != std::string::npos) value.normal_(0.0, 0.2);  // trained: B is no longer zero
    entries.emplace_back(key, value);
    factors[key.substr(std::string("transformer.").size())] = value;
  }
  const nlohmann::json adapter{{"transformer.r", rank}, {"transformer.lora_alpha", alpha}};
  io::save_safetensors(path, entries, {{"format", "pt"}, {"lora_adapter_metadata", adapter.dump()}});
  return factors;
}

class PipelineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("remat_pipeline_test");
    encoders::write_demo_pipeline(folder());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string folder() { return *dir_ / "pipeline"; }
  static models::FluxConfig transformer_config() {
    return models::FluxConfig::from_json_file(folder() + "/transformer/config.json");
  }
  static std::vector<models::LoraFile> read_loras(const std::vector<LoraSpec>& specs) {
    return read_loras_for(specs, models::linear_layers(transformer_config()));
  }
  // The pipeline folder's transformer as `remat sample` loads it (float32), LoRAs merged. The
  // Flux module is shared with the family's adapter, so it outlives it.
  static models::Flux load_transformer(const std::vector<LoraSpec>& specs = {},
                                       const models::BasePrecision& precision = {}) {
    train::TransformerSpec spec;
    spec.family = "flux";
    spec.config_json = folder() + "/transformer/config.json";
    spec.weights = folder() + "/transformer";
    spec.base_precision = precision;
    auto model = train::load_transformer_with_loras(spec, read_loras(specs), specs);
    return models::Flux(std::dynamic_pointer_cast<models::FluxImpl>(model->module().shared_from_this()));
  }

  void SetUp() override {
    options_.folder = folder();
    options_.dtype = at::kFloat;
    request_.prompt = "a red square";
    request_.settings.width = 64;
    request_.settings.height = 48;
    request_.settings.num_inference_steps = 3;
    request_.settings.seed = 11;
  }

  std::vector<at::Tensor> run(const std::vector<SampleRequest>& requests, const PipelineEvents& events = {}) {
    return train::run_text_to_image(options_, requests, events);
  }
  at::Tensor run_one() { return run({request_}).at(0); }

  static TempDir* dir_;
  PipelineOptions options_;
  SampleRequest request_;
};

TempDir* PipelineTest::dir_ = nullptr;

TEST_F(PipelineTest, MatchesTheStagesRunByHand) {
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    options_.dtype = dtype;
    const at::Tensor got = run_one();
    // The same work with the lower-level APIs: FluxEncoders for text and the VAE, the transformer
    // built in float32, converted and loaded with load_component, the scheduler from the folder.
    const auto pipeline = encoders::PipelineFolder::open(folder(), encoders::flux_pipeline_components());
    encoders::FluxEncodersOptions eo;
    eo.dtype = dtype;
    auto encoders = encoders::FluxEncoders::load(pipeline, eo);
    const auto e = encoders.encode_prompt(request_.prompt);
    models::Flux transformer(transformer_config());
    transformer->to(dtype);
    models::load_component(pipeline.directory("transformer"), *transformer);
    transformer->eval();
    SamplingSettings settings = request_.settings;
    settings.vae_scale_factor = encoders.vae_scale_factor();
    const auto scheduler =
        FlowMatchSchedulerConfig::from_json_file(pipeline.directory("scheduler") + "/scheduler_config.json");
    const at::Tensor latents =
        denoise(*transformer, scheduler, {e.prompt_embeds, e.pooled_prompt_embeds}, nullptr, settings);
    torch::NoGradGuard no_grad;
    // diffusers: the decoded picture is clamped in the VAE's dtype (to_uint8_image), so decode here
    // without decode_latents' float32 conversion.
    auto& vae = encoders.vae();
    const at::Tensor z = vae->from_transformer_latents(latents.unsqueeze(0).to(dtype));
    const at::Tensor expected = to_uint8_image(vae->decode(z));
    ASSERT_EQ(got.sizes(), (std::vector<int64_t>{48, 64, 3}));
    EXPECT_TRUE(at::equal(got, expected));
  }
}

TEST_F(PipelineTest, SameSeedSamePictureOtherSeedOtherPicture) {
  const at::Tensor a = run_one();
  EXPECT_TRUE(at::equal(a, run_one()));
  request_.settings.seed = 12;
  EXPECT_FALSE(at::equal(a, run_one()));
}

TEST_F(PipelineTest, SeveralRequestsEachAsAlone) {
  SampleRequest other = request_;
  other.prompt = "a blue circle";
  other.settings.width = 32;
  const auto both = run({request_, other});
  ASSERT_EQ(both.size(), 2u);
  EXPECT_TRUE(at::equal(both[0], run({request_})[0]));
  EXPECT_TRUE(at::equal(both[1], run({other})[0]));
  EXPECT_EQ(both[1].sizes(), (std::vector<int64_t>{48, 32, 3}));
}

TEST_F(PipelineTest, RunsInBfloat16) {
  options_.dtype = at::kBFloat16;
  const at::Tensor a = run_one();
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{48, 64, 3}));
  EXPECT_TRUE(at::equal(a, run_one()));
}

TEST_F(PipelineTest, ReportsStagesInOrderAndEveryStep) {
  std::vector<std::string> stages;
  int64_t steps = 0;
  std::vector<size_t> images;
  PipelineEvents events;
  events.on_stage = [&](const std::string& s) { stages.push_back(s); };
  events.on_step = [&](size_t, int64_t, int64_t total) {
    ++steps;
    EXPECT_EQ(total, 3);
  };
  events.on_image = [&](size_t index, const at::Tensor&) { images.push_back(index); };
  run({request_, request_}, events);
  EXPECT_EQ(steps, 6);
  EXPECT_EQ(images, (std::vector<size_t>{0, 1}));
  auto position = [&](const std::string& prefix) {
    for (size_t i = 0; i < stages.size(); ++i) {
      if (stages[i].rfind(prefix, 0) == 0) return i;
    }
    ADD_FAILURE() << "no stage " << prefix;
    return stages.size();
  };
  // Text encoders done before the transformer loads, the transformer before the VAE.
  EXPECT_LT(position("encoded 1 prompt"), position("loading the transformer"));
  EXPECT_LT(position("denoised picture 2"), position("loading the VAE"));
}

TEST_F(PipelineTest, FreesTheTransformerBeforeTheVaeLoads) {
  // Parameter bytes of each model (float32), and what the tracked CPU memory holds while the
  // transformer denoises and after the VAE decoded.
  const auto pipeline = encoders::PipelineFolder::open(folder(), encoders::flux_pipeline_components());
  int64_t text_bytes = 0, vae_bytes = 0;
  {
    encoders::FluxEncodersOptions eo;
    eo.dtype = at::kFloat;
    const auto all = encoders::FluxEncoders::load(pipeline, eo);
    for (const auto& c : all.loaded()) (c.name == "vae" ? vae_bytes : text_bytes) += c.bytes;
  }
  const int64_t transformer_bytes = models::parameter_count(transformer_config()) * 4;
  const int64_t before = memory::current_bytes();
  int64_t denoising = 0, decoded = 0;
  PipelineEvents events;
  events.on_step = [&](size_t, int64_t, int64_t) {
    denoising = std::max(denoising, memory::current_bytes() - before);
  };
  events.on_image = [&](size_t, const at::Tensor&) {
    decoded = std::max(decoded, memory::current_bytes() - before);
  };
  run({request_}, events);
  std::cout << "text encoders " << text_bytes << " B, transformer " << transformer_bytes << " B, VAE " << vae_bytes
            << " B; held while denoising " << denoising << " B, after decoding " << decoded << " B\n";
  // The demo's text encoders (0.2 MB) are smaller than what denoising itself holds (embeddings,
  // latents, ids), so only the transformer and the VAE are told apart here.
  EXPECT_GE(denoising, transformer_bytes);
  EXPECT_LT(denoising, transformer_bytes + vae_bytes);  // the VAE is not loaded yet
  EXPECT_GE(decoded, vae_bytes);
  EXPECT_LT(decoded, vae_bytes + transformer_bytes);  // the transformer is freed
}

TEST_F(PipelineTest, TrueCfgScaleOneIsNoCfg) {
  const at::Tensor base = run_one();
  request_.negative_prompt = "blurry";
  request_.settings.true_cfg_scale = 1.0;
  EXPECT_TRUE(at::equal(run_one(), base));
  request_.settings.true_cfg_scale = 4.0;
  EXPECT_FALSE(at::equal(run_one(), base));
}

TEST_F(PipelineTest, LoraScaleZeroIsTheBaseModelAndScaleOneIsNot) {
  TempDir dir;
  write_peft_lora(dir / "lora.safetensors", transformer_config(), 5);
  const at::Tensor base = run_one();
  options_.loras = {{dir / "lora.safetensors", 0.0}};
  EXPECT_TRUE(at::equal(run_one(), base));
  options_.loras = {{dir / "lora.safetensors", 1.0}};
  EXPECT_FALSE(at::equal(run_one(), base));
}

TEST_F(PipelineTest, MergedLorasComputeWhatTheirLiveBranchesCompute) {
  TempDir dir;
  const auto config = transformer_config();
  const auto first = write_peft_lora(dir / "a.safetensors", config, 5);
  const auto second = write_peft_lora(dir / "b.safetensors", config, 6, /*rank=*/2, /*alpha=*/2.0);
  const std::vector<LoraSpec> specs = {{dir / "a.safetensors", 0.5}, {dir / "b.safetensors", -1.0}};
  auto merged = load_transformer(specs);
  // The base model plus the output of each LoRA's branch, computed separately: sum_j scale_j *
  // (alpha_j / r_j) * x A_j^T B_j^T on every adapted layer.
  models::Flux base(config);
  models::load_component(folder() + "/transformer", *base);
  base->eval();
  for (const auto& item : base->named_modules()) {
    const std::string& name = item.key();
    auto* linear = dynamic_cast<models::LinearImpl*>(item.value().get());
    if (linear == nullptr || first.count(name + ".lora_A.weight") == 0) continue;
    torch::NoGradGuard no_grad;
    auto product = [&](const std::map<std::string, at::Tensor>& f) {
      return at::matmul(f.at(name + ".lora_B.weight"), f.at(name + ".lora_A.weight"));
    };
    // scale * alpha / rank: 0.5 * 2 / 4 and -1 * 2 / 2.
    linear->weight.add_(0.5 * (2.0 / 4) * product(first) - 1.0 * (2.0 / 2) * product(second));
  }
  torch::manual_seed(1);
  const int64_t n_img = 12, n_txt = 5;
  const at::Tensor x = torch::randn({1, n_img, config.in_channels});
  const at::Tensor text = torch::randn({1, n_txt, config.joint_attention_dim});
  const at::Tensor pooled = torch::randn({1, config.pooled_projection_dim});
  const at::Tensor t = torch::full({1}, 0.7), g = torch::full({1}, 3.5);
  torch::NoGradGuard no_grad;
  const at::Tensor img_ids = models::flux_image_ids(3, 4), txt_ids = models::flux_text_ids(n_txt);
  const at::Tensor got = merged->forward(x, text, pooled, t, img_ids, txt_ids, g);
  const at::Tensor expected = base->forward(x, text, pooled, t, img_ids, txt_ids, g);
  EXPECT_TRUE(at::allclose(got, expected, 1e-4, 1e-5));
}

// --base_model_precision: the transformer loaded quantised from the pipeline folder computes
// what the plain load quantised in place computes; a LoRA is merged into each quantised layer's
// dequantised weight and quantised again.
TEST_F(PipelineTest, QuantizedTransformerLoadsAsThePlainOneQuantizedInPlace) {
  TempDir dir;
  const auto config = transformer_config();
  write_peft_lora(dir / "a.safetensors", config, 5);
  const std::vector<LoraSpec> specs = {{dir / "a.safetensors", 0.5}};
  torch::manual_seed(1);
  const at::Tensor x = torch::randn({1, 12, config.in_channels});
  const at::Tensor text = torch::randn({1, 5, config.joint_attention_dim});
  const at::Tensor pooled = torch::randn({1, config.pooled_projection_dim});
  const at::Tensor t = torch::full({1}, 0.7), g = torch::full({1}, 3.5);
  const at::Tensor img_ids = models::flux_image_ids(3, 4), txt_ids = models::flux_text_ids(5);
  torch::NoGradGuard no_grad;
  for (const char* name : {"int8-quanto", "nf4-bnb"}) {
    const auto precision = models::parse_base_model_precision(name);
    auto quantized = load_transformer({}, precision);
    auto plain = load_transformer();
    EXPECT_GT(models::quantize_linear_layers(*plain, precision).size(), 10u);
    EXPECT_TRUE(at::equal(quantized->forward(x, text, pooled, t, img_ids, txt_ids, g),
                          plain->forward(x, text, pooled, t, img_ids, txt_ids, g)))
        << name;

    auto with_lora = load_transformer(specs, precision);
    // Reference: the quantised plain model with the LoRA merged by hand into each dequantised
    // weight (float32), quantised again.
    const auto lora = read_loras(specs);
    for (const auto& item : plain->named_modules()) {
      auto* linear = dynamic_cast<models::LinearImpl*>(item.value().get());
      const auto it = lora[0].modules.find(item.key());
      if (linear == nullptr || it == lora[0].modules.end()) continue;
      const at::Tensor merged = linear->full_weight().to(at::kFloat) +
                                at::matmul(it->second.up, it->second.down).to(at::kFloat) * (0.5 * it->second.scale);
      if (linear->is_quantized()) {
        linear->set_quantized_weight(models::quantize_weight(merged, precision.mode, precision.double_quantization));
      } else {
        linear->weight.copy_(merged);
      }
    }
    EXPECT_TRUE(at::allclose(with_lora->forward(x, text, pooled, t, img_ids, txt_ids, g),
                             plain->forward(x, text, pooled, t, img_ids, txt_ids, g), 1e-5, 1e-6))
        << name;
  }
}

TEST_F(PipelineTest, SchnellStyleSchedulerConfigSamples) {
  TempDir dir;
  fs::copy(folder(), dir / "schnell", fs::copy_options::recursive);
  std::ofstream(dir / "schnell/scheduler/scheduler_config.json")
      << R"({"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 1.0,
            "use_dynamic_shifting": false, "base_shift": 0.5, "max_shift": 1.15, "base_image_seq_len": 256,
            "max_image_seq_len": 4096})";
  const at::Tensor dev = run_one();
  options_.folder = dir / "schnell";
  const at::Tensor schnell = run_one();
  EXPECT_EQ(schnell.sizes(), dev.sizes());
  EXPECT_FALSE(at::equal(schnell, dev));
}

TEST_F(PipelineTest, LargePicturesDecodeInTiles) {
  // The demo VAE's tiles are 32 pixels (vae/config.json sample_size): tiled and whole decodes differ.
  const at::Tensor whole = run_one();
  options_.vae_tiling_above = 32;
  const at::Tensor tiled = run_one();
  EXPECT_EQ(tiled.sizes(), whole.sizes());
  EXPECT_FALSE(at::equal(tiled, whole));
  options_.vae_tiling_above = 64;  // neither side exceeds 64: whole
  EXPECT_TRUE(at::equal(run_one(), whole));
}

TEST_F(PipelineTest, BadInputIsRefusedNamingIt) {
  TempDir dir;
  auto expect_error = [&](const std::string& needle) {
    const std::string message = error_of([&] { run_one(); });
    EXPECT_NE(message.find(needle), std::string::npos) << message;
  };
  request_.settings.width = 102;  // the demo VAE downsamples 2x, then Flux packs 2x2: multiples of 4
  expect_error("width must be a multiple of 4 for this pipeline's VAE");
  request_.settings.width = 64;

  // A file no LoRA format knows.
  io::save_safetensors(dir / "unknown.safetensors", {{"model.some_layer.weight", torch::zeros({2, 2})}});
  options_.loras = {{dir / "unknown.safetensors", 1.0}};
  expect_error("model.some_layer.weight");
  // A LoRA for another model shape (flux-small's widths on the demo's flux-tiny).
  write_peft_lora(dir / "small.safetensors", models::FluxConfig::preset("flux-small"), 3);
  options_.loras = {{dir / "small.safetensors", 1.0}};
  expect_error("another model");
  options_.loras = {{dir / "missing.safetensors", 1.0}};
  expect_error("missing.safetensors");
  options_.loras.clear();

  // A missing component.
  fs::copy(folder(), dir / "no_vae", fs::copy_options::recursive);
  fs::remove_all(dir / "no_vae/vae");
  options_.folder = dir / "no_vae";
  expect_error("vae");
  options_.folder = dir / "nowhere";
  expect_error("nowhere");
  // Components of different models: T5's width is not the transformer's joint_attention_dim.
  fs::copy(folder(), dir / "mixed", fs::copy_options::recursive);
  const std::string t5_config = dir / "mixed/text_encoder_2/config.json";
  auto t5 = nlohmann::json::parse(std::ifstream(t5_config));
  t5["d_model"] = 48;
  std::ofstream(t5_config) << t5.dump();
  options_.folder = dir / "mixed";
  expect_error("text_encoder_2/config.json has d_model 48 but the transformer's joint_attention_dim is 32");
}

TEST(LoraSpecTest, ScaleIsATrailingNumber) {
  auto spec = parse_lora_spec("style.safetensors");
  EXPECT_EQ(spec.path, "style.safetensors");
  EXPECT_EQ(spec.scale, 1.0);
  spec = parse_lora_spec("dir/style.safetensors:0.75");
  EXPECT_EQ(spec.path, "dir/style.safetensors");
  EXPECT_EQ(spec.scale, 0.75);
  spec = parse_lora_spec("name:v2.safetensors:-1");
  EXPECT_EQ(spec.path, "name:v2.safetensors");
  EXPECT_EQ(spec.scale, -1.0);
  spec = parse_lora_spec("C:\\loras\\a.safetensors");
  EXPECT_EQ(spec.path, "C:\\loras\\a.safetensors");
  EXPECT_EQ(spec.scale, 1.0);
  spec = parse_lora_spec("a.safetensors:inf");  // not a finite number: part of the path
  EXPECT_EQ(spec.path, "a.safetensors:inf");
  EXPECT_NE(error_of([] { parse_lora_spec(":0.5"); }).find("--lora"), std::string::npos);
  EXPECT_NE(error_of([] { parse_lora_spec(""); }).find("--lora"), std::string::npos);
}

// A pipeline folder of fp16 variant files samples with --variant fp16 (every component read from
// its variant files) the same picture as the plain folder; without it, the error says so.
TEST_F(PipelineTest, AVariantFolderSamplesWithItsVariant) {
  const at::Tensor plain = run_one();
  const std::string variant = *dir_ / "variant";
  if (!fs::exists(variant)) remat::testing::copy_as_variant(folder(), variant, "fp16");
  options_.folder = variant;
  options_.variant = "fp16";
  EXPECT_TRUE(at::equal(run_one(), plain));
  options_.variant.clear();
  const std::string msg = error_of([&] { run_one(); });
  EXPECT_NE(msg.find("fp16"), std::string::npos) << msg;
  EXPECT_NE(msg.find("read with variant set to its name"), std::string::npos) << msg;
}

// FLUX.1 Kontext: a folder whose model_index.json names FluxKontextPipeline edits the request's
// picture: the picture resized (PIL's Lanczos) and encoded by the VAE (the posterior's mode,
// shifted and scaled), its latents appended at every step. The same work done here by hand gives
// the same picture bit for bit; the picture is made at max_area pixels; FluxPipeline refuses one.
TEST_F(PipelineTest, KontextEditsTheInputPicture) {
  const std::string kontext = *dir_ / "kontext";
  if (!fs::exists(kontext)) {
    fs::copy(folder(), kontext, fs::copy_options::recursive);
    nlohmann::json index = nlohmann::json::parse(std::ifstream(kontext + "/model_index.json"));
    index["_class_name"] = "FluxKontextPipeline";
    std::ofstream(kontext + "/model_index.json") << index.dump(2);
  }
  torch::manual_seed(5);
  const at::Tensor picture = torch::randint(0, 256, {24, 40, 3}, at::kByte);
  const std::string input = *dir_ / "input.png";
  image::write_png(input, picture);
  options_.folder = kontext;
  options_.max_area = 64 * 48;  // the requested 64 x 48 itself
  options_.image_auto_resize = false;
  request_.image = input;
  const at::Tensor got = run_one();
  ASSERT_EQ(got.sizes(), (std::vector<int64_t>{48, 64, 3}));

  const auto pipeline = encoders::PipelineFolder::open(kontext, encoders::flux_pipeline_components());
  encoders::FluxEncodersOptions eo;
  eo.dtype = at::kFloat;
  auto encoders = encoders::FluxEncoders::load(pipeline, eo);
  const auto e = encoders.encode_prompt(request_.prompt);
  const int64_t multiple = 2 * encoders.vae_scale_factor();  // the demo VAE's latent grid
  const PictureSize size = kontext_input_size(40, 24, multiple, false);
  EXPECT_EQ(size, (PictureSize{40 / multiple * multiple, 24 / multiple * multiple}));
  SamplingSettings settings = request_.settings;
  settings.vae_scale_factor = encoders.vae_scale_factor();
  {
    torch::NoGradGuard no_grad;
    auto& vae = encoders.vae();
    const at::Tensor x = image::picture_to_vae_input(
        size == PictureSize{40, 24} ? picture : image::resize_picture(picture, size.width, size.height));
    settings.reference_latents = vae->to_transformer_latents(vae->encode(x).mode()).squeeze(0);
  }
  models::Flux transformer = load_transformer();
  transformer->eval();
  const auto scheduler =
      FlowMatchSchedulerConfig::from_json_file(pipeline.directory("scheduler") + "/scheduler_config.json");
  const at::Tensor latents = denoise(*transformer, scheduler, {e.prompt_embeds, e.pooled_prompt_embeds}, nullptr, settings);
  at::Tensor expected;
  {
    torch::NoGradGuard no_grad;
    expected = to_uint8_image(encoders.vae()->decode(encoders.vae()->from_transformer_latents(latents.unsqueeze(0))));
  }
  EXPECT_TRUE(at::equal(got, expected));

  // Without the picture the same seed makes another one; a picture of another size is another edit.
  request_.image.reset();
  EXPECT_FALSE(at::equal(got, run_one()));
  request_.image = input;

  // The picture is made at max_area pixels, at the requested aspect ratio, with a warning.
  options_.image_auto_resize = false;
  request_.settings.width = 32;
  request_.settings.height = 32;
  std::vector<std::string> warnings;
  PipelineEvents events;
  events.on_warning = [&](const std::string& w) { warnings.push_back(w); };
  const int64_t side = 55 / multiple * multiple;  // round(sqrt(3072)) = 55, floored to the grid
  EXPECT_EQ(run({request_}, events).at(0).sizes(), (std::vector<int64_t>{side, side, 3}));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("32 x 32 becomes " + std::to_string(side) + " x " + std::to_string(side)),
            std::string::npos)
      << warnings[0];

  // An input picture too small for the latent grid is refused before any model loads.
  const std::string tiny = *dir_ / "tiny.png";
  image::write_png(tiny, picture.slice(0, 0, 1).slice(1, 0, 1).contiguous());
  request_.image = tiny;
  std::vector<std::string> stages;
  events.on_stage = [&](const std::string& line) { stages.push_back(line); };
  EXPECT_NE(error_of([&] { run({request_}, events); }).find("each side must be at least"), std::string::npos);
  EXPECT_TRUE(stages.empty());
  request_.image = input;

  // A text-to-image pipeline refuses an input picture before any model loads.
  options_.folder = folder();
  EXPECT_NE(error_of([&] { run_one(); }).find("needs a FLUX.1 Kontext pipeline"), std::string::npos);
}

}  // namespace pipeline_test
}  // namespace
}  // namespace remat::sample
