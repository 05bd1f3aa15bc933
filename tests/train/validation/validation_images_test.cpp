// Validation images, the parts that need no model: SimpleTuner's resolution parsing and rounding
// (against an integer formulation of Python's round written here), the prompt library, the prompt
// order, the trigger, the file names, the options, and the gallery page.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "remat/train/options/config.h"
#include "remat/train/options/options.h"
#include "remat/train/validation/validation_images.h"
#include "temp_dir.h"
#include "value_error.h"

namespace remat::train {
namespace {
namespace validation_images_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

namespace fs = std::filesystem;
using remat::testing::error_of;
using remat::testing::TempDir;

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

TrainConfig load(std::vector<std::string> args) {
  std::vector<std::string> warnings;
  args.insert(args.begin(), {"--model_family=flux", "--model_flavour=flux-tiny"});
  return load_train_config(args, warnings);
}

// Python's round(p / 16) * 16 (halves to even) in integers, at least 16.
int64_t python_round_to_16(int64_t p) {
  int64_t q = p / 16;
  const int64_t rem = p % 16;
  if (rem > 8 || (rem == 8 && q % 2 == 1)) ++q;
  return std::max<int64_t>(q * 16, 16);
}

TEST(ValidationResolution, RoundsLikeSimpleTunerToMultiplesOf16) {
  for (int64_t p = 0; p <= 2100; ++p) EXPECT_EQ(round_validation_side(p), python_round_to_16(p)) << p;
  EXPECT_EQ(round_validation_side(1000), 992);   // 62.5 -> 62
  EXPECT_EQ(round_validation_side(1016), 1024);  // 63.5 -> 64
  EXPECT_EQ(round_validation_side(5), 16);
}

TEST(ValidationResolution, ParsesSquaresPairsAndLists) {
  const auto r = parse_validation_resolutions("1024, 1000X768 ,512x512");
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].width, 1024);
  EXPECT_EQ(r[0].height, 1024);
  EXPECT_EQ(r[1].requested_width, 1000);
  EXPECT_EQ(r[1].width, 992);
  EXPECT_EQ(r[1].height, 768);
  EXPECT_EQ(r[1].label(), "1000x768");  // files keep the size as written, as SimpleTuner names them
  EXPECT_EQ(r[2].label(), "512x512");
}

TEST(ValidationResolution, RefusesWhatIsNotAResolution) {
  for (const char* bad : {"", "abc", "1024x", "x512", "10x20x30", "1024,", "99999", "-5"}) {
    const std::string message = error_of([&] { parse_validation_resolutions(bad); });
    EXPECT_NE(message.find("validation_resolution must be N or WxH"), std::string::npos) << bad << ": " << message;
  }
  // The option's pattern refuses them when the config is read, with every other error.
  const std::string message = error_of([] { load({"--validation_resolution=1024x"}); });
  EXPECT_NE(message.find("validation_resolution"), std::string::npos) << message;
}

TEST(ValidationPrompts, ReadsSimpleTunersPromptLibraryInFileOrder) {
  TempDir dir("prompt_library");
  const std::string path = dir / "library.json";
  write_text(path, R"({"zebra": "a zebra", "cat": {"prompt": "a cat", "adapter_strength": 0.5},
                       "dog": {"caption": "a dog"}, "  ": "skipped", "tagged": {"tags": "red, cube"}})");
  const auto prompts = read_user_prompt_library(path);
  ASSERT_EQ(prompts.size(), 4u);
  EXPECT_EQ(prompts[0].shortname, "zebra");
  EXPECT_EQ(prompts[0].prompt, "a zebra");
  EXPECT_EQ(prompts[1].shortname, "cat");
  EXPECT_EQ(prompts[1].prompt, "a cat");
  EXPECT_EQ(prompts[2].prompt, "a dog");
  EXPECT_EQ(prompts[3].prompt, "red, cube");

  // Order of a run: unconditional, the library, validation_prompt.
  const auto config = load({"--user_prompt_library=" + path, "--validation_prompt=a red cube"});
  const auto all = validation_prompts(config);
  ASSERT_EQ(all.size(), 6u);
  EXPECT_EQ(all.front().shortname, "unconditional");
  EXPECT_EQ(all.front().prompt, "");
  EXPECT_EQ(all[1].shortname, "zebra");
  EXPECT_EQ(all.back().shortname, "validation");
  EXPECT_EQ(all.back().prompt, "a red cube");
  EXPECT_EQ(validation_prompts(load({"--validation_prompt=x", "--validation_disable_unconditional"})).size(), 1u);
  EXPECT_TRUE(validation_prompts(load({"--validation_prompt=x", "--validation_disable"})).empty());
  EXPECT_TRUE(validation_prompts(load({})).empty());  // nothing asked for: nothing rendered
}

