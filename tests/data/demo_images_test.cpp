// The demo picture dataset: what each picture shows matches its caption, measured on the pixels
// (area and centre of the shape against the geometry, colours by their dominant channel), and
// the files on disk.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "remat/data/demo_images.h"
#include "remat/image/image_file.h"
#include "temp_dir.h"
#include "value_error.h"

namespace remat::data {
namespace {
namespace demo_images_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

namespace fs = std::filesystem;
using testing::error_text;
using testing::TempDir;

constexpr double kPi = 3.14159265358979323846;

// The shape's coverage of each pixel, recovered from the colours: the pixel is a mix
// alpha * shape + (1 - alpha) * background, so alpha is the projection onto (shape - background).
at::Tensor coverage(const at::Tensor& picture) {
  const auto p = picture.to(at::kDouble);
  const auto corner = p[0][0];  // the shapes never touch the corners (1 px margin, round shapes)
  // The shape's colour: the pixel farthest from the background.
  const auto distance = (p - corner).pow(2).sum(-1);
  const auto flat = distance.flatten().argmax().item<int64_t>();
  const auto shape = p.view({-1, 3})[flat];
  const auto direction = shape - corner;
  return ((p - corner) * direction).sum(-1) / direction.pow(2).sum();
}

double expected_area(const DemoImage& image) {
  const double r = image.radius;
  if (image.shape == "circle") return kPi * r * r;
  if (image.shape == "square") return 4 * r * r;
  return 3 * std::sqrt(3.0) / 4 * r * r;  // equilateral triangle with circumradius r
}

TEST(DemoImages, EveryCombinationInEveryAspectRatio) {
  const auto images = plan_demo_images({});
  ASSERT_EQ(images.size(), 72u);
  std::map<std::pair<int64_t, int64_t>, std::set<std::string>> seen;
  for (const auto& image : images) {
    seen[{image.width, image.height}].insert(image.shape + "/" + image.colour + "/" + image.background);
  }
  // 64: square 64 x 64, landscape 96 x 64, portrait 64 x 96; 3 shapes x 4 colours x 2 backgrounds.
  ASSERT_EQ(seen.size(), 3u);
  for (const auto& size : {std::pair<int64_t, int64_t>{64, 64}, {96, 64}, {64, 96}}) {
    EXPECT_EQ(seen[size].size(), 24u) << size.first << "x" << size.second;
  }
}

TEST(DemoImages, CaptionDescribesThePicture) {
  for (const auto& image : plan_demo_images({12, 48, 3})) {
    EXPECT_EQ(image.caption, "a " + image.colour + " " + image.shape + " on a " + image.background + " background");
    const auto picture = draw_demo_image(image);
    ASSERT_EQ(picture.sizes(), (at::IntArrayRef{image.height, image.width, 3}));
    const auto at = [&](double x, double y) {
      return picture[static_cast<int64_t>(y)][static_cast<int64_t>(x)].to(at::kInt);
    };
    // The background, in a corner.
    const auto corner = at(0, 0);
    for (int c = 0; c < 3; ++c) {
      if (image.background == "white") EXPECT_GT(corner[c].item<int>(), 240);
      else EXPECT_LT(corner[c].item<int>(), 32);
    }
    // The shape's colour, at its centre, by its dominant channels.
    const auto centre = at(image.center_x, image.center_y);
    const int r = centre[0].item<int>(), g = centre[1].item<int>(), b = centre[2].item<int>();
    if (image.colour == "red") {
      EXPECT_TRUE(r > g + 100 && r > b + 100) << image.name;
    }
    if (image.colour == "green") {
      EXPECT_TRUE(g > r + 100 && g > b + 100) << image.name;
    }
    if (image.colour == "blue") {
      EXPECT_TRUE(b > r + 100 && b > g + 100) << image.name;
    }
    if (image.colour == "yellow") {
      EXPECT_TRUE(r > b + 100 && g > b + 100) << image.name;
    }
  }
}

TEST(DemoImages, ShapeAreaAndCentreMatchTheGeometry) {
  for (const auto& image : plan_demo_images({9, 64, 5})) {
    const auto alpha = coverage(draw_demo_image(image));
    const double area = alpha.sum().item<double>();
    EXPECT_NEAR(area / expected_area(image), 1.0, 0.02) << image.name << " " << image.shape;
    // The centroid of a circle, a square and an equilateral triangle is its centre (within the
    // quarter-pixel steps of the 4 x 4 samples at the edges).
    const auto ys = at::arange(image.height, at::kDouble).unsqueeze(1) + 0.5;
    const auto xs = at::arange(image.width, at::kDouble).unsqueeze(0) + 0.5;
    EXPECT_NEAR((alpha * xs).sum().item<double>() / area, image.center_x, 0.2) << image.name;
    EXPECT_NEAR((alpha * ys).sum().item<double>() / area, image.center_y, 0.2) << image.name;
    // Wholly inside the picture.
    EXPECT_GE(image.center_x - image.radius, 0.0);
    EXPECT_LE(image.center_x + image.radius, static_cast<double>(image.width));
  }
}

TEST(DemoImages, SameSeedSamePicturesOtherSeedOtherPlaces) {
  const auto a = plan_demo_images({6, 32, 7}), b = plan_demo_images({6, 32, 7}), c = plan_demo_images({6, 32, 8});
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].center_x, b[i].center_x);
    EXPECT_EQ(a[i].radius, b[i].radius);
    EXPECT_TRUE(at::equal(draw_demo_image(a[i]), draw_demo_image(b[i])));
    EXPECT_NE(a[i].center_x, c[i].center_x);
    EXPECT_EQ(a[i].caption, c[i].caption);  // the seed moves shapes, not what they are
  }
}

TEST(DemoImages, WritesPicturesAndCaptions) {
  TempDir dir;
  const std::string out = dir / "images";
  const auto images = write_demo_images(out, {5, 32, 1});
  std::set<std::string> files;
  for (const auto& entry : fs::directory_iterator(out)) files.insert(entry.path().filename().string());
  EXPECT_EQ(files.size(), 10u);  // nothing else: no temporary files left behind
  for (const auto& image : images) {
    const auto picture = image::read_image(out + "/" + image.name + ".png");
    EXPECT_TRUE(at::equal(picture, draw_demo_image(image))) << image.name;
    std::ifstream caption(out + "/" + image.name + ".txt");
    std::stringstream text;
    text << caption.rdbuf();
    EXPECT_EQ(text.str(), image.caption + "\n");
  }
}

TEST(DemoImages, RefusesANonEmptyDirectoryAndBadSizes) {
  TempDir dir;
  std::ofstream(dir / "keep.png") << "x";
  EXPECT_EQ(error_text([&] { write_demo_images(dir.str(), {}); }),
            "[make-demo-images] the output directory '" + dir.str() +
                "' is not empty (it holds 'keep.png'); earlier files would join the dataset: give a new or empty "
                "directory");
  EXPECT_EQ(error_text([&] { plan_demo_images({0, 64, 0}); }),
            "[make-demo-images] count must be in [1, 100000], got 0");
  EXPECT_EQ(error_text([&] { plan_demo_images({1, 8, 0}); }),
            "[make-demo-images] size must be in [16, 4096] pixels, got 8");
  EXPECT_FALSE(fs::exists(dir / "image_0000.png"));
}

}  // namespace demo_images_test
}  // namespace
}  // namespace remat::data
