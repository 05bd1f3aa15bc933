// scan_image_dataset on small folders written by the test: what is found, what is skipped and
// why, the per-bucket counts (bucket sizes worked out by hand, as in aspect_buckets_test.cpp).
#include <filesystem>
#include <fstream>
#include <sys/stat.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "remat/data/image_dataset.h"
#include "remat/image/image_file.h"
#include "remat/image/png_file.h"
#include "temp_dir.h"
#include "value_error.h"

namespace remat::data {
namespace {
namespace image_scan_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

namespace fs = std::filesystem;

void picture(const std::string& path, int64_t width, int64_t height) {
  fs::create_directories(fs::path(path).parent_path());
  image::write_png(path, at::full({height, width, 3}, 128, at::kByte));
}

void text(const std::string& path, const std::string& content) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << content;
}

ImageDatasetConfig folder(const testing::TempDir& dir) {
  ImageDatasetConfig c;
  c.id = "scan";
  c.instance_data_dir = dir.str();
  c.resolution = 64;
  c.resolution_type = ResolutionType::pixel_area;
  return c;
}

bool skipped_with(const ScannedDataset& s, const std::string& file, const std::string& reason) {
  for (const auto& p : s.skipped) {
    if (p.path.size() >= file.size() && p.path.compare(p.path.size() - file.size(), file.size(), file) == 0 &&
        p.reason.find(reason) != std::string::npos) {
      return true;
    }
  }
  return false;
}

TEST(ImageScan, FindsPicturesRecursivelySortedWithCaptionsAndBuckets) {
  testing::TempDir dir;
  picture(dir / "b_blue_square.png", 64, 48);
  picture(dir / "a_red_circle.png", 64, 48);
  picture(dir / "sub/c_green_line.PNG", 48, 64);
  text(dir / "notes.md", "not a picture");
  const ScannedDataset s = scan_image_dataset(folder(dir), 7, 16);
  ASSERT_EQ(s.images.size(), 3u);
  EXPECT_EQ(s.images[0].relative_path, "a_red_circle.png");
  EXPECT_EQ(s.images[1].relative_path, "b_blue_square.png");
  EXPECT_EQ(s.images[2].relative_path, "sub/c_green_line.PNG");
  EXPECT_EQ(s.images[0].caption, "a red circle");
  EXPECT_EQ(s.images[2].caption, "c green line");
  EXPECT_EQ(s.images[0].width, 64);
  EXPECT_EQ(s.images[0].height, 48);
  EXPECT_TRUE(s.skipped.empty());
  // 64 x 48 at 64 pixel_area, m 16: bucket 80 x 48 (aspect_buckets_test: TinyDemoImage...); the
  // portrait 48 x 64 mirrors it: 48 x 80.
  const auto counts = s.bucket_counts();
  const std::map<std::pair<int64_t, int64_t>, int64_t> want = {{{80, 48}, 2}, {{48, 80}, 1}};
  EXPECT_EQ(counts, want);
  // The file's own size and modification time.
  struct stat st {};
  ASSERT_EQ(::stat(s.images[0].path.c_str(), &st), 0);
  EXPECT_EQ(s.images[0].file_size, st.st_size);
  EXPECT_EQ(s.images[0].mtime_ns, int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec);
}

TEST(ImageScan, SmallCorruptAndEmptyPicturesAreSkippedWithReasons) {
  testing::TempDir dir;
  picture(dir / "big.png", 64, 64);
  picture(dir / "small.png", 30, 30);
  text(dir / "corrupt.png", "this is not a PNG file at all");
  text(dir / "empty.webp", "");
  auto c = folder(dir);
  c.minimum_image_size = 32;  // pixel_area: 32^2 = 1024 px
  const ScannedDataset s = scan_image_dataset(c, 1, 16);
  ASSERT_EQ(s.images.size(), 1u);
  EXPECT_EQ(s.images[0].relative_path, "big.png");
  EXPECT_EQ(s.skipped.size(), 3u);
  EXPECT_TRUE(skipped_with(s, "small.png", "below minimum_image_size: 30x30"));
  EXPECT_TRUE(skipped_with(s, "corrupt.png", "unreadable image"));
  EXPECT_TRUE(skipped_with(s, "empty.webp", "empty"));
}

TEST(ImageScan, TextfileCaptionsAndStrayCaptionFiles) {
  testing::TempDir dir;
  picture(dir / "one.png", 64, 64);
  text(dir / "one.txt", "a grey square\n");
  picture(dir / "two.png", 64, 64);  // no caption file
  text(dir / "orphan.txt", "no picture has this name");
  auto c = folder(dir);
  c.caption_strategy = CaptionStrategy::textfile;
  const ScannedDataset s = scan_image_dataset(c, 1, 16);
  ASSERT_EQ(s.images.size(), 1u);
  EXPECT_EQ(s.images[0].caption, "a grey square");
  EXPECT_TRUE(skipped_with(s, "two.png", "two.txt"));
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_NE(s.warnings[0].path.find("orphan.txt"), std::string::npos);
}

TEST(ImageScan, RandomCropsFollowTheSeed) {
  testing::TempDir dir;
  for (int i = 0; i < 12; ++i) picture(dir / ("p" + std::to_string(i) + ".png"), 200, 64);
  auto c = folder(dir);
  c.crop = true;
  c.crop_style = CropStyle::random;
  const auto lefts = [&](uint64_t seed) {
    std::vector<int64_t> out;
    for (const auto& image : scan_image_dataset(c, seed, 16).images) out.push_back(image.crop.crop_left);
    return out;
  };
  EXPECT_EQ(lefts(3), lefts(3));
  EXPECT_NE(lefts(3), lefts(4));
}

TEST(ImageScan, MissingFolderIsAnError) {
  testing::TempDir dir;
  auto c = folder(dir);
  c.instance_data_dir = dir / "absent";
  EXPECT_NE(testing::error_of([&] { scan_image_dataset(c, 1, 16); }).find("does not exist"), std::string::npos);
  text(dir / "file", "x");
  c.instance_data_dir = dir / "file";
  EXPECT_NE(testing::error_of([&] { scan_image_dataset(c, 1, 16); }).find("not a directory"), std::string::npos);
}

// The caches index pictures by name in JSON, which holds only UTF-8: a picture whose name is not
// UTF-8 is skipped, named with \xHH escapes; a folder whose name is not is refused (both ended in
// nlohmann::json's type_error 316, exit 1, before).
TEST(ImageScan, NamesThatAreNotUtf8) {
  testing::TempDir dir;
  picture(dir / "good.png", 64, 64);
  picture(dir / "bad\xff.png", 64, 64);
  const ScannedDataset s = scan_image_dataset(folder(dir), 1, 16);
  ASSERT_EQ(s.images.size(), 1u);
  EXPECT_EQ(s.images[0].relative_path, "good.png");
  EXPECT_TRUE(skipped_with(s, "bad\\xFF.png", "the file name is not valid UTF-8"));
  testing::TempDir parent;
  auto c = folder(parent);
  c.instance_data_dir = parent / "pictures\xfe";
  picture(c.instance_data_dir + "/a.png", 64, 64);
  EXPECT_EQ(testing::error_text([&] { scan_image_dataset(c, 1, 16); }),
            "[data] dataset 'scan': instance_data_dir '" + (parent / "pictures\\xFE") +
                "' is not valid UTF-8 (byte " + std::to_string(parent.str().size() + 9) +
                "); the caches index pictures by name in JSON: rename the folder");
}

TEST(ImageScan, ImageFileNames) {
  for (const char* name : {"a.png", "a.PNG", "dir/b.jpg", "c.JPEG", "d.webp", "e.WebP"}) {
    EXPECT_TRUE(is_image_file_name(name)) << name;
  }
  for (const char* name : {"a.txt", "png", "a.png.txt", "a.gif", "dir.png/file", ".png/x"}) {
    EXPECT_FALSE(is_image_file_name(name)) << name;
  }
}

}  // namespace image_scan_test
}  // namespace
}  // namespace remat::data
