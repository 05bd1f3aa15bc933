// Writes a randomly initialised AutoencoderKL, its inputs and remat's outputs, so that a run of
// diffusers' AutoencoderKL on the same weights can be compared with remat's (docs/VAE.md, "Parity").
//
// usage: vae_parity_dump <out_dir> [tiny|flux] [image_size=32] [tile_sample_size=16]
// Writes <out_dir>/config.json (diffusers format), weights.safetensors (diffusers keys) and
// keys.txt (parameter order) and outputs.safetensors: x (2, 3, S, S) in [-1, 1]; mean, logvar (untiled encode); z (2, c_z, S/f, S/f);
// decoded; mean_tiled, logvar_tiled, decoded_tiled (tiles of tile_sample_size pixels);
// mean_sliced, decoded_sliced (slicing). Everything fp32 on the CPU.

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <torch/torch.h>

#include "remat/encoders/autoencoder_kl.h"
#include "remat/io/safetensors.h"

using namespace remat::encoders;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: vae_parity_dump <out_dir> [tiny|flux] [image_size=32] [tile_sample_size=16]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const std::string preset = argc > 2 ? argv[2] : "tiny";
  const int64_t size = argc > 3 ? std::atoll(argv[3]) : 32;
  const int64_t tile = argc > 4 ? std::atoll(argv[4]) : 16;
  torch::manual_seed(7);
  const auto config = preset == "flux" ? AutoencoderKLConfig::flux() : AutoencoderKLConfig::tiny();
  AutoencoderKL vae(config);
  {
    // Non-trivial norms and biases, so every parameter shows up in the outputs.
    torch::NoGradGuard no_grad;
    for (auto& item : vae->named_parameters()) {
      auto& p = item.value();
      const bool norm = item.key().find("norm") != std::string::npos;
      if (norm && item.key().size() > 7 && item.key().substr(item.key().size() - 7) == ".weight") {
        p.copy_(1.0 + 0.2 * torch::randn(p.sizes()));
      } else if (p.dim() == 1) {
        p.copy_(0.1 * torch::randn(p.sizes()));
      }
    }
  }
  vae->eval();
  torch::NoGradGuard no_grad;
  std::ofstream(dir + "/config.json") << config.to_json();
  remat::io::save_module(dir + "/weights.safetensors", *vae);
  {
    // The parameter order (diffusers' state_dict order is compared against it).
    std::ofstream keys(dir + "/keys.txt");
    for (const auto& item : vae->named_parameters()) keys << item.key() << "\n";
  }

  const auto x = torch::rand({2, config.in_channels, size, size}) * 2 - 1;
  const int64_t f = config.spatial_factor();
  const auto z = torch::randn({2, config.latent_channels, size / f, size / f});
  std::vector<remat::io::NamedTensor> out = {{"x", x}, {"z", z}};
  auto post = vae->encode(x);
  out.push_back({"mean", post.mean});
  out.push_back({"logvar", post.logvar});
  out.push_back({"decoded", vae->decode(z)});
  vae->set_tiling(true);
  vae->set_tile_sample_size(tile);
  post = vae->encode(x);
  out.push_back({"mean_tiled", post.mean});
  out.push_back({"logvar_tiled", post.logvar});
  out.push_back({"decoded_tiled", vae->decode(z)});
  vae->set_tiling(false);
  vae->set_slicing(true);
  out.push_back({"mean_sliced", vae->encode(x).mean});
  out.push_back({"decoded_sliced", vae->decode(z)});
  remat::io::save_safetensors(dir + "/outputs.safetensors", out,
                              {{"preset", preset}, {"tile_sample_size", std::to_string(tile)}});
  std::printf("wrote %s (%s, %lldx%lld, tiles of %lld px)\n", dir.c_str(), preset.c_str(),
              static_cast<long long>(size), static_cast<long long>(size), static_cast<long long>(tile));
  return 0;
}
