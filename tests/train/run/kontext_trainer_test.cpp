// FLUX.1 Kontext training (model_flavour kontext) on a tiny pipeline: the flow-matching loss of a
// batch with a reference picture against the same loss assembled here by hand from the upstream
// recipe (SimpleTuner's build_kontext_inputs and _model_predict_single: the reference's packed clean
// latents appended after the noisy ones with ids (1, r, c), the prediction cut back to the target
// tokens); `remat train` on a folder of picture pairs (caches written, then reused), its validation
// rendering the edits with their references, and `remat sample --image` rendering with the LoRA.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "remat/encoders/demo_pipeline.h"
#include "remat/image/png_file.h"
#include "remat/models/flux.h"
#include "remat/sample/pipeline.h"
#include "remat/train/family/family.h"
#include "remat/train/family/flow_matching.h"
#include "remat/train/family/text_to_image.h"
#include "remat/train/family/transformer.h"
#include "remat/train/options/config.h"
#include "remat/train/run/trainer.h"
#include "train/quiet_hooks.h"
#include "temp_dir.h"
#include "value_error.h"

namespace remat::train {
namespace {
namespace kontext_trainer_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

namespace fs = std::filesystem;
using remat::testing::TempDir;

// The loss of a Kontext batch: noise and sigmas drawn as the family draws them (noise, then
// sigmas, from the generator), the model run on [noisy target tokens; reference tokens] with ids
// written out element by element, and only the target tokens' predictions compared.
TEST(KontextLoss, IsTheLossOfTheTargetTokensWithTheReferenceAppended) {
  TransformerSpec spec;
  spec.family = "flux";
  spec.flavour = "flux-tiny";
  torch::manual_seed(0);
  auto transformer = make_transformer(spec, at::kCPU);
  auto& flux = dynamic_cast<models::FluxImpl&>(transformer->module());
  const auto& config = flux.config();
  Batch batch;
  batch.latents = torch::randn({2, 16, 4, 6});
  batch.conditioning_latents = torch::randn({2, 16, 6, 2});  // another shape than the target
  batch.prompt_embeds = torch::randn({2, 5, config.joint_attention_dim});
  batch.pooled_prompt_embeds = torch::randn({2, config.pooled_projection_dim});
  FlowMatchingOptions options;
  at::Generator g1 = at::make_generator<at::CPUGeneratorImpl>(9);
  const at::Tensor loss = transformer->flow_matching_loss(batch, options, g1);

  at::Generator g2 = at::make_generator<at::CPUGeneratorImpl>(9);
  const at::Tensor x0 = models::flux_pack_latents(batch.latents);  // (2, 6, 64)
  const at::Tensor noise = at::randn(x0.sizes(), g2, at::TensorOptions().dtype(at::kFloat));
  const at::Tensor sigmas = sample_sigmas(2, SigmaSampling::LogitNormal, options.sigmoid_scale, options.shift, g2);
  const at::Tensor s = sigmas.view({2, 1, 1});
  const at::Tensor x_t = (1 - s) * x0 + s * noise;
  const at::Tensor reference = models::flux_pack_latents(batch.conditioning_latents);  // (2, 3, 64)
  at::Tensor ids = torch::zeros({6 + 3, 3});
  for (int r = 0; r < 2; ++r) {
    for (int c = 0; c < 3; ++c) ids[r * 3 + c][1] = r, ids[r * 3 + c][2] = c;
  }
  for (int r = 0; r < 3; ++r) {
    ids[6 + r][0] = 1;  // the reference's flag, its own grid from (0, 0)
    ids[6 + r][1] = r;
  }
  const at::Tensor prediction =
      flux.forward(at::cat({x_t, reference}, 1), batch.prompt_embeds, batch.pooled_prompt_embeds, sigmas, ids,
                   torch::zeros({5, 3}), at::full({2}, options.guidance_value))
          .narrow(1, 0, 6);
  const at::Tensor expected = at::mse_loss(prediction, noise - x0);
  EXPECT_TRUE(at::allclose(loss, expected, 1e-6, 1e-7)) << loss.item<float>() << " vs " << expected.item<float>();

  // The planner profiles blocks on the longer image stream: 6 target + 3 reference tokens.
  const auto probes = transformer->block_probes(batch);
  ASSERT_EQ(probes.size(), 2u);
  EXPECT_EQ(probes[0].state[0].size(1), 6 + 3);      // the double blocks' image stream
  EXPECT_EQ(probes[1].state[0].size(1), 5 + 6 + 3);  // the single blocks' joint sequence

  // The reference is read: another one gives another loss.
  batch.conditioning_latents = torch::randn({2, 16, 6, 2});
  at::Generator g3 = at::make_generator<at::CPUGeneratorImpl>(9);
  EXPECT_FALSE(at::allclose(transformer->flow_matching_loss(batch, options, g3), loss));
}

void write_picture(const std::string& path, int64_t size, int r, int g, int b) {
  fs::create_directories(fs::path(path).parent_path());
  auto picture = at::empty({size, size, 3}, at::kByte);
  picture.select(2, 0).fill_(r);
  picture.select(2, 1).fill_(g);
  picture.select(2, 2).fill_(b);
  picture.slice(0, size / 4, size / 2).slice(1, size / 4, size / 2).fill_(255 - g);
  image::write_png(path, picture);
}

class KontextTrainer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pipeline_ = std::make_unique<TempDir>("kontext_pipeline");
    encoders::write_demo_pipeline(pipeline_->str(), {});
    // A FLUX.1 Kontext pipeline folder: the same components, FluxKontextPipeline's index.
    const std::string index_path = pipeline_->str() + "/model_index.json";
    nlohmann::json index = nlohmann::json::parse(std::ifstream(index_path));
    index["_class_name"] = "FluxKontextPipeline";
    std::ofstream(index_path) << index.dump(2);
  }
  static void TearDownTestSuite() { pipeline_.reset(); }

