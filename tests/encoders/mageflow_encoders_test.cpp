// MageFlow's encoders on the tiny demo pipeline (remat make-demo-pipeline --model_family mageflow):
// the folder in the Mage-Flow layout (model_index.json's _vae_source and _text_encoder_path), the
// caption path against the text encoder loaded by itself, the picture path against Mage-VAE loaded by
// itself (the posterior mean whatever the generator), the edit template of the edit flavours, the
// memory model against the peak-tracking allocator, and bad folders refused by name.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "remat/encoders/demo_pipeline.h"
#include "remat/encoders/mageflow_demo_pipeline.h"
#include "remat/encoders/mageflow_encoders.h"
#include "remat/encoders/mageflow_text_encoder.h"
#include "remat/memory.h"
#include "remat/models/component_weights.h"
#include "temp_dir.h"
#include "value_error.h"

namespace {
namespace mageflow_encoders_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

namespace fs = std::filesystem;
using remat::testing::error_of;
using remat::testing::TempDir;
using namespace remat::encoders;
using Json = nlohmann::json;

std::string demo_folder(const TempDir& tmp, const std::string& name = "pipe") {
  DemoPipelineOptions options;
  options.dtype = "fp32";
  options.transformer_preset = "mageflow-tiny";
  write_mageflow_demo_pipeline(tmp / name, options);
  return tmp / name;
}

EncoderSettings fp32(int64_t max_length = 64, const std::string& flavour = "base") {
  EncoderSettings s;
  s.dtype = at::kFloat;
  s.max_sequence_length = max_length;
  s.flavour = flavour;
  return s;
}

Json read_json(const std::string& path) {
  std::ifstream in(path);
  return Json::parse(in);
}

void write_json(const std::string& path, const Json& j) { std::ofstream(path) << j.dump(2); }

TEST(MageFlowEncoders, TheDemoFolderIsAMageFlowRepository) {
  TempDir tmp("mageflow_enc");
  const std::string root = demo_folder(tmp);
  const FamilyEncoders encoders = mageflow_family_encoders();
  const PipelineFolder folder = encoders.open(root, {"text_encoder", "vae", "transformer", "scheduler"});
  // _vae_source names the checkpoint file: its directory is the component.
  EXPECT_EQ(fs::path(folder.directory("vae")).lexically_normal(), (fs::path(root) / "vae").lexically_normal());
  EXPECT_EQ(read_json(root + "/model_index.json")["_vae_source"], "vae/diffusion_pytorch_model.safetensors");
  EXPECT_EQ(encoders.vae_scale_factor(folder), 16);
  EXPECT_FALSE(encoders.pooled);
  // The demo components fit the demo transformer.
  const auto transformer = remat::models::MageFlowConfig::from_json_file(root + "/transformer/config.json");
  EXPECT_EQ(mageflow_text_config_of(folder).hidden_size, transformer.context_in_dim);
  EXPECT_EQ(mage_vae_config_of(folder).latent_channels, transformer.in_channels);
}

TEST(MageFlowEncoders, CaptionsAreTheTextEncodersStatesAfterTheTemplate) {
  TempDir tmp("mageflow_enc");
  const std::string root = demo_folder(tmp);
  const FamilyEncoders encoders = mageflow_family_encoders();
  const PipelineFolder folder = encoders.open(root, {"text_encoder"});
  const std::string caption = "a red square on a blue background";
  const auto encoded = encoders.load_text(folder, fp32())->encode_caption(caption);
  EXPECT_FALSE(encoded.pooled_prompt_embeds.defined());
  EXPECT_TRUE(encoded.warnings.empty());
  // The same text encoder, loaded and run by itself.
  const auto alone = MageFlowTextEncoder::load(root + "/text_encoder", at::kFloat);
  const at::Tensor expected = alone.encode(caption, 64, /*edit=*/false);
  ASSERT_EQ(encoded.prompt_embeds.sizes(), expected.sizes());
  EXPECT_TRUE(at::equal(encoded.prompt_embeds, expected));
  EXPECT_EQ(encoded.prompt_embeds.size(0),
            static_cast<int64_t>(alone.template_ids(caption, 64, false).size()) - 34);

  // The edit flavours use the edit template (64 tokens dropped), and so does an edit pipeline's folder.
  const auto edit = encoders.load_text(folder, fp32(64, "edit"))->encode_caption(caption);
  EXPECT_TRUE(at::equal(edit.prompt_embeds, alone.encode(caption, 64, /*edit=*/true)));
  EXPECT_EQ(encoders.prompt_style("edit-turbo"), "mage-flow-edit");
  EXPECT_EQ(encoders.prompt_style("base"), "mage-flow");
  EXPECT_TRUE(mageflow_uses_edit_template("", "MageFlowEditPipeline"));
  EXPECT_FALSE(mageflow_uses_edit_template("turbo", "MageFlowEditPipeline"));

  // A caption cut to tokenizer_max_length says so.
  const auto cut = encoders.load_text(folder, fp32(3))->encode_caption(caption);
  EXPECT_EQ(cut.prompt_embeds.size(0), 3);
  ASSERT_EQ(cut.warnings.size(), 1u);
  EXPECT_NE(cut.warnings[0].find("tokenizer_max_length 3"), std::string::npos) << cut.warnings[0];
}

TEST(MageFlowEncoders, PicturesAreThePosteriorMeanAndDecodeAsTheVaeAlone) {
  TempDir tmp("mageflow_enc");
  const std::string root = demo_folder(tmp);
  const FamilyEncoders encoders = mageflow_family_encoders();
  const PipelineFolder folder = encoders.open(root, {"vae"});
  const auto vae = encoders.load_image(folder, fp32());
  EXPECT_EQ(vae->vae_scale_factor(), 16);
  EXPECT_EQ(vae->pixel_conversion(), PixelConversion::clamp_truncate);
  torch::manual_seed(5);
  const at::Tensor picture = torch::rand({1, 3, 64, 32}) * 2 - 1;
  at::Generator a = at::detail::createCPUGenerator(1), b = at::detail::createCPUGenerator(2);
  const at::Tensor latents = vae->encode_image(picture, a);
  EXPECT_EQ(latents.sizes(), (std::vector<int64_t>{128, 4, 2}));
  EXPECT_TRUE(at::equal(latents, vae->encode_image(picture, b)));  // the mean, not a sample
  EXPECT_TRUE(at::equal(latents, vae->encode_image(picture, c10::nullopt)));

  auto alone = MageVae::load(remat::models::open_component_weights(root + "/vae"), mage_vae_config_of(folder), at::kFloat);
  EXPECT_TRUE(at::equal(latents, alone.encode(picture).squeeze(0)));
  const at::Tensor decoded = vae->decode_latents(latents);
  EXPECT_EQ(decoded.sizes(), (std::vector<int64_t>{1, 3, 64, 32}));
  EXPECT_TRUE(at::equal(decoded, alone.decode(latents.unsqueeze(0))));

  const std::string message = error_of([&] { vae->encode_image(torch::zeros({1, 3, 40, 32}), c10::nullopt); });
  EXPECT_NE(message.find("multiples of 16"), std::string::npos) << message;
}

TEST(MageFlowEncoders, BadFoldersAreRefusedByName) {
  TempDir tmp("mageflow_enc");
  const FamilyEncoders encoders = mageflow_family_encoders();
  // A Flux folder given as MageFlow.
  DemoPipelineOptions flux;
  flux.dtype = "fp32";
  write_demo_pipeline(tmp / "flux", flux);
  std::string message = error_of([&] { encoders.open(tmp / "flux", {"text_encoder", "vae"}); });
  EXPECT_NE(message.find("MageFlowPipeline"), std::string::npos) << message;
  EXPECT_NE(message.find("FluxPipeline"), std::string::npos) << message;

  // A missing component.
  const std::string root = demo_folder(tmp);
  fs::remove_all(root + "/vae");
  message = error_of([&] { encoders.open(root, {"text_encoder", "vae"}); });
  EXPECT_NE(message.find("'vae'"), std::string::npos) << message;

  // _vae_source leaving the folder.
  const std::string other = demo_folder(tmp, "other");
  Json index = read_json(other + "/model_index.json");
  index["_vae_source"] = "../flux/vae";
  write_json(other + "/model_index.json", index);
  message = error_of([&] { encoders.open(other, {"vae"}); });
  EXPECT_NE(message.find("_vae_source"), std::string::npos) << message;
  EXPECT_NE(message.find("leaves the pipeline folder"), std::string::npos) << message;

  // A tokenizer of another model: more tokens than the text encoder embeds, or no chat markers.
  const std::string third = demo_folder(tmp, "third");
  Json config = read_json(third + "/text_encoder/config.json");
  config["text_config"]["vocab_size"] = 300;
  write_json(third + "/text_encoder/config.json", config);
  const PipelineFolder folder = encoders.open(third, {"text_encoder"});
  message = error_of([&] { encoders.load_text(folder, fp32()); });
  EXPECT_NE(message.find("different models"), std::string::npos) << message;
  EXPECT_NE(message.find("tokenizer.json"), std::string::npos) << message;

  const std::string fourth = demo_folder(tmp, "fourth");
  Json tokenizer = read_json(fourth + "/text_encoder/tokenizer.json");
  Json kept = Json::array();
  for (const auto& t : tokenizer["added_tokens"]) {
    if (t["content"] != "<|im_start|>") kept.push_back(t);
  }
  tokenizer["added_tokens"] = kept;
  tokenizer["model"]["vocab"].erase("<|im_start|>");
  write_json(fourth + "/text_encoder/tokenizer.json", tokenizer);
  message = error_of([&] { encoders.load_text(encoders.open(fourth, {"text_encoder"}), fp32()); });
  EXPECT_NE(message.find("<|im_start|>"), std::string::npos) << message;
}

TEST(MageFlowEncoders, VaeConfigRoundTripsAndSizesAreChecked) {
  TempDir tmp("mageflow_enc");
  MageVaeConfig c = MageVaeConfig::preset("mage-vae-tiny");
  c.latent_channels = c.bottleneck_dim = 32;
  std::ofstream(tmp / "config.json") << c.to_json();
  const MageVaeConfig back = MageVaeConfig::from_json_file(tmp / "config.json");
  EXPECT_EQ(back.latent_channels, 32);
  EXPECT_EQ(back.hidden_size, c.hidden_size);
  EXPECT_EQ(back.num_denoiser_blocks, c.num_denoiser_blocks);
  EXPECT_EQ(back.attention_window, c.attention_window);
  // Upstream's own config (latent_channels, downsample_factor, ckpt_path): the published sizes.
  std::ofstream(tmp / "upstream.json") << R"({"_class_name": "MageVAE", "ckpt_path": "x", "latent_channels": 128,
                                              "downsample_factor": 16, "sample_posterior": false})";
  const MageVaeConfig upstream = MageVaeConfig::from_json_file(tmp / "upstream.json");
  EXPECT_EQ(upstream.hidden_size, MageVaeConfig{}.hidden_size);
  EXPECT_EQ(upstream.num_encoder_blocks, 21);
  std::ofstream(tmp / "bad.json") << R"({"hidden_size": "wide"})";
  const std::string message = error_of([&] { MageVaeConfig::from_json_file(tmp / "bad.json"); });
  EXPECT_NE(message.find("hidden_size"), std::string::npos) << message;
  EXPECT_NE(message.find("bad.json"), std::string::npos) << message;
}

