// plan_training_crop against bucket sizes worked out by hand from SimpleTuner's formulas
// (multiaspect/image.py, image_manipulation/training_sample.py; Note [Bucket geometry] in
// src/data/aspect_buckets.cpp). Notation of the comments: m the pixel multiple,
// RM(v) = max(round_half_even(v / m) * m, m), AR(w, h) = round(w / h, 2), int() truncation.
#include <set>

#include <gtest/gtest.h>

#include "remat/data/image_dataset.h"
#include "value_error.h"

namespace remat::data {
namespace {
namespace aspect_buckets_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

ImageDatasetConfig dataset(double resolution, ResolutionType type, bool crop = false,
                           CropAspect aspect = CropAspect::square, CropStyle style = CropStyle::center) {
  ImageDatasetConfig c;
  c.id = "test";
  c.resolution = resolution;
  c.resolution_type = type;
  c.crop = crop;
  c.crop_aspect = aspect;
  c.crop_style = style;
  return c;
}

TrainingCrop expected(int64_t rw, int64_t rh, int64_t left, int64_t top, int64_t w, int64_t h) {
  TrainingCrop c;
  c.resized_width = rw;
  c.resized_height = rh;
  c.crop_left = left;
  c.crop_top = top;
  c.width = w;
  c.height = h;
  return c;
}

std::string show(const TrainingCrop& c) {
  return "resize " + std::to_string(c.resized_width) + "x" + std::to_string(c.resized_height) + ", crop (" +
         std::to_string(c.crop_left) + "," + std::to_string(c.crop_top) + ") " + std::to_string(c.width) + "x" +
         std::to_string(c.height);
}

void expect_plan(int64_t w, int64_t h, const ImageDatasetConfig& config, int64_t multiple, const TrainingCrop& want) {
  const auto got = plan_training_crop(w, h, config, multiple, /*random_key=*/1);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, want) << "got " << show(*got) << ", want " << show(want);
}

// ---- resolution_type pixel_area ----

TEST(AspectBuckets, PixelAreaLandscapeNoCrop) {
  // 256 pixel_area -> 0.065536 MP; edge = RM(int(sqrt(65536))) = 256. AR(320, 240) = 1.33.
  // W = RM(256 * sqrt(1.33) = 295.2) = 288 (18.45 -> 18); H = RM(256 / sqrt(1.33) = 222.0) = 224.
  // Intermediary: W >= H, so height 224 and width int(224 * 320/240) = 298 (covers 288).
  // Center crop: left (298 - 288) // 2 = 5, top 0.
  expect_plan(320, 240, dataset(256, ResolutionType::pixel_area), 16, expected(298, 224, 5, 0, 288, 224));
}

TEST(AspectBuckets, PixelAreaPortraitNoCrop) {
  // AR(240, 320) = 0.75. W = RM(256 * sqrt(0.75) = 221.7) = 224; H = RM(256 / 0.866 = 295.6) = 288.
  // Intermediary: W < H, so width 224 and height int(224 / 0.75) = 298. Center top (298 - 288) // 2 = 5.
  expect_plan(240, 320, dataset(256, ResolutionType::pixel_area), 16, expected(224, 298, 0, 5, 224, 288));
}

TEST(AspectBuckets, PixelAreaPreserveCropEqualsNoCrop) {
  // crop_aspect preserve takes the same calculator path as crop=false: the same numbers as above.
  expect_plan(320, 240, dataset(256, ResolutionType::pixel_area, true, CropAspect::preserve), 16,
              expected(298, 224, 5, 0, 288, 224));
}

TEST(AspectBuckets, PixelAreaSquareCrop) {
  // Square crop: target (256, 256). Intermediary from the calculator at aspect 1.0 (not a square
  // image, so no shortcut): W = H = RM(256) = 256; height 256, width int(256 * 4/3) = 341.
  // Center left (341 - 256) // 2 = 42.
  expect_plan(320, 240, dataset(256, ResolutionType::pixel_area, true, CropAspect::square), 16,
              expected(341, 256, 42, 0, 256, 256));
}

TEST(AspectBuckets, PixelAreaClosestAspect) {
  // AR 1.33; nearest of [1.0, 1.5, 0.5] is 1.5. W = RM(256 * sqrt(1.5) = 313.5) = 320 (19.6 -> 20);
  // H = RM(256 / 1.2247 = 209.0) = 208. Intermediary: height 208, width int(208 * 4/3) = 277 < 320,
  // so both grow: W_diff 43, H_diff int(43 * 3/4) = 32 -> 320 x 240. Center top (240 - 208) // 2 = 16.
  ImageDatasetConfig c = dataset(256, ResolutionType::pixel_area, true, CropAspect::closest);
  c.crop_aspect_buckets = {1.0, 1.5, 0.5};
  expect_plan(320, 240, c, 16, expected(320, 240, 0, 16, 320, 208));
}

TEST(AspectBuckets, FluxMegapixelPhoto) {
  // 1024 pixel_area: edge 1024. AR(1600, 1200) = 1.33. W = RM(1180.9) = 1184 (73.8 -> 74);
  // H = RM(887.9) = 880 (55.495 -> 55). Intermediary: height 880, width int(880 * 4/3) = 1173 < 1184:
  // W_diff 11, H_diff int(11 * 3/4) = 8 -> 1184 x 888. Center top (888 - 880) // 2 = 4.
  expect_plan(1600, 1200, dataset(1024, ResolutionType::pixel_area), 16, expected(1184, 888, 0, 4, 1184, 880));
}

TEST(AspectBuckets, AlignmentSixtyFourAsSimpleTunerForcesForFlux) {
  // SimpleTuner's Flux alignment (64): W = RM(1180.9) = 1152 (18.45 -> 18); H = RM(887.9) = 896
  // (13.87 -> 14). Intermediary: height 896, width int(896 * 4/3) = 1194. Left (1194 - 1152) // 2 = 21.
  expect_plan(1600, 1200, dataset(1024, ResolutionType::pixel_area), 64, expected(1194, 896, 21, 0, 1152, 896));
}

TEST(AspectBuckets, TinyDemoImageIsUpscaledToCoverItsBucket) {
  // 64 pixel_area: edge 64. AR(64, 48) = 1.33. W = RM(73.8) = 80 (4.6 -> 5); H = RM(55.5) = 48.
  // Intermediary: height 48, width int(48 * 4/3) = 64 < 80: W_diff 16, H_diff int(16 * 3/4) = 12 ->
  // 80 x 60. Center top (60 - 48) // 2 = 6.
  expect_plan(64, 48, dataset(64, ResolutionType::pixel_area), 16, expected(80, 60, 0, 6, 80, 48));
}

// ---- resolution_type pixel ----

TEST(AspectBuckets, PixelShorterEdge) {
  // Landscape: H = 256, W = int(256 * 1.33) = 340 -> RM 336 (21.25 -> 21). Intermediary: height
  // max(256, 256) = 256, width int(256 * 4/3) = 341 >= 336. Left (341 - 336) // 2 = 2.
  expect_plan(320, 240, dataset(256, ResolutionType::pixel), 16, expected(341, 256, 2, 0, 336, 256));
}

TEST(AspectBuckets, PixelNearlySquareBecomesTheSquareBucket) {
  // AR(250, 245) = 1.02. H = 128, W = int(128 * 1.02) = 130 -> RM 128. The bucket's AR is 1.0, so
  // the target is the square (128, 128). Intermediary: height 128, width int(128 * 250/245) = 130.
  // Left (130 - 128) // 2 = 1.
  expect_plan(250, 245, dataset(128, ResolutionType::pixel), 16, expected(130, 128, 1, 0, 128, 128));
}

TEST(AspectBuckets, PixelSquareCrop) {
  // Target (256, 256); intermediary at aspect 1.0: H = 256, W = int(256 * 1.0) = 256 -> 256;
  // height 256, width int(256 * 4/3) = 341. Corner crop: (0, 0).
  expect_plan(320, 240, dataset(256, ResolutionType::pixel, true, CropAspect::square, CropStyle::corner), 16,
              expected(341, 256, 0, 0, 256, 256));
}

// ---- resolution_type area ----

TEST(AspectBuckets, AreaMegapixels) {
  // 0.25 MP: edge = RM(int(sqrt(250000)) = 500) = 496 (31.25 -> 31). AR 1.33:
  // W = RM(496 * 1.1533 = 572.0) = 576 (35.75 -> 36); H = RM(430.1) = 432 (26.9 -> 27).
  // Intermediary: height 432, width int(432 * 4/3) = 575 or 576 (float); either way it ends 576
  // (a 1-pixel shortfall grows W by 1 and H by int(1 * 3/4) = 0): 576 x 432, no crop needed.
  expect_plan(640, 480, dataset(0.25, ResolutionType::area), 16, expected(576, 432, 0, 0, 576, 432));
}

TEST(AspectBuckets, AreaSquareCropCoversItsSquare) {
  // 0.25 MP is within 0.05 of the table's 0.25 -> square edge RM(sqrt(512^2)) = 512, but the
  // calculator's intermediary at aspect 1.0 uses 250000 px: edge 496, height 496, width
  // int(496 * 4/3) = 661. SimpleTuner would crop 512 x 512 out of 661 x 496; remat scales the
  // intermediary to cover: height 512, width ceil(661 * 512 / 496) = 683. Left (683 - 512) // 2 = 85.
  expect_plan(640, 480, dataset(0.25, ResolutionType::area, true, CropAspect::square), 16,
              expected(683, 512, 85, 0, 512, 512));
}

// ---- maximum_image_size / target_downsample_size ----

TEST(AspectBuckets, LargeImageIsDownsampledBeforeTheCrop) {
  // 256 pixel_area, crop preserve, maximum 400 (0.16 MP), target_downsample 320 (0.1024 MP).
  // 800 x 600 = 0.48 MP > 0.16: too large. Bucket as for 320 x 240: 288 x 224.
  // Downsample intermediary at 0.1024 MP: edge 320; W = RM(369.0) = 368, H = RM(277.5) = 272;
  // height 272, width int(272 * 4/3) = 362 < 368: W_diff 6, H_diff int(6 * 3/4) = 4 -> 368 x 276.
  // Center crop: left (368 - 288) // 2 = 40, top (276 - 224) // 2 = 26.
  ImageDatasetConfig c = dataset(256, ResolutionType::pixel_area, true, CropAspect::preserve);
  c.maximum_image_size = 400;
  c.target_downsample_size = 320;
  expect_plan(800, 600, c, 16, expected(368, 276, 40, 26, 288, 224));
  // 300 x 225 = 0.0675 MP is not too large: the plain intermediary, int(224 * 4/3) = 298.
  expect_plan(300, 225, c, 16, expected(298, 224, 5, 0, 288, 224));
}

// ---- minimum_image_size ----

TEST(AspectBuckets, MinimumImageSizeSkipsWithTheFigures) {
  ImageDatasetConfig pixel = dataset(256, ResolutionType::pixel);
  pixel.minimum_image_size = 200;
  std::string reason;
  // pixel: both sides must reach 200.
  EXPECT_FALSE(plan_training_crop(320, 199, pixel, 16, 1, &reason).has_value());
  EXPECT_NE(reason.find("320x199"), std::string::npos) << reason;
  EXPECT_NE(reason.find("minimum_image_size"), std::string::npos) << reason;
  EXPECT_TRUE(plan_training_crop(200, 200, pixel, 16, 1).has_value());

  // pixel_area 200 -> 0.04 MP = 40000 px: area only (crop=false).
  ImageDatasetConfig area = dataset(256, ResolutionType::pixel_area);
  area.minimum_image_size = 200;
  EXPECT_FALSE(plan_training_crop(200, 199, area, 16, 1).has_value());  // 39800 px
  EXPECT_TRUE(plan_training_crop(400, 100, area, 16, 1).has_value());   // 40000 px
  // With a square crop, both sides must also reach floor(sqrt(40000)) = 200.
  area.crop = true;
  area.crop_aspect = CropAspect::square;
  EXPECT_FALSE(plan_training_crop(400, 100, area, 16, 1, &reason).has_value());
  EXPECT_NE(reason.find("200 px"), std::string::npos) << reason;
}

// ---- crop styles ----

TEST(AspectBuckets, RandomCropIsInsideAndFollowsTheKey) {
  ImageDatasetConfig c = dataset(256, ResolutionType::pixel_area, true, CropAspect::square, CropStyle::random);
  // Resized 341 x 256, bucket 256 x 256: left in [0, 85], top 0.
  std::set<int64_t> lefts;
  for (uint64_t key = 0; key < 200; ++key) {
    const auto crop = plan_training_crop(320, 240, c, 16, key);
    ASSERT_TRUE(crop.has_value());
    EXPECT_EQ(crop->resized_width, 341);
    EXPECT_EQ(crop->width, 256);
    EXPECT_GE(crop->crop_left, 0);
    EXPECT_LE(crop->crop_left, 85);
    EXPECT_EQ(crop->crop_top, 0);
    EXPECT_EQ(*crop, *plan_training_crop(320, 240, c, 16, key));  // same key, same crop
    lefts.insert(crop->crop_left);
  }
  EXPECT_GT(lefts.size(), 40u);  // spread over the 86 possible offsets
}

TEST(AspectBuckets, EveryBucketIsAWholeMultipleAndInsideTheResizedImage) {
  const std::pair<int64_t, int64_t> sizes[] = {{64, 48}, {48, 64}, {97, 31}, {333, 1000}, {1920, 1080}, {500, 500}};
  for (ResolutionType type : {ResolutionType::pixel, ResolutionType::area, ResolutionType::pixel_area}) {
    const double resolution = type == ResolutionType::area ? 0.1 : 320;
    for (bool crop : {false, true}) {
      for (CropAspect aspect : {CropAspect::square, CropAspect::preserve}) {
        for (CropStyle style : {CropStyle::center, CropStyle::corner, CropStyle::random}) {
          for (const auto& [w, h] : sizes) {
            const auto c = plan_training_crop(w, h, dataset(resolution, type, crop, aspect, style), 16, w * 7 + h);
            ASSERT_TRUE(c.has_value());
            EXPECT_EQ(c->width % 16, 0);
            EXPECT_EQ(c->height % 16, 0);
            EXPECT_LE(c->crop_left + c->width, c->resized_width);
            EXPECT_LE(c->crop_top + c->height, c->resized_height);
          }
        }
      }
    }
  }
}

TEST(AspectBuckets, BadSizesAreErrors) {
  const auto c = dataset(256, ResolutionType::pixel_area);
  EXPECT_NE(testing::error_of([&] { plan_training_crop(0, 10, c, 16, 1); }).find("0x10"), std::string::npos);
  EXPECT_NE(testing::error_of([&] { plan_training_crop(10, 10, c, 0, 1); }).find("pixel multiple"),
            std::string::npos);
}

}  // namespace aspect_buckets_test
}  // namespace
}  // namespace remat::data
