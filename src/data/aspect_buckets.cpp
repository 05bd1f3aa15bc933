// SimpleTuner's aspect-bucket geometry (helpers/multiaspect/image.py: MultiaspectImage's
// calculators; helpers/image_manipulation/training_sample.py: TrainingSample.calculate_target_size,
// _calculate_target_downsample_size; cropping.py: the crop offsets), re-derived for one upright
// image from its size alone. Same formulas, same Python rounding (round half to even; int()
// truncation; aspect ratios rounded to 2 decimals as Python's round(x, 2) does on the double).
//
// Note [Bucket geometry]
// - resolution_type pixel_area is first turned into area: resolution R becomes R^2 / 1e6
//   megapixels; minimum/maximum_image_size and target_downsample_size likewise (factory.py).
// - The square edge `pr`: pixel -> resolution; area -> RM(sqrt(A)) where A is 512^2, 768^2,
//   1024^2, 1536^2 or 2048^2 when the megapixels are within 0.05 of 0.25, 0.5, 1, 2 or 4, else
//   megapixels x 1e6. RM(v) = max(round_half_even(v / m) * m, m), m the pixel multiple.
// - Each image gets a target (the bucket: the crop size) and an intermediary (the size it is
//   resized to before the crop; it keeps the image's own aspect and covers the target):
//   crop + square: target (pr, pr), intermediary from the calculator at aspect 1.0;
//   otherwise: the calculator at aspect a = AR(W, H) (crop_aspect closest: the listed aspect
//   nearest a). Then a = AR(target); a == 1.0 makes the target (pr, pr), and an intermediary
//   narrower than pr becomes (pr, pr).
// - crop + maximum_image_size + target_downsample_size: an image larger than maximum_image_size
//   is resized to the calculator's intermediary for target_downsample_size instead (scaled up
//   if needed to cover the target), then cropped.
// - The crop: center ((iw - tw) // 2, (ih - th) // 2), corner (0, 0), random a uniform offset.
//   crop=false makes the same resize and crop (SimpleTuner's resize() crops to the target with
//   the backend's crop_style too).
//
// remat's deviations, each because the latent grid must be whole:
// - m is the caller's pixel multiple (16 for Flux: VAE factor 8 x 2x2 packing). SimpleTuner forces
//   64 for Flux (its --aspect_bucket_alignment); 16 keeps small images (demo data) from collapsing
//   into 64-pixel buckets and still gives whole packed latents.
// - With resolution_type pixel, SimpleTuner's square edge is int(resolution), not a multiple of
//   the alignment (its UI asks for multiples of 64); remat rounds it with RM.
// - When the intermediary is smaller than the target on a side (int() truncation; or area
//   resolutions near 0.25/0.5/1/2/4 megapixels with a square crop, whose square edge comes from
//   the rounded table but whose intermediary does not), SimpleTuner crops a picture smaller than
//   its bucket; remat scales the intermediary up, keeping its aspect, until it covers the target.
// - The random crop offset comes from a hash of (seed, image path), so a cache entry is the same
//   picture on every run (SimpleTuner fixes it once in its metadata file).
#include "remat/data/image_dataset.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "remat/util/error.h"

