// FLUX.1 Kontext's sizes against FluxKontextPipeline.__call__'s expressions evaluated here in double
// precision with Python's rounding (diffusers 0.42.1, pipelines/flux/pipeline_flux_kontext.py).
#include <cmath>
#include <limits>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/image/image_file.h"
#include "remat/sample/kontext.h"
#include "value_error.h"

namespace remat::sample {
namespace {
namespace kontext_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::testing::error_of;

// Python's round(x) for the positive halves that occur here: ties to even.
int64_t python_round(double x) {
  const double floor = std::floor(x), rest = x - floor;
  if (rest != 0.5) return static_cast<int64_t>(std::floor(x + 0.5));
  return static_cast<int64_t>(std::fmod(floor, 2.0) == 0 ? floor : floor + 1);
}

TEST(Kontext, OutputSizeIsTheRequestedAspectAtMaxArea) {
  for (const auto& [w, h] : std::vector<std::pair<int64_t, int64_t>>{
           {1024, 1024}, {512, 512}, {1024, 768}, {768, 1024}, {1920, 1080}, {64, 48}, {100, 7}}) {
    for (int64_t area : {int64_t{1024} * 1024, int64_t{3072}, int64_t{512} * 512}) {
      const double aspect = static_cast<double>(w) / static_cast<double>(h);
      const int64_t ew = python_round(std::sqrt(area * aspect)) / 16 * 16;
      const int64_t eh = python_round(std::sqrt(area / aspect)) / 16 * 16;
      if (ew < 16 || eh < 16) {
        EXPECT_NE(error_of([&] { kontext_output_size(w, h, area, 16); }).find("raise --max_area"), std::string::npos);
        continue;
      }
      EXPECT_EQ(kontext_output_size(w, h, area, 16), (PictureSize{ew, eh})) << w << "x" << h << " at " << area;
    }
  }
  EXPECT_EQ(kontext_output_size(512, 512, 1024 * 1024, 16), (PictureSize{1024, 1024}));  // Kontext's default area
}

TEST(Kontext, InputSizeIsThePreferredResolutionNearestItsAspect) {
  const auto& preferred = preferred_kontext_resolutions();
  ASSERT_EQ(preferred.size(), 17u);
  for (const auto& [w, h] : std::vector<std::pair<int64_t, int64_t>>{
           {1024, 1024}, {40, 24}, {24, 40}, {3000, 2000}, {1000, 1001}, {4000, 100}, {100, 4000}, {1250, 830}}) {
    // min((abs(aspect_ratio - w / h), w, h) for w, h in PREFERRED_KONTEXT_RESOLUTIONS)
    const int64_t fw = w - w % 16, fh = h - h % 16;
    const double aspect = static_cast<double>(fw) / static_cast<double>(fh);
    double best = std::numeric_limits<double>::infinity();
    PictureSize expected;
    for (const auto& r : preferred) {
      const double d = std::abs(aspect - static_cast<double>(r.width) / static_cast<double>(r.height));
      if (d < best || (d == best && (r.width < expected.width || (r.width == expected.width && r.height < expected.height)))) {
        best = d;
        expected = r;
      }
    }
    EXPECT_EQ(kontext_input_size(w, h, 16, true), expected) << w << "x" << h;
    EXPECT_EQ(kontext_input_size(w, h, 16, false), (PictureSize{fw, fh})) << w << "x" << h;
  }
  EXPECT_EQ(kontext_input_size(3000, 2000, 16, true), (PictureSize{1248, 832}));
  EXPECT_EQ(kontext_input_size(40, 24, 16, true), (PictureSize{1456, 720}));  // 32 x 16 after flooring: 2.0
  EXPECT_NE(error_of([] { kontext_input_size(15, 200, 16, true); }).find("at least 16 pixels"), std::string::npos);
}

TEST(Kontext, VaeInputIsTheLanczosResizeNormalised) {
  torch::manual_seed(3);
  const at::Tensor picture = torch::randint(0, 256, {30, 50, 3}, at::kByte);
  const at::Tensor x = kontext_vae_input(picture, {32, 16});
  EXPECT_TRUE(at::equal(x, image::picture_to_vae_input(image::resize_picture(picture, 32, 16))));
  EXPECT_EQ(x.sizes(), (std::vector<int64_t>{1, 3, 16, 32}));
  // At its own size the picture is not filtered: x / 127.5 - 1 of the pixels themselves.
  const at::Tensor same = kontext_vae_input(picture, {50, 30});
  EXPECT_TRUE(at::allclose(same, picture.permute({2, 0, 1}).unsqueeze(0).to(at::kFloat) / 127.5 - 1, 0, 1e-6));
}

}  // namespace kontext_test
}  // namespace
}  // namespace remat::sample
