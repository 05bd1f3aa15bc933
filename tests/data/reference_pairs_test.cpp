// pair_references on small folders written by the test: FLUX.1 Kontext's edit pictures paired with
// their references by relative path; a strict reference takes its edit's resize and crop box, a
// loose one the crop its own dataset's settings give it (plan_training_crop, computed here
// independently); an edit without a usable reference is skipped with the reason.
#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "remat/data/image_dataset.h"
#include "remat/image/png_file.h"
#include "temp_dir.h"

namespace remat::data {
namespace {
namespace reference_pairs_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

namespace fs = std::filesystem;

void picture(const std::string& path, int64_t width, int64_t height) {
  fs::create_directories(fs::path(path).parent_path());
  image::write_png(path, at::full({height, width, 3}, 90, at::kByte));
}

ImageDatasetConfig dataset(const std::string& id, const std::string& dir, double resolution) {
  ImageDatasetConfig c;
  c.id = id;
  c.instance_data_dir = dir;
  c.resolution = resolution;
  c.resolution_type = ResolutionType::pixel;
  c.crop = true;
  c.crop_style = CropStyle::center;
  c.crop_aspect = CropAspect::square;
  return c;
}

class ReferencePairs : public ::testing::Test {
 protected:
  void SetUp() override {
    picture(dir_ / "edits/a.png", 64, 32);
    picture(dir_ / "edits/sub/b.png", 48, 48);
    picture(dir_ / "edits/c.png", 32, 32);      // no reference
    picture(dir_ / "edits/d.png", 32, 32);      // its reference is not a picture
    picture(dir_ / "refs/a.png", 40, 80);       // another size and aspect than its edit
    picture(dir_ / "refs/sub/b.png", 48, 48);
    picture(dir_ / "refs/extra.png", 32, 32);   // no edit uses it
    fs::create_directories(dir_ / "refs");
    std::ofstream(dir_ / "refs/d.png") << "not a png";
  }
  ScannedDataset edits() const { return scan_image_dataset(dataset("edits", dir_ / "edits", 32), 5, 16); }
  testing::TempDir dir_;
};

bool skipped(const ScannedDataset& s, const std::string& suffix, const std::string& reason) {
  for (const auto& p : s.skipped) {
    if (p.path.size() >= suffix.size() && p.path.compare(p.path.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        p.reason.find(reason) != std::string::npos) {
      return true;
    }
  }
  return false;
}

TEST_F(ReferencePairs, StrictReferencesTakeTheirEditsCrop) {
  ScannedDataset e = edits();
  ImageDatasetConfig refs = dataset("refs", dir_ / "refs", 64);
  refs.conditioning_type = kReferenceStrict;
  pair_references(e, refs, 5, 16);
  ASSERT_TRUE(e.references.has_value());
  EXPECT_EQ(e.references->config.id, "refs");
  ASSERT_EQ(e.images.size(), 2u);
  ASSERT_EQ(e.references->images.size(), 2u);
  for (size_t i = 0; i < e.images.size(); ++i) {
    const ImageRecord& edit = e.images[i];
    const ImageRecord& reference = e.references->images[i];
    EXPECT_EQ(reference.relative_path, edit.relative_path);
    EXPECT_EQ(reference.path, (fs::path(dir_ / "refs") / edit.relative_path).string());
    EXPECT_TRUE(reference.crop == edit.crop) << edit.relative_path;
    EXPECT_TRUE(reference.caption.empty());
  }
  EXPECT_EQ(e.images[0].relative_path, "a.png");
  EXPECT_EQ(e.references->images[0].width, 40);  // its own size: resized to the edit's 64 x 32 resize
  EXPECT_EQ(e.references->images[0].height, 80);
  EXPECT_TRUE(skipped(e, "edits/c.png", "no reference picture"));
  EXPECT_TRUE(skipped(e, "edits/d.png", "reference picture unusable"));
  ASSERT_FALSE(e.warnings.empty());
  EXPECT_NE(e.warnings.back().reason.find("1 reference picture(s)"), std::string::npos);
}

TEST_F(ReferencePairs, LooseReferencesAreCroppedByTheirOwnDataset) {
  ScannedDataset e = edits();
  ImageDatasetConfig refs = dataset("refs", dir_ / "refs", 64);
  refs.conditioning_type = kReferenceLoose;
  pair_references(e, refs, 5, 16);
  ASSERT_EQ(e.images.size(), 2u);
  for (size_t i = 0; i < e.images.size(); ++i) {
    const ImageRecord& reference = e.references->images[i];
    const auto own = plan_training_crop(reference.width, reference.height, refs, 16, 0);
    ASSERT_TRUE(own.has_value());
    EXPECT_TRUE(reference.crop == *own) << reference.relative_path;
  }
  // 40 x 80 at a 64 px shorter edge, square centre crop: 64 x 64, unlike its edit's 32 x 32.
  EXPECT_EQ(e.references->images[0].crop.width, 64);
  EXPECT_EQ(e.images[0].crop.width, 32);
}

}  // namespace reference_pairs_test
}  // namespace
}  // namespace remat::data