namespace remat::data {
namespace {

using Size = std::pair<int64_t, int64_t>;  // (width, height)

// Python's round(x, 2) on a double: the correctly rounded 2-decimal value of the double's exact
// binary value (glibc's printf rounds that way too), read back as a double.
double round2(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", x);
  return std::strtod(buf, nullptr);
}

double aspect_of(double w, double h) { return round2(w / h); }

// Python's int() on a positive double: truncation.
int64_t py_int(double v) { return static_cast<int64_t>(v); }

// SimpleTuner's _round_to_nearest_multiple: round(v / m) * m (half to even), at least m.
int64_t round_to_multiple(double v, int64_t m) {
  const int64_t r = static_cast<int64_t>(std::nearbyint(v / static_cast<double>(m))) * m;
  return r > m ? r : m;
}

struct Geometry {
  Size target;
  Size intermediary;
  double aspect;
};

// MultiaspectImage.calculate_new_size_by_pixel_edge.
Geometry by_pixel_edge(double aspect, double resolution, Size original, int64_t m) {
  const auto [w, h] = original;
  double w_target, h_target;
  if (w < h) {
    w_target = resolution;
    h_target = static_cast<double>(py_int(w_target / aspect));
  } else {
    h_target = resolution;
    w_target = static_cast<double>(py_int(h_target * aspect));
  }
  const int64_t w_adj = round_to_multiple(w_target, m);
  const int64_t h_adj = round_to_multiple(h_target, m);
  const double raw = static_cast<double>(w) / static_cast<double>(h);
  double w_i, h_i;
  if (raw >= 1.0) {
    h_i = std::max(static_cast<double>(h_adj), h_target);
    w_i = static_cast<double>(py_int(h_i * raw));
    if (w_i < static_cast<double>(w_adj)) {
      w_i = static_cast<double>(w_adj);
      h_i = static_cast<double>(py_int(w_i / raw));
    }
  } else {
    w_i = std::max(static_cast<double>(w_adj), w_target);
    h_i = static_cast<double>(py_int(w_i / raw));
    if (h_i < static_cast<double>(h_adj)) {
      h_i = static_cast<double>(h_adj);
      w_i = static_cast<double>(py_int(h_i * raw));
    }
  }
  return {{w_adj, h_adj}, {py_int(w_i), py_int(h_i)}, aspect_of(w_adj, h_adj)};
}

// MultiaspectImage.calculate_new_size_by_pixel_area (its per-aspect memo returns what this
// formula gives for the same aspect, so it is not needed here).
Geometry by_area(double aspect, double megapixels, Size original, int64_t m) {
  const auto [w, h] = original;
  const int64_t edge = round_to_multiple(static_cast<double>(py_int(std::sqrt(megapixels * 1e6))), m);
  if (aspect == 1.0 && w == h) return {{edge, edge}, {edge, edge}, aspect};
  const int64_t w_t = round_to_multiple(static_cast<double>(edge) * std::sqrt(aspect), m);
  const int64_t h_t = round_to_multiple(static_cast<double>(edge) / std::sqrt(aspect), m);
  const double raw = static_cast<double>(w) / static_cast<double>(h);
  int64_t w_i, h_i;
  if (w_t < h_t) {
    w_i = w_t;
    h_i = py_int(static_cast<double>(w_i) / raw);
  } else {
    h_i = h_t;
    w_i = py_int(static_cast<double>(h_i) * raw);
  }
  if (w_t > w_i || h_t > h_i) {
    int64_t w_d, h_d;
    if (w_t > w_i) {
      w_d = w_t - w_i;
      h_d = py_int(static_cast<double>(w_d) / raw);
    } else {
      h_d = h_t - h_i;
      w_d = py_int(static_cast<double>(h_d) * raw);
    }
    w_i += w_d;
    h_i += h_d;
  }
  return {{w_t, h_t}, {w_i, h_i}, aspect_of(w_t, h_t)};
}

// The backend's sizes in the calculators' units: pixel stays pixel; pixel_area becomes area.
struct Units {
  bool pixel = false;
  double resolution = 0;
  std::optional<double> minimum, maximum, downsample;
};

std::optional<double> squared_mp(std::optional<double> v) {
  if (!v || *v <= 0) return v;
  return *v * *v / 1e6;
}

Units units_of(const ImageDatasetConfig& c) {
  Units u;
  u.pixel = c.resolution_type == ResolutionType::pixel;
  if (c.resolution_type == ResolutionType::pixel_area) {
    u.resolution = c.resolution * c.resolution / 1e6;
    u.minimum = squared_mp(c.minimum_image_size);
    u.maximum = squared_mp(c.maximum_image_size);
    u.downsample = squared_mp(c.target_downsample_size);
  } else {
    u.resolution = c.resolution;
    u.minimum = c.minimum_image_size;
    u.maximum = c.maximum_image_size;
    u.downsample = c.target_downsample_size;
  }
  return u;
}

Geometry calculate(const Units& u, double aspect, double resolution, Size original, int64_t m) {
  return u.pixel ? by_pixel_edge(aspect, resolution, original, m) : by_area(aspect, resolution, original, m);
}

// TrainingSample._set_resolution: the square bucket's edge.
int64_t square_edge(const Units& u, int64_t m) {
  if (u.pixel) return round_to_multiple(static_cast<double>(py_int(u.resolution)), m);
  static const std::pair<double, double> kKnown[] = {
      {0.25, 512.0 * 512}, {0.5, 768.0 * 768}, {1.0, 1024.0 * 1024}, {2.0, 1536.0 * 1536}, {4.0, 2048.0 * 2048}};
  double area = u.resolution * 1e6;
  for (const auto& [mp, pixels] : kKnown) {
    if (std::abs(u.resolution - mp) < 0.05) {
      area = pixels;
      break;
    }
  }
  return round_to_multiple(std::sqrt(area), m);
}

// metadata/backends/base.py meets_resolution_requirements, on the original size.
bool meets_minimum(const ImageDatasetConfig& c, const Units& u, Size original, std::string* reason) {
  if (!u.minimum || *u.minimum <= 0) return true;
  const auto [w, h] = original;
  const std::string size = std::to_string(w) + "x" + std::to_string(h);
  char figure[64];
  std::snprintf(figure, sizeof figure, "%g", *c.minimum_image_size);
  if (u.pixel) {
    if (w >= *u.minimum && h >= *u.minimum) return true;
    if (reason) *reason = "below minimum_image_size: " + size + " has a side under " + figure + " px";
    return false;
  }
  const double min_pixels = *u.minimum * 1e6;
  if (c.crop && c.crop_aspect == CropAspect::square) {
    // A square crop needs both sides at least the square's edge.
    const auto edge = static_cast<int64_t>(std::floor(std::sqrt(min_pixels)));
    if (w < edge || h < edge) {
      if (reason) *reason = "below minimum_image_size: " + size + " has a side under " + std::to_string(edge) + " px";
      return false;
    }
  }
  if (static_cast<double>(w) * static_cast<double>(h) >= min_pixels) return true;
  if (reason) {
    const std::string unit = c.resolution_type == ResolutionType::pixel_area ? " px (as the edge of a square)"
                                                                               : " megapixels";
    *reason = "below minimum_image_size: " + size + " is smaller than " + figure + unit;
  }
  return false;
}

// MultiaspectImage.is_image_too_large: the threshold of maximum_image_size.
bool too_large(const Units& u, Size original) {
  const auto [w, h] = original;
  if (u.pixel) return w > *u.maximum || h > *u.maximum;
  return static_cast<double>(w) * static_cast<double>(h) > *u.maximum * 1e6;
}

// A deterministic offset in [0, range] from the key (splitmix64).
int64_t offset_from(uint64_t key, int64_t range) {
  if (range <= 0) return 0;
  key += 0x9E3779B97F4A7C15ull;
  key = (key ^ (key >> 30)) * 0xBF58476D1CE4E5B9ull;
  key = (key ^ (key >> 27)) * 0x94D049BB133111EBull;
  key ^= key >> 31;
  return static_cast<int64_t>(key % static_cast<uint64_t>(range + 1));
}

}  // namespace

bool TrainingCrop::operator==(const TrainingCrop& o) const {
  return resized_width == o.resized_width && resized_height == o.resized_height && crop_left == o.crop_left &&
         crop_top == o.crop_top && width == o.width && height == o.height;
}

std::optional<TrainingCrop> plan_training_crop(int64_t width, int64_t height, const ImageDatasetConfig& config,
                                               int64_t pixel_multiple, uint64_t random_key,
                                               std::string* skip_reason) {
  if (width <= 0 || height <= 0) {
    throw_value_error("[data] an image must have positive sides, got " + std::to_string(width) + "x" +
                      std::to_string(height));
  }
  if (pixel_multiple <= 0) {
    throw_value_error("[data] the pixel multiple must be positive, got " + std::to_string(pixel_multiple));
  }
  if (!(config.resolution > 0)) {
    throw_value_error("[data] dataset '" + config.id + "': resolution must be above 0, got " +
                      std::to_string(config.resolution));
  }
  const Units u = units_of(config);
  const Size original{width, height};
  if (!meets_minimum(config, u, original, skip_reason)) return std::nullopt;

  const int64_t m = pixel_multiple;
  const int64_t pr = square_edge(u, m);
  Size target, intermediary;
  if (config.crop && config.crop_aspect == CropAspect::square) {
    target = {pr, pr};
    intermediary = calculate(u, 1.0, u.resolution, original, m).intermediary;
    if (intermediary.first < pr) intermediary = {pr, pr};
  } else {
    double aspect = aspect_of(width, height);
    if (config.crop && config.crop_aspect == CropAspect::closest && !config.crop_aspect_buckets.empty()) {
      // Python's min(): the first of equally near buckets.
      double best = config.crop_aspect_buckets.front();
      for (double b : config.crop_aspect_buckets) {
        if (std::abs(b - aspect) < std::abs(best - aspect)) best = b;
      }
      aspect = best;
    }
    const Geometry g = calculate(u, aspect, u.resolution, original, m);
    target = g.target;
    intermediary = g.intermediary;
    const double bucket_aspect = aspect_of(target.first, target.second);
    if (bucket_aspect == 1.0 && intermediary.first < pr) intermediary = {pr, pr};
    if (bucket_aspect == 1.0) target = {pr, pr};
  }

  Size resized = intermediary;
  if (config.crop && u.maximum && *u.maximum > 0 && u.downsample && *u.downsample > 0 && too_large(u, original)) {
    // TrainingSample._calculate_target_downsample_size.
    Size d = calculate(u, aspect_of(width, height), *u.downsample, original, m).intermediary;
    if (d.first < target.first) {
      d = {target.first, py_int(static_cast<double>(d.second) * (static_cast<double>(target.first) / d.first))};
    } else if (d.second < target.second) {
      d = {py_int(static_cast<double>(d.first) * (static_cast<double>(target.second) / d.second)), target.second};
    }
    resized = d;
  }
  // Cover the target, keeping the aspect (Note [Bucket geometry], remat's deviations).
  if (resized.first < target.first || resized.second < target.second) {
    // Integer ceilings: the scaled side is never a rounding error short of the target.
    const auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
    const auto [rw, rh] = resized;
    const auto [tw, th] = target;
    if (tw * rh >= th * rw) resized = {tw, std::max(th, ceil_div(rh * tw, rw))};  // width limits
    else resized = {std::max(tw, ceil_div(rw * th, rh)), th};
  }

  TrainingCrop crop;
  crop.resized_width = resized.first;
  crop.resized_height = resized.second;
  crop.width = target.first;
  crop.height = target.second;
  const int64_t spare_w = resized.first - target.first;
  const int64_t spare_h = resized.second - target.second;
  switch (config.crop_style) {
    case CropStyle::center:
      crop.crop_left = spare_w / 2;
      crop.crop_top = spare_h / 2;
      break;
    case CropStyle::corner:
      break;
    case CropStyle::random:
      // Two independent draws from one key: the top offset uses the key's successor.
      crop.crop_left = offset_from(random_key, spare_w);
      crop.crop_top = offset_from(random_key ^ 0xD1B54A32D192ED03ull, spare_h);
      break;
  }
  return crop;
}

}  // namespace remat::data
