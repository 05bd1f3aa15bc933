#pragma once
/// \file
/// A small picture dataset with learnable structure (`remat make-demo-images`): coloured shapes
/// (circle, square, triangle in red, green, blue or yellow) on a white or black background, each
/// with a caption that describes it ("a red circle on a white background") in IMAGE.txt beside
/// IMAGE.png, the layout of a SimpleTuner dataset with caption_strategy "textfile". Pictures come
/// in three aspect ratios (square, 3:2 landscape, 2:3 portrait) so that aspect buckets are
/// exercised. Everything is a function of the seed (remat's own generator, not LibTorch's).

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "remat/export.h"

namespace remat::data {

struct DemoImagesOptions {
  int64_t count = 72;  ///< pictures; 72 = every shape, colour and background in every aspect ratio
  /// The square pictures' side in pixels; landscape pictures are size * 3/2 x size, portrait
  /// ones size x size * 3/2 (rounded down to even).
  int64_t size = 64;
  uint64_t seed = 0;
};

/// One picture of the dataset: what it shows and where.
struct DemoImage {
  std::string name;     ///< file stem: "image_0007" (IMAGE.png and IMAGE.txt)
  int64_t width = 0;
  int64_t height = 0;
  std::string shape;       ///< "circle", "square" or "triangle"
  std::string colour;      ///< "red", "green", "blue" or "yellow"
  std::string background;  ///< "white" or "black"
  double center_x = 0;     ///< the shape's centre, in pixels from the top left corner
  double center_y = 0;
  double radius = 0;       ///< circle radius; half the square's side; the triangle's circumradius
  std::string caption;     ///< "a red circle on a white background"
};

/// The dataset's pictures for `options`, in order (no pixels). Picture i shows combination i / 3
/// of (shape, colour, background), cycling through the 24 combinations, in aspect ratio i % 3, so
/// every combination appears in every aspect ratio; its position and size are drawn from the
/// seed. Throws c10::ValueError for count outside [1, 100000] or size outside [16, 4096].
REMAT_API std::vector<DemoImage> plan_demo_images(const DemoImagesOptions& options);

/// The pixels of `image`: uint8 [height, width, 3], the shape's edge antialiased (4 x 4
/// samples per pixel, averaged).
REMAT_API at::Tensor draw_demo_image(const DemoImage& image);

/// Writes every picture of plan_demo_images(options) to `dir` as NAME.png and its caption as
/// NAME.txt (one line), each file atomically. `dir` is created if missing; it must be empty
/// otherwise (earlier pictures would silently join the dataset): c10::ValueError naming the
/// directory and a file in it. Returns the pictures written.
REMAT_API std::vector<DemoImage> write_demo_images(const std::string& dir, const DemoImagesOptions& options);

}  // namespace remat::data