// mage_vae_peak_bytes against the peak-tracking allocator: an upper bound, and not a loose one.
TEST(MageFlowEncoders, VaePeakEstimateBoundsTheMeasuredPeak) {
  remat::memory::install_cpu_tracking();
  for (const auto dtype : {at::kFloat, at::kBFloat16})
  for (const char* preset : {"mage-vae-tiny", "mage-vae"}) {
    MageVaeConfig c = MageVaeConfig::preset(preset);
    auto vae = MageVae::random(c, 0, 0.05, dtype);
    for (const int64_t side : {64, 128}) {
      torch::NoGradGuard no_grad;
      const at::Tensor picture = (torch::rand({1, 3, side, side}) * 2 - 1).to(dtype);
      int64_t measured = 0;
      at::Tensor latents;
      {
        remat::memory::PeakScope peak;
        latents = vae.encode(picture);
        measured = std::max(measured, peak.peak_bytes() - peak.baseline_bytes());
      }
      {
        remat::memory::PeakScope peak;
        const at::Tensor decoded = vae.decode(latents);
        measured = std::max(measured, peak.peak_bytes() - peak.baseline_bytes());
      }
      const int64_t estimate = mage_vae_peak_bytes(c, side, side, static_cast<int64_t>(c10::elementSize(dtype)));
      EXPECT_GE(estimate, measured) << preset << " at " << side << " px in " << dtype;
      EXPECT_LE(estimate, 3 * measured) << preset << " at " << side << " px in " << dtype;
    }
  }
}

}  // namespace mageflow_encoders_test
}  // namespace
