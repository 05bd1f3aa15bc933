// caption_of against SimpleTuner's caption strategies (helpers/prompts.py): the expected captions
// are written out from the rules, not from remat's output.
#include <fstream>

#include <gtest/gtest.h>

#include "remat/data/image_dataset.h"
#include "temp_dir.h"

namespace remat::data {
namespace {
namespace captions_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

ImageDatasetConfig with_strategy(CaptionStrategy strategy) {
  ImageDatasetConfig c;
  c.id = "captions";
  c.caption_strategy = strategy;
  return c;
}

void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string caption(const std::string& image, const ImageDatasetConfig& c, uint64_t variant = 0) {
  std::string problem;
  const auto got = caption_of(image, c, variant, &problem);
  EXPECT_TRUE(got.has_value()) << problem;
  return got.value_or("<none>");
}

TEST(Captions, FilenameUnderscoresBecomeSpacesNothingElse) {
  const auto c = with_strategy(CaptionStrategy::filename);
  EXPECT_EQ(caption("/data/a_red_circle.png", c), "a red circle");
  // Only the last extension goes; dots, dashes, case and double underscores stay as they are.
  EXPECT_EQ(caption("/data/sub/A-Photo.of__cats.JPG", c), "A-Photo.of  cats");
  EXPECT_EQ(caption("relative/blue square.webp", c), "blue square");
}

TEST(Captions, TextfileSingleLineIsKeptAsItIs) {
  testing::TempDir dir;
  write(dir / "cat.txt", "  a cat on a mat ");
  // No newline: used unstripped, as SimpleTuner does.
  EXPECT_EQ(caption(dir / "cat.png", with_strategy(CaptionStrategy::textfile)), "  a cat on a mat ");
}

TEST(Captions, TextfileLinesAreVariantsAndEmptyLinesAreDropped) {
  testing::TempDir dir;
  write(dir / "dog.txt", "first caption\n\nsecond caption\r\nthird caption\n");
  const auto c = with_strategy(CaptionStrategy::textfile);
  // Variants: ["first caption", "second caption", "third caption"]; variant key % 3.
  EXPECT_EQ(caption(dir / "dog.jpeg", c, 0), "first caption");
  EXPECT_EQ(caption(dir / "dog.jpeg", c, 1), "second caption");
  EXPECT_EQ(caption(dir / "dog.jpeg", c, 2), "third caption");
  EXPECT_EQ(caption(dir / "dog.jpeg", c, 5), "third caption");
}

TEST(Captions, TextfileMissingOrEmptyHasNoCaption) {
  testing::TempDir dir;
  const auto c = with_strategy(CaptionStrategy::textfile);
  std::string problem;
  EXPECT_FALSE(caption_of(dir / "missing.png", c, 0, &problem).has_value());
  EXPECT_NE(problem.find("missing.txt"), std::string::npos) << problem;
  write(dir / "empty.txt", "\n\n");
  EXPECT_FALSE(caption_of(dir / "empty.png", c, 0, &problem).has_value());
  EXPECT_NE(problem.find("empty"), std::string::npos) << problem;
}

// A caption the text encoders would refuse (over 16384 bytes, not UTF-8) skips its picture with
// the caption file named, as docs/YOUR_DATA.md says; it stopped the whole run in the encoder before.
TEST(Captions, CaptionsTheEncodersRefuseSkipThePictureNamingTheFile) {
  testing::TempDir dir;
  const auto c = with_strategy(CaptionStrategy::textfile);
  std::string problem;
  write(dir / "long.txt", std::string(20000, 'x'));
  EXPECT_FALSE(caption_of(dir / "long.png", c, 0, &problem).has_value());
  EXPECT_EQ(problem, "caption file " + (dir / "long.txt") + " holds a caption of 20000 bytes; the text encoders take "
                     "at most 16384");
  write(dir / "latin1.txt", "caf\xe9 au lait");
  EXPECT_FALSE(caption_of(dir / "latin1.png", c, 0, &problem).has_value());
  EXPECT_EQ(problem, "caption file " + (dir / "latin1.txt") + " is not valid UTF-8 (byte 3)");
  write(dir / "exact.txt", std::string(16384, 'x'));  // the bound itself is a caption
  EXPECT_EQ(caption(dir / "exact.png", c).size(), 16384u);
}

TEST(Captions, InstancePromptIsStripped) {
  auto c = with_strategy(CaptionStrategy::instanceprompt);
  c.instance_prompt = "  sks dog \n";
  EXPECT_EQ(caption("/data/whatever_name.png", c), "sks dog");
}

TEST(Captions, PrependInstancePromptToEveryVariant) {
  testing::TempDir dir;
  write(dir / "x.txt", "on grass\nin snow\n");
  auto c = with_strategy(CaptionStrategy::textfile);
  c.instance_prompt = "sks dog";
  c.prepend_instance_prompt = true;
  EXPECT_EQ(caption(dir / "x.png", c, 0), "sks dog on grass");
  EXPECT_EQ(caption(dir / "x.png", c, 1), "sks dog in snow");
  auto f = with_strategy(CaptionStrategy::filename);
  f.instance_prompt = "sks dog";
  f.prepend_instance_prompt = true;
  EXPECT_EQ(caption("/d/on_the_beach.png", f), "sks dog on the beach");
}

TEST(Captions, OnlyInstancePromptReplacesEveryCaption) {
  testing::TempDir dir;  // no caption file at all: textfile is not read
  auto c = with_strategy(CaptionStrategy::textfile);
  c.instance_prompt = " sks ";
  c.only_instance_prompt = true;
  EXPECT_EQ(caption(dir / "y.png", c), " sks ");  // as given (SimpleTuner does not strip it here)
  c.prepend_instance_prompt = true;               // only_instance_prompt wins
  EXPECT_EQ(caption(dir / "y.png", c), " sks ");
}

}  // namespace captions_test
}  // namespace
}  // namespace remat::data
