// Validation images in `remat train`, end to end on the demo pipeline (tiny random Flux folder):
// pictures at exactly the expected steps with their gallery, training unchanged by validation
// (weights, losses and the global generator bit for bit as without it), exact resume with
// validation on, validation's peak memory reported apart from the training step's, the refusals
// before any model loads, and lora_format kohya.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>

#include "remat/encoders/demo_pipeline.h"
#include "remat/image/image_file.h"
#include "remat/io/safetensors.h"
#include "remat/models/lora_formats.h"
#include "remat/image/png_file.h"
#include "remat/train/options/config.h"
#include "remat/train/data/data.h"
#include "remat/train/family/family.h"
#include "remat/train/run/trainer.h"
#include "remat/train/validation/validation_images.h"
#include "train/quiet_hooks.h"
#include "safetensors_tensors.h"
#include "temp_dir.h"
#include "value_error.h"
#include "flux_tiny_dataset.h"

namespace remat::train {
namespace {
namespace validation_trainer_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

namespace fs = std::filesystem;
using remat::testing::error_of;
using remat::testing::quiet_hooks;
using remat::testing::read_tensors;
using remat::testing::TempDir;

class ValidationTrainer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pipeline_ = std::make_unique<TempDir>("validation_pipeline");
    encoders::write_demo_pipeline(pipeline_->str(), {});  // flux-tiny and encoders that fit it
    data_ = std::make_unique<TempDir>("validation_data");
    remat::testing::make_flux_tiny_dataset(data_->str(), 16);
  }
  static void TearDownTestSuite() {
    pipeline_.reset();
    data_.reset();
  }

  // A LoRA run on the latent cache, with the demo pipeline's transformer and encoders.
  TrainConfig config(const std::string& output, std::vector<std::string> extra = {}) const {
    std::vector<std::string> args{"--model_family=flux", "--model_flavour=flux-tiny", "--model_type=lora",
                                  "--lora_rank=4", "--pretrained_model_name_or_path=" + pipeline_->str(),
                                  "--instance_data_dir=" + data_->str(), "--output_dir=" + dir_ / output,
                                  "--train_batch_size=2", "--learning_rate=1e-2", "--lr_scheduler=constant",
                                  "--mixed_precision=no", "--seed=3", "--checkpointing_steps=0",
                                  "--resume_from_checkpoint=latest", "--max_train_steps=10",
                                  "--tokenizer_max_length=8"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<std::string> warnings;
    return load_train_config(args, warnings);
  }
  static std::vector<std::string> validation_flags() {
    return {"--validation_prompt=a red square", "--validation_step_interval=2", "--validation_resolution=32,48x32",
            "--validation_num_inference_steps=3", "--validation_guidance=3.5", "--validation_seed=11"};
  }

  static std::string bytes_of(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  static std::set<std::string> pngs_in(const std::string& dir) {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().extension() == ".png") out.insert(e.path().filename().string());
    }
    return out;
  }
  static std::set<std::string> expected_files(const std::vector<int64_t>& steps) {
    std::set<std::string> out;
    for (int64_t step : steps) {
      for (const char* shortname : {"unconditional", "validation"}) {
        out.insert("step_" + std::to_string(step) + "_" + shortname + "_0_32x32.png");
        out.insert("step_" + std::to_string(step) + "_" + shortname + "_1_48x32.png");
      }
    }
    return out;
  }

  static std::unique_ptr<TempDir> pipeline_, data_;
  TempDir dir_{"validation_trainer"};
};

std::unique_ptr<TempDir> ValidationTrainer::pipeline_, ValidationTrainer::data_;

