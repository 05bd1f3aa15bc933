// FluxEncoders on the tiny demo pipeline: the caption and picture paths do what FluxPipeline and
// diffusers' VAE do (checked against the components loaded and run one by one), the demo
// encoders fit the demo transformer, and bad folders are refused naming the file.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "remat/encoders/demo_pipeline.h"
#include "remat/encoders/flux_encoders.h"
#include "remat/encoders/pipeline_folder.h"
#include "remat/models/flux.h"
#include "temp_dir.h"
#include "value_error.h"

namespace {
namespace flux_encoders_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

namespace fs = std::filesystem;
using remat::testing::error_of;
using remat::testing::TempDir;
using namespace remat::encoders;
using namespace remat::models;
using Json = nlohmann::json;

std::string demo_folder(const TempDir& tmp) {
  DemoPipelineOptions options;
  options.dtype = "fp32";
  write_demo_pipeline(tmp / "pipe", options);
  return tmp / "pipe";
}

FluxEncoders load(const std::string& root, int64_t max_length = 64) {
  FluxEncodersOptions options;
  options.dtype = at::kFloat;
  options.max_sequence_length = max_length;
  return FluxEncoders::load(PipelineFolder::open(root, flux_encoder_components(options)), options);
}

Json read_json(const std::string& path) {
  std::ifstream in(path);
  return Json::parse(in);
}

const char* const kCaption = "A small red boat on a calm lake, early morning light.";

TEST(FluxEncoders, PromptIsClipPooledAndT5HiddenStatesWithoutMask) {
  TempDir tmp;
  const auto root = demo_folder(tmp);
  auto encoders = load(root, 64);
  const auto out = encoders.encode_prompt(kCaption);

  // The same, component by component, as FluxPipeline._get_clip_prompt_embeds / _get_t5_prompt_embeds.
  const auto clip_ids = ClipTokenizer::from_directory(root + "/tokenizer").encode(kCaption, 77).ids;
  const auto t5_encoding = T5Tokenizer::from_file(root + "/tokenizer_2/spiece.model").encode(kCaption, 64);
  auto clip = load_clip_text_model(find_component_weights(root + "/text_encoder").files,
                                   ClipTextConfig::from_file(root + "/text_encoder/config.json"), at::kFloat);
  auto t5 = load_t5_encoder(open_component_weights(root + "/text_encoder_2"),
                            T5Config::from_file(root + "/text_encoder_2/config.json"), at::kFloat);
  torch::NoGradGuard no_grad;
  const auto pooled = clip->forward(torch::tensor(clip_ids).unsqueeze(0)).pooled_output[0];
  const auto t5_ids = torch::tensor(t5_encoding.ids).unsqueeze(0);
  const auto hidden = t5->forward(t5_ids)[0];

  EXPECT_EQ(out.clip_ids, clip_ids);
  EXPECT_EQ(out.t5_ids, t5_encoding.ids);
  ASSERT_EQ(out.pooled_prompt_embeds.sizes(), pooled.sizes());
  ASSERT_EQ(out.prompt_embeds.sizes(), (std::vector<int64_t>{64, hidden.size(1)}));
  EXPECT_TRUE(torch::equal(out.pooled_prompt_embeds, pooled));
  EXPECT_TRUE(torch::equal(out.prompt_embeds, hidden));
  // FluxPipeline gives T5 no attention mask: the padding is attended to, which changes the states.
  const auto masked = t5->forward(t5_ids, torch::tensor(t5_encoding.attention_mask).unsqueeze(0))[0];
  EXPECT_FALSE(torch::allclose(out.prompt_embeds, masked));
  int64_t kept = 0;
  for (auto m : t5_encoding.attention_mask) kept += m;
  EXPECT_EQ(out.t5_content_tokens, kept - 1);
  EXPECT_TRUE(out.warnings.empty());
}

TEST(FluxEncoders, LongCaptionsWarnAsDiffusersDoes) {
  TempDir tmp;
  auto encoders = load(demo_folder(tmp), 8);
  const auto out = encoders.encode_prompt(kCaption);
  ASSERT_EQ(out.warnings.size(), 1u);  // T5 at 8 tokens cuts it; CLIP's 77 do not
  EXPECT_EQ(out.warnings[0].rfind("The following part of your input was truncated because `max_sequence_length` is "
                                  "set to 8 tokens: ", 0), 0u) << out.warnings[0];
  EXPECT_EQ(out.t5_content_tokens, 7);
  EXPECT_EQ(out.prompt_embeds.size(0), 8);
}

TEST(FluxEncoders, ImageLatentsAreTheScaledPosterior) {
  TempDir tmp;
  const auto root = demo_folder(tmp);
  auto encoders = load(root);
  const auto vae_json = read_json(root + "/vae/config.json");
  const double scale = vae_json["scaling_factor"], shift = vae_json["shift_factor"];
  torch::manual_seed(3);
  const auto image = torch::rand({1, 3, 16, 24}) * 2 - 1;

  const auto moments = encoders.vae()->encode_moments(image).detach();
  const auto mean = moments.chunk(2, 1)[0][0];
  const auto logvar = moments.chunk(2, 1)[1][0].clamp(-30, 20);
  // The mean: (mean - shift) * scale, in float64 from the moments.
  const auto from_mean = encoders.encode_image(image, c10::nullopt);
  EXPECT_TRUE(torch::allclose(from_mean.to(at::kDouble), (mean.to(at::kDouble) - shift) * scale, 1e-6, 1e-6));
  // A sample: mean + exp(logvar / 2) * eps, eps drawn from the given generator.
  const auto sampled = encoders.encode_image(image, at::make_generator<at::CPUGeneratorImpl>(11));
  const auto eps = at::randn(mean.sizes(), at::make_generator<at::CPUGeneratorImpl>(11));
  const auto expected = ((mean.to(at::kDouble) + (logvar.to(at::kDouble) / 2).exp() * eps.to(at::kDouble)) - shift) * scale;
  EXPECT_TRUE(torch::allclose(sampled.to(at::kDouble), expected, 1e-5, 1e-5));

  // Shapes fit the demo transformer: in_channels = 4 x latent channels (2 x 2 patches).
  const auto flux = remat::models::FluxConfig::from_json(root + "/transformer/config.json");
  EXPECT_EQ(from_mean.size(0) * 4, flux.in_channels);
  EXPECT_EQ(from_mean.size(1), 16 / encoders.vae_scale_factor());
  EXPECT_EQ(from_mean.size(2), 24 / encoders.vae_scale_factor());
  const auto prompt = encoders.encode_prompt("a boat");
  EXPECT_EQ(prompt.prompt_embeds.size(1), flux.joint_attention_dim);
  EXPECT_EQ(prompt.pooled_prompt_embeds.size(0), flux.pooled_projection_dim);

  // decode undoes the scaling before the decoder: decoder(latents / scale + shift).
  const auto decoded = encoders.decode_latents(from_mean);
  const auto direct = encoders.vae()->decode((from_mean / scale + shift).unsqueeze(0)).detach();
  EXPECT_TRUE(torch::allclose(decoded, direct, 1e-6, 1e-6));
}

TEST(FluxEncoders, ImageSidesMustFitThePatches) {
  TempDir tmp;
  auto encoders = load(demo_folder(tmp));
  const int64_t multiple = 2 * encoders.vae_scale_factor();
  EXPECT_EQ(error_of([&] { encoders.encode_image(torch::zeros({1, 3, 16, multiple + 1}), c10::nullopt); }),
            "[pipeline] image height and width must be multiples of " + std::to_string(multiple) + " (the VAE's " +
                std::to_string(multiple / 2) + "x downscale times Flux's 2 x 2 patches), got " +
                std::to_string(multiple + 1) + " x 16\n");
}

TEST(FluxEncoders, TokenizerAndEncoderFromDifferentModelsAreRefused) {
  TempDir tmp;
  const auto root = demo_folder(tmp);
  // A T5 whose vocabulary is smaller than the tokenizer's ids.
  const auto flux = remat::models::FluxConfig::from_json(root + "/transformer/config.json");
  const auto small = demo_t5_config(flux, 50);
  T5EncoderModel t5(small);
  save_component(root + "/text_encoder_2", *t5, small.to_json(), kDefaultMaxShardBytes, "model");
  const auto tokens = T5Tokenizer::from_file(root + "/tokenizer_2/spiece.model").vocab_size();
  EXPECT_EQ(error_of([&] { load(root); }),
            "[pipeline] tokenizer_2/spiece.model has " + std::to_string(tokens) +
                " tokens (with T5's 100 extra ids) but text_encoder_2/config.json's vocab_size is 50; the two "
                "come from different models\n");
}

TEST(FluxEncoders, BadComponentFilesNameTheFile) {
  TempDir tmp;
  const auto root = demo_folder(tmp);
  // An unknown activation in the VAE's config.
  auto vae_json = read_json(root + "/vae/config.json");
  vae_json["act_fn"] = "swish2";
  std::ofstream(root + "/vae/config.json") << vae_json.dump(2);
  auto message = error_of([&] { load(root); });
  EXPECT_NE(message.find(root + "/vae/config.json"), std::string::npos) << message;
  EXPECT_NE(message.find("swish2"), std::string::npos) << message;

  // A tokenizer file that is not a SentencePiece model.
  TempDir tmp2;
  const auto root2 = demo_folder(tmp2);
  std::ofstream(root2 + "/tokenizer_2/spiece.model", std::ios::binary) << "not a model";
  message = error_of([&] { load(root2); });
  EXPECT_NE(message.find(root2 + "/tokenizer_2/spiece.model"), std::string::npos) << message;

  // The VAE's weights replaced by the CLIP text encoder's: every key mismatches.
  TempDir tmp3;
  const auto root3 = demo_folder(tmp3);
  fs::copy_file(root3 + "/text_encoder/model.safetensors", root3 + "/vae/diffusion_pytorch_model.safetensors",
                fs::copy_options::overwrite_existing);
  message = error_of([&] { load(root3); });
  EXPECT_NE(message.find("vae/diffusion_pytorch_model.safetensors"), std::string::npos) << message;
  EXPECT_NE(message.find("encoder.conv_in.weight"), std::string::npos) << message;
}

}  // namespace flux_encoders_test
}  // namespace