TEST(ValidationPrompts, RefusesABadLibraryNamingTheFileAndTheEntry) {
  TempDir dir("prompt_library_bad");
  const auto message_for = [&](const std::string& text) {
    write_text(dir / "l.json", text);
    return error_of([&] { read_user_prompt_library(dir / "l.json"); });
  };
  EXPECT_NE(message_for("[1, 2]").find("must be a JSON object"), std::string::npos);
  EXPECT_NE(message_for("{\"a\": 3}").find("entry 'a' must be a prompt string"), std::string::npos);
  EXPECT_NE(message_for("{\"a\": {\"weight\": 1}}").find("entry 'a'"), std::string::npos);
  EXPECT_NE(message_for("{\"a/b\": \"x\"}").find("shortnames must be usable in a file name"), std::string::npos);
  EXPECT_NE(message_for("{\"a\": ").find("must be JSON"), std::string::npos);
  const std::string missing = error_of([&] { read_user_prompt_library(dir / "missing.json"); });
  EXPECT_NE(missing.find("missing.json"), std::string::npos) << missing;
  write_text(dir / "dup.json", R"({"validation": "clash"})");
  const std::string clash =
      error_of([&] { validation_prompts(load({"--user_prompt_library=" + dir / "dup.json", "--validation_prompt=x"})); });
  EXPECT_NE(clash.find("shortname 'validation'"), std::string::npos) << clash;
}

TEST(ValidationSchedule, TriggersOnMultiplesOfTheInterval) {
  const auto due_steps = [](const TrainConfig& c) {
    std::vector<int64_t> steps;
    for (int64_t s = 1; s <= 12; ++s) {
      if (validation_due(c, s)) steps.push_back(s);
    }
    return steps;
  };
  EXPECT_EQ(due_steps(load({"--validation_step_interval=4"})), (std::vector<int64_t>{4, 8, 12}));
  // SimpleTuner's configs set both names; the current one wins, the older one stands in for it.
  EXPECT_EQ(due_steps(load({"--validation_step_interval=5", "--validation_steps=3"})), (std::vector<int64_t>{5, 10}));
  EXPECT_EQ(due_steps(load({"--validation_steps=3"})), (std::vector<int64_t>{3, 6, 9, 12}));
  EXPECT_EQ(load({}).validation_interval(), 100);
  EXPECT_TRUE(due_steps(load({"--validation_step_interval=0"})).empty());
}