// The reference: the same 10 steps without validation. With validation every 2 steps the run
// trains bit for bit the same (its weights, its losses, the global generator it leaves), renders
// steps 0, 2, ..., 10, and an interrupted run resumed from step 5 renders 6, 8, 10 (not 0 again)
// with pictures identical to the uninterrupted run's.
TEST_F(ValidationTrainer, RendersAtTheExpectedStepsWithoutChangingTrainingAndResumesExactly) {
  const auto plain = run_training(config("plain"), quiet_hooks());
  const at::Tensor plain_global = at::detail::getDefaultCPUGenerator().get_state().clone();
  ASSERT_TRUE(plain.validations.empty());

  std::vector<std::string> lines;
  auto hooks = quiet_hooks();
  hooks.log = [&](const std::string& line) { lines.push_back(line); };
  const auto once = run_training(config("once", validation_flags()), hooks);
  const at::Tensor once_global = at::detail::getDefaultCPUGenerator().get_state().clone();
  ASSERT_EQ(once.final_step, 10);
  EXPECT_TRUE(torch::equal(plain_global, once_global)) << "validation moved the global CPU generator";

  // Pictures at exactly steps 0, 2, 4, 6, 8, 10: two prompts x two resolutions each.
  const std::string gallery_dir = dir_ / "once/validation_images";
  EXPECT_EQ(pngs_in(gallery_dir), expected_files({0, 2, 4, 6, 8, 10}));
  std::vector<int64_t> steps;
  for (const auto& v : once.validations) steps.push_back(v.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{0, 2, 4, 6, 8, 10}));

  // Training is untouched: the same weights and losses as without validation.
  const auto a = read_tensors(plain.weights_path), b = read_tensors(once.weights_path);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, tensor] : a) EXPECT_TRUE(torch::equal(tensor, b.at(name))) << name;
  ASSERT_EQ(plain.records.size(), once.records.size());
  for (size_t i = 0; i < plain.records.size(); ++i) EXPECT_EQ(plain.records[i].loss, once.records[i].loss) << i;

  // The pictures: the rounded size rendered (48x32 stays), the parameters in text chunks.
  const auto picture = image::read_image(gallery_dir + "/step_4_validation_1_48x32.png");
  EXPECT_EQ(picture.size(0), 32);  // (H, W, 3); the latent grid follows the demo VAE's factor
  EXPECT_EQ(picture.size(1), 48);
  std::map<std::string, std::string> text;
  for (const auto& [k, v] : image::read_png_text(gallery_dir + "/step_4_validation_1_48x32.png")) text[k] = v;
  EXPECT_EQ(text["width"], "48");
  EXPECT_EQ(text["height"], "32");
  EXPECT_EQ(text["prompt"], "a red square");
  EXPECT_EQ(text["seed"], "11");
  EXPECT_EQ(text["steps"], "3");
  EXPECT_EQ(text["training_step"], "4");
  // Training changed what the model draws: step 10's picture differs from step 0's.
  EXPECT_NE(bytes_of(gallery_dir + "/step_0_validation_0_32x32.png"),
            bytes_of(gallery_dir + "/step_10_validation_0_32x32.png"));

  // The gallery: a row per step, step 0 first.
  const std::string html = bytes_of(gallery_dir + "/index.html");
  size_t last = 0;
  for (int64_t step : {0, 2, 4, 6, 8, 10}) {
    const size_t at = html.find("<th class=\"step\">" + std::to_string(step) + "</th>");
    ASSERT_NE(at, std::string::npos) << step;
    EXPECT_GT(at, last);
    last = at;
  }

  // Memory: validation's own peak is reported, and a training step's peak is the one without
  // validation plus at most the prompt embeddings validation keeps for the run.
  for (const auto& v : once.validations) {
    EXPECT_GT(v.peak_bytes, v.baseline_bytes) << v.step;
    EXPECT_EQ(v.images, 4);
  }
  for (size_t i = 0; i < plain.records.size(); ++i) {
    EXPECT_GE(once.records[i].peak_bytes, plain.records[i].peak_bytes) << i;
    EXPECT_LE(once.records[i].peak_bytes - plain.records[i].peak_bytes, 64 * 1024) << i;
  }
  std::cout << "[ figures  ] training step peak " << once.summary.peak_bytes << " B (without validation "
            << plain.summary.peak_bytes << " B); validation peak " << once.validations.back().peak_bytes
            << " B over a baseline of " << once.validations.back().baseline_bytes << " B\n";
  EXPECT_TRUE(std::any_of(lines.begin(), lines.end(), [](const std::string& l) {
    return l.find("[validation] 6 validation(s)") != std::string::npos && l.find("training step peak") != std::string::npos;
  }));

  // Interrupted after step 5, resumed: the same weights, and only steps 6, 8, 10 rendered again.
  std::atomic<bool> stop{false};
  auto stopping = quiet_hooks();
  stopping.stop_requested = &stop;
  stopping.on_step = [&](const StepRecord& r) {
    if (r.step == 5) stop = true;
  };
  const auto first = run_training(config("split", validation_flags()), stopping);
  ASSERT_TRUE(first.interrupted);
  EXPECT_EQ(pngs_in(dir_ / "split/validation_images"), expected_files({0, 2, 4}));
  const auto second = run_training(config("split", validation_flags()), quiet_hooks());
  ASSERT_EQ(second.final_step, 10);
  steps.clear();
  for (const auto& v : second.validations) steps.push_back(v.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{6, 8, 10}));
  EXPECT_EQ(pngs_in(dir_ / "split/validation_images"), expected_files({0, 2, 4, 6, 8, 10}));
  const auto c = read_tensors(second.weights_path);
  for (const auto& [name, tensor] : a) EXPECT_TRUE(torch::equal(tensor, c.at(name))) << name;
  for (const auto& name : expected_files({0, 2, 4, 6, 8, 10})) {
    EXPECT_EQ(bytes_of(gallery_dir + "/" + name), bytes_of(dir_ / "split/validation_images/" + name)) << name;
  }
  // The resumed run's gallery still shows the steps before the interruption.
  EXPECT_NE(bytes_of(dir_ / "split/validation_images/index.html").find("<th class=\"step\">0</th>"), std::string::npos);
}

