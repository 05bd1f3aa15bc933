// The demo picture dataset (remat/data/demo_images.h): coloured shapes with captions.
#include "remat/data/demo_images.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <system_error>
#include <tuple>

#include "remat/image/image_file.h"
#include "remat/image/png_file.h"
#include "remat/util/error.h"
#include "remat/util/files.h"

namespace remat::data {
namespace fs = std::filesystem;
namespace {

constexpr std::array<const char*, 3> kShapes = {"circle", "square", "triangle"};
struct NamedColour {
  const char* name;
  std::array<uint8_t, 3> rgb;
};
constexpr std::array<NamedColour, 4> kColours = {{{"red", {220, 40, 40}},
                                                  {"green", {40, 170, 60}},
                                                  {"blue", {40, 80, 220}},
                                                  {"yellow", {235, 200, 40}}}};
constexpr std::array<NamedColour, 2> kBackgrounds = {{{"white", {255, 255, 255}}, {"black", {16, 16, 16}}}};
constexpr int64_t kCombinations = kShapes.size() * kColours.size() * kBackgrounds.size();
constexpr int kSubsamples = 4;  // per pixel side: 16 samples smooth the edges enough for a VAE

// splitmix64: a small generator of our own, so the pictures of a seed never change with the
// LibTorch version (its generators make no such promise).
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform(double low, double high) {  // [low, high)
    return low + (high - low) * static_cast<double>(next() >> 11) * 0x1.0p-53;
  }
};

template <size_t N>
const NamedColour& find_colour(const std::array<NamedColour, N>& table, const std::string& name) {
  for (const auto& entry : table) {
    if (name == entry.name) return entry;
  }
  throw_value_error("[make-demo-images] unknown colour '" + name + "'");
}

bool inside(const DemoImage& image, double x, double y) {
  const double dx = x - image.center_x, dy = y - image.center_y, r = image.radius;
  if (image.shape == "circle") return dx * dx + dy * dy <= r * r;
  if (image.shape == "square") return std::abs(dx) <= r && std::abs(dy) <= r;
  // An upright equilateral triangle with circumradius r (y grows downwards): apex (0, -r), base
  // corners (+-sqrt(3)/2 r, r/2). Inside: below both slanted edges and above the base.
  constexpr double kHalfSqrt3 = 0.8660254037844386;
  const double slope = kHalfSqrt3 / 1.5;  // dx per dy along a slanted edge: (sqrt(3)/2 r) / (1.5 r)
  return dy <= 0.5 * r && dy >= -r && std::abs(dx) <= (dy + r) * slope;
}

}  // namespace

std::vector<DemoImage> plan_demo_images(const DemoImagesOptions& options) {
  if (options.count < 1 || options.count > 100000) {
    throw_value_error("[make-demo-images] count must be in [1, 100000], got " + std::to_string(options.count));
  }
  if (options.size < 16 || options.size > 4096) {
    throw_value_error("[make-demo-images] size must be in [16, 4096] pixels, got " + std::to_string(options.size));
  }
  const int64_t side = options.size, long_side = options.size * 3 / 2 / 2 * 2;
  const std::array<std::pair<int64_t, int64_t>, 3> aspects = {{{side, side}, {long_side, side}, {side, long_side}}};
  std::vector<DemoImage> images;
  images.reserve(static_cast<size_t>(options.count));
  for (int64_t i = 0; i < options.count; ++i) {
    DemoImage image;
    char name[32];
    std::snprintf(name, sizeof(name), "image_%04lld", static_cast<long long>(i));
    image.name = name;
    std::tie(image.width, image.height) = aspects[static_cast<size_t>(i % 3)];
    const int64_t combination = (i / 3) % kCombinations;
    image.shape = kShapes[static_cast<size_t>(combination % kShapes.size())];
    image.colour = kColours[static_cast<size_t>(combination / kShapes.size() % kColours.size())].name;
    image.background = kBackgrounds[static_cast<size_t>(combination / (kShapes.size() * kColours.size()))].name;
    SplitMix64 random{options.seed * 0x100000001B3ull + static_cast<uint64_t>(i)};
    random.next();  // decorrelates neighbouring seeds
    const double shorter = static_cast<double>(std::min(image.width, image.height));
    image.radius = shorter * random.uniform(0.22, 0.34);
    // Whole shape inside the picture, 1 px from the border.
    const double margin = image.radius + 1.0;
    image.center_x = random.uniform(margin, static_cast<double>(image.width) - margin);
    image.center_y = random.uniform(margin, static_cast<double>(image.height) - margin);
    image.caption = "a " + image.colour + " " + image.shape + " on a " + image.background + " background";
    images.push_back(std::move(image));
  }
  return images;
}

at::Tensor draw_demo_image(const DemoImage& image) {
  const auto& colour = find_colour(kColours, image.colour).rgb;
  const auto& background = find_colour(kBackgrounds, image.background).rgb;
  auto picture = at::empty({image.height, image.width, 3}, at::kByte);
  auto* pixels = picture.data_ptr<uint8_t>();
  for (int64_t y = 0; y < image.height; ++y) {
    for (int64_t x = 0; x < image.width; ++x) {
      int covered = 0;
      for (int sy = 0; sy < kSubsamples; ++sy) {
        for (int sx = 0; sx < kSubsamples; ++sx) {
          covered += inside(image, static_cast<double>(x) + (sx + 0.5) / kSubsamples,
                            static_cast<double>(y) + (sy + 0.5) / kSubsamples);
        }
      }
      const double alpha = static_cast<double>(covered) / (kSubsamples * kSubsamples);
      for (int c = 0; c < 3; ++c) {
        const double value = alpha * colour[c] + (1.0 - alpha) * background[c];
        pixels[(y * image.width + x) * 3 + c] = static_cast<uint8_t>(std::lround(value));
      }
    }
  }
  return picture;
}

std::vector<DemoImage> write_demo_images(const std::string& dir, const DemoImagesOptions& options) {
  auto images = plan_demo_images(options);  // bad options are refused before anything is written
  std::error_code error;
  fs::create_directories(dir, error);
  if (error || !fs::is_directory(dir)) {
    throw_value_error("[make-demo-images] cannot create the output directory '" + dir + "'" +
                      (error ? ": " + error.message() : std::string(" (a file of that name exists)")));
  }
  for (const auto& entry : fs::directory_iterator(dir)) {
    throw_value_error("[make-demo-images] the output directory '" + dir + "' is not empty (it holds '" +
                      entry.path().filename().string() +
                      "'); earlier files would join the dataset: give a new or empty directory");
  }
  for (const auto& image : images) {
    const fs::path stem = fs::path(dir) / image.name;
    // The caption first: a picture is never in the folder without its caption.
    util::write_file_atomically(stem.string() + ".txt", image.caption + "\n", "make-demo-images");
    image::write_png(stem.string() + ".png", draw_demo_image(image));
  }
  return images;
}

}  // namespace remat::data
