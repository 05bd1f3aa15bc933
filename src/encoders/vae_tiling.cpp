// diffusers AutoencoderKL's tiling (autoencoder_kl.py: blend_v, blend_h, _tiled_encode,
// tiled_decode).

#include "remat/encoders/vae_tiling.h"

#include <algorithm>
#include <vector>

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include "remat/util/error.h"

namespace remat::encoders {

// The weights are Python floats (double) multiplied into the tensor, as in diffusers, so fp32
// results round the same way.
at::Tensor blend_v(const at::Tensor& a, at::Tensor b, int64_t blend_extent) {
  const int64_t e = std::min({a.size(2), b.size(2), blend_extent});
  for (int64_t y = 0; y < e; ++y) {
    const double w = static_cast<double>(y) / static_cast<double>(e);
    b.select(2, y).copy_(a.select(2, a.size(2) - e + y) * (1.0 - w) + b.select(2, y) * w);
  }
  return b;
}

at::Tensor blend_h(const at::Tensor& a, at::Tensor b, int64_t blend_extent) {
  const int64_t e = std::min({a.size(3), b.size(3), blend_extent});
  for (int64_t x = 0; x < e; ++x) {
    const double w = static_cast<double>(x) / static_cast<double>(e);
    b.select(3, x).copy_(a.select(3, a.size(3) - e + x) * (1.0 - w) + b.select(3, x) * w);
  }
  return b;
}

at::Tensor tiled_apply(const at::Tensor& x, int64_t tile, double overlap_factor, int64_t blend_extent,
                       int64_t row_limit, const std::function<at::Tensor(const at::Tensor&)>& fn) {
  const int64_t stride = static_cast<int64_t>(static_cast<double>(tile) * (1.0 - overlap_factor));
  if (!(tile >= 1 && stride >= 1)) {
    throw_value_error(c10::str("[vae] tile size ", tile, " with overlap factor ", overlap_factor,
                               " gives a tile stride of ", stride, "; it must be >= 1"));
  }
  if (!(row_limit >= 1)) {
    throw_value_error(c10::str("[vae] the tile crop (row_limit) must be >= 1, got ", row_limit));
  }
  std::vector<std::vector<at::Tensor>> rows;
  for (int64_t i = 0; i < x.size(2); i += stride) {
    std::vector<at::Tensor> row;
    for (int64_t j = 0; j < x.size(3); j += stride) {
      row.push_back(fn(x.slice(2, i, i + tile).slice(3, j, j + tile)));
    }
    rows.push_back(std::move(row));
  }
  std::vector<at::Tensor> result_rows;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<at::Tensor> result_row;
    for (size_t j = 0; j < rows[i].size(); ++j) {
      at::Tensor& t = rows[i][j];
      if (i > 0) blend_v(rows[i - 1][j], t, blend_extent);
      if (j > 0) blend_h(rows[i][j - 1], t, blend_extent);
      result_row.push_back(t.slice(2, 0, row_limit).slice(3, 0, row_limit));
    }
    result_rows.push_back(at::cat(result_row, 3));
  }
  return at::cat(result_rows, 2);
}

}  // namespace remat::encoders
