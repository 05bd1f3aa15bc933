#pragma once
/// \file
/// diffusers' AutoencoderKL tiling (autoencoder_kl.py: _tiled_encode, tiled_decode, blend_v,
/// blend_h; docs/VAE.md, "Slicing and tiling"): a large input is cut into overlapping
/// square tiles, each tile runs through the encoder (or decoder) on its own, and neighbouring
/// outputs are cross-faded over the overlap. Memory is bounded by one tile's pass; the result
/// differs from the untiled one (GroupNorm statistics and attention only see a tile).

#include <cstdint>
#include <functional>

#include <ATen/ATen.h>

#include "remat/export.h"

namespace remat::encoders {

/// The tile sizes of diffusers' AutoencoderKL. Defaults: sample tiles of config.sample_size
/// pixels, latent tiles of sample_size / 2^(n-1), overlap factor 0.25.
struct TileGeometry {
  int64_t sample_min_size = 0;   ///< pixel tile side (diffusers' tile_sample_min_size)
  int64_t latent_min_size = 0;   ///< latent tile side (diffusers' tile_latent_min_size)
  double overlap_factor = 0.25;  ///< diffusers' tile_overlap_factor
};

/// diffusers' blend_v: for y < E' = min(a.H, b.H, E), row y of `b` becomes
/// a[-E' + y] * (1 - y/E') + b[y] * (y/E'). Writes into `b` (in place, as diffusers does) and
/// returns it. (B, C, H, W) tensors of one dtype.
REMAT_API at::Tensor blend_v(const at::Tensor& a, at::Tensor b, int64_t blend_extent);
/// diffusers' blend_h: the same along the width (dim 3).
REMAT_API at::Tensor blend_h(const at::Tensor& a, at::Tensor b, int64_t blend_extent);

/// diffusers' tiled loop, shared by tiled encode and decode: tiles x[:, :, i:i+tile, j:j+tile]
/// at a stride of int(tile * (1 - overlap)) in each direction, `fn` on each, then every output
/// tile is blended with the (already blended) tile above and then the one to its left over
/// `blend_extent` output pixels, cropped to [:row_limit, :row_limit], and the tiles are
/// concatenated. For encode: tile = sample_min_size, blend_extent = int(latent_min_size *
/// overlap), row_limit = latent_min_size - blend_extent; decode swaps the two sizes.
REMAT_API at::Tensor tiled_apply(const at::Tensor& x, int64_t tile, double overlap_factor, int64_t blend_extent,
                                 int64_t row_limit, const std::function<at::Tensor(const at::Tensor&)>& fn);

}  // namespace remat::encoders