TEST(ValidationOptions, HaveSimpleTunersDefaultsAndSeedRule) {
  const TrainConfig c = load({});
  EXPECT_EQ(c.validation_num_inference_steps, 30);
  EXPECT_EQ(c.validation_guidance, 7.5);
  EXPECT_EQ(c.validation_guidance_real, 1.0);
  EXPECT_EQ(c.validation_no_cfg_until_timestep, 2);
  EXPECT_EQ(c.validation_negative_prompt, "blurry, cropped, ugly");
  EXPECT_EQ(c.validation_resolution, "256");
  EXPECT_FALSE(c.validation_requested());
  EXPECT_EQ(c.lora_format, "diffusers");
  // validation_seed or seed or 0, with Python's truthiness.
  EXPECT_EQ(load({"--seed=7", "--validation_seed=9"}).validation_seed_value(), 9u);
  EXPECT_EQ(load({"--seed=7", "--validation_seed=0"}).validation_seed_value(), 7u);
  EXPECT_EQ(load({"--seed=7"}).validation_seed_value(), 7u);
  EXPECT_EQ(load({"--seed=none"}).validation_seed_value(), 0u);
  EXPECT_NE(error_of([] { load({"--validation_num_inference_steps=0"}); }).find("validation_num_inference_steps"),
            std::string::npos);
  EXPECT_EQ(load({"--lora_format=peft", "--model_type=lora"}).lora_format, "diffusers");
  const std::string comfy = error_of([] { load({"--lora_format=comfyui", "--model_type=lora"}); });
  EXPECT_NE(comfy.find("lora_format=comfyui is not supported by remat yet"), std::string::npos) << comfy;
}

TEST(ValidationFiles, AreNamedAsSimpleTunerNamesThem) {
  ValidationResolution r;
  r.requested_width = 1000;
  r.requested_height = 768;
  EXPECT_EQ(validation_image_file_name(250, "my_cat", 1, r), "step_250_my_cat_1_1000x768.png");
}

TEST(ValidationGallery, ShowsOneRowPerStepAndOneColumnPerPromptAndResolution) {
  TempDir dir("gallery");
  for (const char* name : {"step_10_validation_0_32x32.png", "step_0_validation_0_32x32.png",
                           "step_2_validation_0_32x32.png", "step_0_unconditional_0_32x32.png",
                           "step_2_unconditional_0_32x32.png", "step_0_my_cat_1_48x32.png",
                           "step_2_old_name_0_32x32.png", "notes.txt"}) {
    write_text(dir / name, "");
  }
  const std::vector<ValidationPrompt> prompts{{"unconditional", ""}, {"my_cat", "a <cat> & \"dog\""}, {"validation", "x"}};
  write_validation_gallery(dir.str(), prompts);
  std::ifstream in(dir / "index.html");
  const std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Rows: steps ascending, step 0 (before training) first, 10 after 2.
  const size_t row0 = html.find("<th class=\"step\">0</th>"), row2 = html.find("<th class=\"step\">2</th>"),
               row10 = html.find("<th class=\"step\">10</th>");
  ASSERT_NE(row0, std::string::npos);
  EXPECT_LT(row0, row2);
  EXPECT_LT(row2, row10);
  // Columns in the run's prompt order, then shortnames no longer in it; underscores in names kept.
  const size_t c_uncond = html.find("<th>unconditional #0"), c_cat = html.find("<th>my_cat #1<br>48x32"),
               c_valid = html.find("<th>validation #0"), c_old = html.find("<th>old_name #0");
  ASSERT_NE(c_cat, std::string::npos);
  EXPECT_LT(c_uncond, c_cat);
  EXPECT_LT(c_cat, c_valid);
  EXPECT_LT(c_valid, c_old);
  EXPECT_NE(html.find("a &lt;cat&gt; &amp; &quot;dog&quot;"), std::string::npos);  // escaped
  EXPECT_NE(html.find("<img src=\"step_10_validation_0_32x32.png\""), std::string::npos);
  // Four columns: the step-10 row has the picture in the validation column and empty cells elsewhere.
  const std::string row10_text = html.substr(row10, html.find("</tr>", row10) - row10);
  size_t cells = 0;
  for (size_t at = row10_text.find("<td"); at != std::string::npos; at = row10_text.find("<td", at + 1)) ++cells;
  EXPECT_EQ(cells, 4u);
  // Static and offline: no script, nothing fetched.
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("http"), std::string::npos);
  EXPECT_EQ(html.find("notes.txt"), std::string::npos);
}

}  // namespace validation_images_test
}  // namespace
}  // namespace remat::train