TEST_F(ValidationTrainer, RefusesRunsThatCannotRenderBeforeAnyModelLoads) {
  // A latent-cache run whose model is a transformer file, not a pipeline folder.
  auto no_pipeline = config("nopipe", validation_flags());
  no_pipeline.pretrained_model_name_or_path = pipeline_->str() + "/transformer";
  const std::string message = error_of([&] { run_training(no_pipeline, quiet_hooks()); });
  EXPECT_NE(message.find("validation images are rendered with the pipeline's text encoders and VAE"), std::string::npos)
      << message;
  EXPECT_NE(message.find("validation_disable=true"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(dir_ / "nopipe/metrics.jsonl"));

  // A MageFlow run given a Flux pipeline folder: refused by the folder's class, before training.
  auto mageflow = config("mage", validation_flags());
  mageflow.model_family = "mageflow";
  const std::string mage_message = error_of([&] { run_training(mageflow, quiet_hooks()); });
  EXPECT_NE(mage_message.find("MageFlowPipeline"), std::string::npos) << mage_message;
  EXPECT_FALSE(fs::exists(dir_ / "mage/metrics.jsonl"));

  // validation_disable turns it off: the same run trains.
  auto off = config("off", validation_flags());
  off.pretrained_model_name_or_path = pipeline_->str() + "/transformer";
  off.validation_disable = true;
  off.max_train_steps = 1;
  EXPECT_EQ(run_training(off, quiet_hooks()).final_step, 1);
  EXPECT_FALSE(fs::exists(dir_ / "off/validation_images"));
}

// A validation that fails (here: validation_images is a file, so no picture can be written) is
// logged and training goes on to the end.
TEST_F(ValidationTrainer, AFailedValidationDoesNotStopTraining) {
  fs::create_directories(dir_ / "blocked");
  std::ofstream(dir_ / "blocked/validation_images") << "not a folder";
  std::vector<std::string> lines;
  auto hooks = quiet_hooks();
  hooks.log = [&](const std::string& line) { lines.push_back(line); };
  const auto result = run_training(config("blocked", {"--validation_prompt=x", "--validation_step_interval=1",
                                                      "--validation_resolution=32", "--validation_num_inference_steps=1",
                                                      "--max_train_steps=2"}),
                                   hooks);
  EXPECT_EQ(result.final_step, 2);
  EXPECT_TRUE(fs::is_regular_file(result.weights_path));
  EXPECT_TRUE(result.validations.empty());
  EXPECT_EQ(std::count_if(lines.begin(), lines.end(),
                          [](const std::string& l) { return l.find("failed, training continues") != std::string::npos; }),
            3);  // steps 0, 1, 2
}

// Real CFG (validation_guidance_real > 1) renders with the negative prompt, recorded in the PNG,
// and changes the picture against the same run without it.
TEST_F(ValidationTrainer, RealGuidanceUsesTheNegativePrompt) {
  const std::vector<std::string> flags{"--validation_prompt=a red square", "--validation_step_interval=0",
                                       "--validation_resolution=32", "--validation_num_inference_steps=2",
                                       "--validation_no_cfg_until_timestep=0", "--validation_disable_unconditional",
                                       "--max_train_steps=1"};
  auto with_cfg = flags;
  with_cfg.push_back("--validation_guidance_real=4");
  with_cfg.push_back("--validation_negative_prompt=blue");
  run_training(config("plain_cfg", flags), quiet_hooks());
  run_training(config("real_cfg", with_cfg), quiet_hooks());
  const std::string name = "validation_images/step_0_validation_0_32x32.png";
  EXPECT_EQ(pngs_in(dir_ / "real_cfg/validation_images"), (std::set<std::string>{"step_0_validation_0_32x32.png"}));
  std::map<std::string, std::string> text;
  for (const auto& [k, v] : image::read_png_text(dir_ / ("real_cfg/" + name))) text[k] = v;
  EXPECT_EQ(text["negative_prompt"], "blue");
  EXPECT_EQ(text["true_cfg_scale"], "4");
  EXPECT_NE(bytes_of(dir_ / ("real_cfg/" + name)), bytes_of(dir_ / ("plain_cfg/" + name)));
}

// lora_format kohya writes the adapter in kohya's layout; read back, its weight deltas are the
// PEFT file's (computed here from lora_B @ lora_A * alpha / r).
TEST_F(ValidationTrainer, LoraFormatKohyaWritesTheSameAdapterInKohyasLayout) {
  const auto peft = run_training(config("peft", {"--max_train_steps=2", "--lora_alpha=2"}), quiet_hooks());
  const auto kohya = run_training(config("kohya", {"--max_train_steps=2", "--lora_alpha=2", "--lora_format=kohya"}),
                                  quiet_hooks());
  const auto keys = read_tensors(kohya.weights_path);
  for (const auto& [name, tensor] : keys) EXPECT_EQ(name.rfind("lora_unet_", 0), 0u) << name;
  const auto file = models::read_lora_file(kohya.weights_path);
  EXPECT_EQ(file.format, models::LoraFileFormat::kohya);
  const auto factors = read_tensors(peft.weights_path);
  int64_t modules = 0;
  for (const auto& [key, a] : factors) {
    const std::string suffix = ".lora_A.weight";
    if (key.size() < suffix.size() || key.compare(key.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    const std::string module = key.substr(std::string("transformer.").size(),
                                          key.size() - suffix.size() - std::string("transformer.").size());
    const at::Tensor b = factors.at(key.substr(0, key.size() - suffix.size()) + ".lora_B.weight");
    const at::Tensor want = b.to(at::kDouble).matmul(a.to(at::kDouble)) * (2.0 / 4.0);
    ASSERT_TRUE(file.modules.count(module)) << module;
    const auto& m = file.modules.at(module);
    const at::Tensor got = m.up.to(at::kDouble).matmul(m.down.to(at::kDouble)) * m.scale;
    EXPECT_TRUE(torch::allclose(got, want, 1e-6, 1e-9)) << module;
    ++modules;
  }
  EXPECT_GT(modules, 0);
}

// use_ema with SimpleTuner's default ema_validation, comparison: every picture again with the
// average, from the same noise, in the column beside it; at step 0 the average is the weights, so
// the two pictures are equal, and by step 10 (ema_decay 0.9) they differ. ema_only renders the
// average alone. Training is the same as without EMA.
TEST_F(ValidationTrainer, EmaComparisonRendersBothWeightsSideBySide) {
  const std::vector<std::string> flags{"--validation_prompt=a red square", "--validation_step_interval=5",
                                       "--validation_resolution=32", "--validation_num_inference_steps=3",
                                       "--validation_seed=11", "--validation_disable_unconditional=true"};
  auto with_ema = flags;
  with_ema.insert(with_ema.end(), {"--use_ema=true", "--ema_decay=0.9"});
  const auto plain = run_training(config("no-ema", flags), quiet_hooks());
  const auto both = run_training(config("comparison", with_ema), quiet_hooks());
  const std::string dir = dir_ / "comparison/validation_images";
  std::set<std::string> expected;
  for (const char* step : {"0", "5", "10"}) {
    expected.insert(std::string("step_") + step + "_validation_0_32x32.png");
    expected.insert(std::string("step_") + step + "_validation_0_32x32_ema.png");
  }
  EXPECT_EQ(pngs_in(dir), expected);
  // The trained-weights pictures are those of the run without EMA.
  for (const char* step : {"0", "5", "10"}) {
    const std::string name = std::string("step_") + step + "_validation_0_32x32.png";
    EXPECT_EQ(bytes_of(dir + "/" + name), bytes_of(dir_ / "no-ema/validation_images/" + name)) << name;
  }
  EXPECT_TRUE(torch::equal(image::read_image(dir + "/step_0_validation_0_32x32.png"),
                           image::read_image(dir + "/step_0_validation_0_32x32_ema.png")));
  EXPECT_FALSE(torch::equal(image::read_image(dir + "/step_10_validation_0_32x32.png"),
                            image::read_image(dir + "/step_10_validation_0_32x32_ema.png")));
  std::map<std::string, std::string> text;
  for (const auto& [k, v] : image::read_png_text(dir + "/step_10_validation_0_32x32_ema.png")) text[k] = v;
  EXPECT_EQ(text["weights"], "ema");
  // The gallery: the EMA column right after the trained-weights one, in every row.
  const std::string html = bytes_of(dir + "/index.html");
  EXPECT_NE(html.find("EMA weights"), std::string::npos);
  const size_t base = html.find("step_10_validation_0_32x32.png"), ema = html.find("step_10_validation_0_32x32_ema.png");
  ASSERT_NE(base, std::string::npos);
  ASSERT_NE(ema, std::string::npos);
  EXPECT_LT(base, ema);
  const auto a = read_tensors(plain.weights_path), b = read_tensors(both.weights_path);
  for (const auto& [name, tensor] : a) EXPECT_TRUE(torch::equal(tensor, b.at(name))) << name;

  auto only = flags;
  only.insert(only.end(), {"--use_ema=true", "--ema_decay=0.9", "--ema_validation=ema_only", "--max_train_steps=5"});
  run_training(config("ema-only", only), quiet_hooks());
  EXPECT_EQ(pngs_in(dir_ / "ema-only/validation_images"),
            (std::set<std::string>{"step_0_validation_0_32x32_ema.png", "step_5_validation_0_32x32_ema.png"}));
  EXPECT_EQ(bytes_of(dir_ / "ema-only/validation_images/step_5_validation_0_32x32_ema.png"),
            bytes_of(dir + "/step_5_validation_0_32x32_ema.png"));
}

}  // namespace validation_trainer_test
}  // namespace
}  // namespace remat::train