  void SetUp() override {
    // Four edits and their references: the same names, the reference another colour.
    const std::vector<std::array<int, 3>> colours = {{220, 10, 10}, {10, 220, 10}, {10, 10, 220}, {200, 200, 20}};
    const std::vector<std::string> names = {"make it red", "make it green", "make it blue", "make it yellow"};
    for (size_t i = 0; i < names.size(); ++i) {
      const auto& c = colours[i];
      write_picture(dir_ / ("edits/" + names[i] + ".png"), 32, c[0], c[1], c[2]);
      write_picture(dir_ / ("refs/" + names[i] + ".png"), 32, 128, 128, 128 + 20 * static_cast<int>(i));
    }
    const nlohmann::json backends = nlohmann::json::array(
        {{{"id", "edits"}, {"instance_data_dir", dir_ / "edits"}, {"conditioning_data", {"refs"}},
          {"resolution", 32}, {"resolution_type", "pixel"}},
         {{"id", "refs"}, {"instance_data_dir", dir_ / "refs"}, {"conditioning_type", "reference_strict"},
          {"caption_strategy", nullptr}, {"resolution", 32}, {"resolution_type", "pixel"}}});
    std::ofstream(dir_ / "multidatabackend.json") << backends.dump(2);
  }

  TrainConfig config(const std::string& output, std::vector<std::string> extra = {}) const {
    std::vector<std::string> args{"--model_family=flux", "--model_flavour=kontext", "--model_type=lora",
                                  "--lora_rank=4", "--pretrained_model_name_or_path=" + pipeline_->str(),
                                  "--data_backend_config=" + dir_ / "multidatabackend.json",
                                  "--output_dir=" + dir_ / output, "--cache_dir=" + dir_ / "cache",
                                  "--train_batch_size=2", "--mixed_precision=no", "--seed=3",
                                  "--checkpointing_steps=0", "--max_train_steps=2", "--learning_rate=1e-2"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<std::string> warnings;
    return load_train_config(args, warnings);
  }

  static std::unique_ptr<TempDir> pipeline_;
  TempDir dir_{"kontext_trainer"};
};

std::unique_ptr<TempDir> KontextTrainer::pipeline_;

TEST_F(KontextTrainer, TrainsOnPicturePairsValidatesTheEditsAndSamplesWithTheLora) {
  std::vector<std::string> lines;
  auto hooks = remat::testing::quiet_hooks();
  hooks.log = [&](const std::string& line) { lines.push_back(line); };
  const auto has = [&](const std::string& text) {
    for (const auto& line : lines) {
      if (line.find(text) != std::string::npos) return true;
    }
    return false;
  };
  const auto result = run_training(
      config("run1", {"--validation_prompt=make it purple", "--validation_steps=2", "--validation_resolution=32",
                      "--validation_num_inference_steps=2", "--validation_disable_unconditional=true",
                      "--num_eval_images=2"}),
      hooks);
  ASSERT_EQ(result.final_step, 2);
  for (const auto& record : result.records) EXPECT_TRUE(std::isfinite(record.loss));
  EXPECT_TRUE(has("4 picture pair(s) paired with 'refs'"));
  EXPECT_TRUE(has("VAE latents: 8 encoded"));  // four edits and four references
  EXPECT_TRUE(fs::is_regular_file(dir_ / "cache/vae/flux/refs/make it red.png.safetensors"));
  // Validation: the prompt, and the first two edits of 'edits' with their references.
  const fs::path gallery = dir_ / "run1/validation_images";
  for (const char* name : {"step_2_validation_0_32x32.png", "step_2_edits_0_0_32x32.png", "step_2_edits_1_0_32x32.png"}) {
    EXPECT_TRUE(fs::is_regular_file(gallery / name)) << name;
  }
  EXPECT_FALSE(fs::exists(gallery / "step_2_edits_2_0_32x32.png"));  // num_eval_images 2
  // The edit's caption (pairs in path order: "make it blue" first) and its reference's cache entry.
  const auto text = image::read_png_text((gallery / "step_2_edits_0_0_32x32.png").string());
  const auto value = [&](const std::string& key) {
    for (const auto& [k, v] : text) {
      if (k == key) return v;
    }
    return std::string("(none)");
  };
  EXPECT_EQ(value("prompt"), "make it blue");
  EXPECT_EQ(value("reference_latents"), dir_ / "cache/vae/flux/refs/make it blue.png.safetensors");
  std::ifstream html(gallery / "index.html");
  const std::string page((std::istreambuf_iterator<char>(html)), {});
  EXPECT_NE(page.find("edits_0"), std::string::npos);
  EXPECT_NE(page.find("make it blue"), std::string::npos);  // the edit caption (the sorted first)

  lines.clear();
  const auto again = run_training(config("run2"), hooks);
  EXPECT_EQ(again.final_step, 2);
  EXPECT_TRUE(has("VAE latents: 0 encoded")) << "the second run reuses every entry";

  // `remat sample --image` on the Kontext pipeline with the trained LoRA: the LoRA changes the edit.
  sample::PipelineOptions options;
  options.folder = pipeline_->str();
  options.dtype = at::kFloat;
  options.max_area = 32 * 32;
  options.image_auto_resize = false;
  sample::SampleRequest request;
  request.prompt = "make it red";
  request.image = dir_ / "refs/make it red.png";
  request.settings.width = 32;
  request.settings.height = 32;
  request.settings.num_inference_steps = 2;
  request.settings.seed = 5;
  const at::Tensor base = run_text_to_image(options, {request}).at(0);
  options.loras = {{result.weights_path, 1.0}};
  const at::Tensor tuned = run_text_to_image(options, {request}).at(0);
  EXPECT_EQ(tuned.sizes(), (std::vector<int64_t>{32, 32, 3}));
  EXPECT_FALSE(at::equal(tuned, base));
}

TEST_F(KontextTrainer, PairsAndFlavoursMustAgree) {
  // Kontext without references, and references without Kontext, stop before anything loads.
  const std::string plain = dir_ / "plain.json";
  std::ofstream(plain) << R"([{"id": "edits", "instance_data_dir": ")" + dir_ / "edits" + R"("}])";
  auto hooks = remat::testing::quiet_hooks();
  auto no_pairs = config("bad1");
  no_pairs.data_backend_config = plain;
  const std::string a = testing::error_of([&] { run_training(no_pairs, hooks); });
  EXPECT_NE(a.find("model_flavour kontext trains on picture pairs"), std::string::npos) << a;
  EXPECT_NE(a.find("'edits'"), std::string::npos) << a;
  EXPECT_NE(a.find("conditioning_data"), std::string::npos) << a;
  auto not_kontext = config("bad2");
  not_kontext.model_flavour = "flux-tiny";
  const std::string b = testing::error_of([&] { run_training(not_kontext, hooks); });
  EXPECT_NE(b.find("model_flavour kontext"), std::string::npos) << b;
  EXPECT_NE(b.find("would ignore its reference pictures"), std::string::npos) << b;
  EXPECT_FALSE(fs::exists(dir_ / "cache")) << "nothing was encoded";
  const std::string c = testing::error_of([&] {
    run_training(config("bad3", {"--validation_prompt=x", "--eval_dataset_id=nope"}), hooks);
  });
  EXPECT_NE(c.find("eval_dataset_id 'nope'"), std::string::npos) << c;
  EXPECT_NE(c.find("edits"), std::string::npos) << c;
}

}  // namespace kontext_trainer_test
}  // namespace
}  // namespace remat::train
