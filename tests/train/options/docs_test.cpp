// The committed docs follow the registry: docs/OPTIONS.md is exactly `remat options --markdown`,
// and every translation of the checkpointing section covers every checkpointing option.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "remat/train/options/options.h"
#include "remat/train/options/simpletuner.h"
#include "test_paths.h"

namespace remat::train {
namespace {
namespace docs_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

std::optional<std::string> read_doc(const std::string& relative) {
  std::ifstream in(remat::testing::source_dir() + "/" + relative, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Docs, OptionsMdIsTheGeneratedText) {
  const auto committed = read_doc("docs/OPTIONS.md");
  ASSERT_TRUE(committed.has_value()) << "docs/OPTIONS.md is missing";
  const std::string generated = options_markdown();
  if (*committed != generated) {
    size_t i = 0;
    while (i < committed->size() && i < generated.size() && (*committed)[i] == generated[i]) ++i;
    FAIL() << "docs/OPTIONS.md differs from the registry at byte " << i
           << "; regenerate it: ./build/apps/remat/remat options --markdown > docs/OPTIONS.md\n"
           << "committed: ..." << committed->substr(i, 80) << "\ngenerated: ..." << generated.substr(i, 80);
  }
}

TEST(Docs, EveryOptionHasItsAnchorHeading) {
  const std::string md = options_markdown();
  for (const auto& s : option_specs()) {
    EXPECT_NE(md.find("\n### `--" + s.name + "`\n"), std::string::npos) << s.name;
  }
}

TEST(Docs, TranslationsCoverEveryCheckpointingOption) {
  for (const char* lang : {"zh", "ja", "es", "pt-BR", "hi"}) {
    const std::string file = std::string("docs/OPTIONS.") + lang + ".md";
    const auto text = read_doc(file);
    ASSERT_TRUE(text.has_value()) << file << " is missing";
    for (const auto& s : option_specs()) {
      if (!s.checkpointing) continue;
      EXPECT_NE(text->find("### `--" + s.name + "`"), std::string::npos) << file << " lacks " << s.name;
    }
    EXPECT_NE(text->find("OPTIONS.md"), std::string::npos) << file << " should link the English reference";
  }
}

// The translations carry what the English help carries for the checkpointing options: a label
// for every backend choice and the config.env names.
TEST(Docs, TranslationsLabelEveryCheckpointingChoice) {
  for (const char* lang : {"zh", "ja", "es", "pt-BR", "hi"}) {
    const std::string file = std::string("docs/OPTIONS.") + lang + ".md";
    const auto text = read_doc(file);
    ASSERT_TRUE(text.has_value()) << file;
    for (const auto& s : option_specs()) {
      if (!s.checkpointing) continue;
      for (const auto& [choice, label] : s.choice_labels) {
        EXPECT_NE(text->find("\n  - `" + choice + "`"), std::string::npos) << file << " lacks a label for " << choice;
      }
      if (const auto env = simpletuner_env_name_of(s.name)) {
        EXPECT_NE(text->find("`" + *env + "`"), std::string::npos) << file << " lacks " << *env;
      }
    }
  }
}

TEST(Docs, SegmentedCheckpointingGuideExists) {
  const auto text = read_doc("docs/SEGMENTED_CHECKPOINTING.md");
  ASSERT_TRUE(text.has_value());
  for (const char* topic : {"gradient_checkpointing_interval", "gradient_checkpointing_segment_stride",
                            "unsloth", "torch-ffn", "auto", "## Measured figures"}) {
    EXPECT_NE(text->find(topic), std::string::npos) << topic;
  }
}

}  // namespace docs_test
}  // namespace
}  // namespace remat::train
