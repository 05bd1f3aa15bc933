// Mage-VAE: the checkpoint layout upstream's module names make (every key listed here from the
// structure of SimpleTuner's mage_vae.py, not from remat's modules), strict loading (a missing or
// stray key named, upstream's skipped prefixes skipped), shapes, batch independence, bfloat16
// against float32, and the errors. The numbers were compared once with the upstream module itself
// (docs/MAGEFLOW_PARITY.md).
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include <torch/torch.h>

#include "remat/encoders/mage_vae.h"
#include "remat/io/safetensors.h"
#include "temp_dir.h"
#include "value_error.h"

namespace remat::encoders {
namespace {
namespace mage_vae_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using remat::testing::error_of;

// The keys of upstream's checkpoint for `c`, with their shapes, written from mage_vae.py's modules.
std::vector<std::pair<std::string, std::vector<int64_t>>> upstream_keys(const MageVaeConfig& c) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> keys;
  const auto add = [&](const std::string& k, std::vector<int64_t> shape) { keys.emplace_back(k, std::move(shape)); };
  const int64_t ps = c.patch_size, h = c.hidden_size, ffn = static_cast<int64_t>(c.mlp_ratio * h);
  const auto dico = [&](const std::string& p, int64_t w, bool modulated) {
    const int64_t f = static_cast<int64_t>(c.mlp_ratio * w);
    add(p + "conv1.weight", {w, w, 1, 1}), add(p + "conv1.bias", {w});
    add(p + "conv2.weight", {w, 1, 3, 3}), add(p + "conv2.bias", {w});
    add(p + "conv3.weight", {w, w, 1, 1}), add(p + "conv3.bias", {w});
    add(p + "ca.1.weight", {w, w, 1, 1}), add(p + "ca.1.bias", {w});
    add(p + "conv4.weight", {f, w, 1, 1}), add(p + "conv4.bias", {f});
    add(p + "conv5.weight", {w, f, 1, 1}), add(p + "conv5.bias", {w});
    if (modulated) {
      add(p + "adaLN_modulation.1.weight", {6 * w, w}), add(p + "adaLN_modulation.1.bias", {6 * w});
    } else {
      add(p + "norm1.weight", {w}), add(p + "norm1.bias", {w}), add(p + "norm2.weight", {w}), add(p + "norm2.bias", {w});
    }
  };
  const auto t_embedder = [&](const std::string& p) {
    add(p + "t_embedder.mlp.0.weight", {h, 256}), add(p + "t_embedder.mlp.0.bias", {h});
    add(p + "t_embedder.mlp.2.weight", {h, h}), add(p + "t_embedder.mlp.2.bias", {h});
  };
  const std::string e = "student.dconv_encoder.";
  add(e + "patch_cond_embed.weight", {c.head_size, 3, ps, ps}), add(e + "patch_cond_embed.bias", {c.head_size});
  for (int64_t i = 0; i < c.num_head_blocks; ++i) dico(e + "head_blocks." + std::to_string(i) + ".", c.head_size, false);
  add(e + "proj_down.weight", {h, c.head_size, 1, 1}), add(e + "proj_down.bias", {h});
  add(e + "z_proj.weight", {h, c.latent_channels, 1, 1}), add(e + "z_proj.bias", {h});
  add(e + "fuse_proj.weight", {h, 2 * h, 1, 1}), add(e + "fuse_proj.bias", {h});
  t_embedder(e);
  for (int64_t i = 0; i < c.num_encoder_blocks; ++i) dico(e + "blocks." + std::to_string(i) + ".", h, true);
  add(e + "norm_out.weight", {h}), add(e + "norm_out.bias", {h});
  add(e + "proj_out.weight", {2 * c.latent_channels, h, 1, 1}), add(e + "proj_out.bias", {2 * c.latent_channels});
  const std::string d = "pipeline.";
  const int64_t hx = c.hidden_size_x, p2 = ps * ps;
  t_embedder(d);
  add(d + "y_embedder_x.weight", {hx * p2, h, 1, 1}), add(d + "y_embedder_x.bias", {hx * p2});
  add(d + "x_embedder.embedder.0.weight", {hx, 3 + hx + 64}), add(d + "x_embedder.embedder.0.bias", {hx});
  add(d + "s_embedder.proj1.weight", {c.bottleneck_dim, 3, ps, ps});
  add(d + "s_embedder.proj2.weight", {h, c.bottleneck_dim + h, 1, 1}), add(d + "s_embedder.proj2.bias", {h});
  for (int64_t i = 0; i < c.num_denoiser_blocks; ++i) dico(d + "blocks." + std::to_string(i) + ".", h, true);
  add(d + "dec_net.cond_embed.weight", {p2 * hx, h}), add(d + "dec_net.cond_embed.bias", {p2 * hx});
  add(d + "dec_net.input_proj.weight", {hx, hx}), add(d + "dec_net.input_proj.bias", {hx});
  for (int64_t i = 0; i < c.num_head_mlp_blocks; ++i) {
    const std::string r = d + "dec_net.res_blocks." + std::to_string(i) + ".";
    add(r + "in_ln.weight", {hx}), add(r + "in_ln.bias", {hx});
    add(r + "mlp.0.weight", {hx, hx}), add(r + "mlp.0.bias", {hx}), add(r + "mlp.2.weight", {hx, hx}), add(r + "mlp.2.bias", {hx});
    add(r + "adaLN_modulation.1.weight", {3 * hx, hx}), add(r + "adaLN_modulation.1.bias", {3 * hx});
  }
  add(d + "final_layer.norm.weight", {hx});
  add(d + "final_layer.linear.weight", {3, hx}), add(d + "final_layer.linear.bias", {3});
  const std::string y = d + "y_embedder.decoder.";
  add(y + "conv_in.weight", {h, c.latent_channels, 3, 3}), add(y + "conv_in.bias", {h});
  for (int i : {0, 2, 4}) {
    const std::string r = y + "block." + std::to_string(i) + ".";
    add(r + "norm1.weight", {h}), add(r + "norm1.bias", {h}), add(r + "conv1.weight", {h, h, 3, 3}), add(r + "conv1.bias", {h});
    add(r + "norm2.weight", {h}), add(r + "norm2.bias", {h}), add(r + "conv2.weight", {h, h, 3, 3}), add(r + "conv2.bias", {h});
  }
  for (int i : {1, 3}) {
    const std::string a = y + "block." + std::to_string(i) + ".";
    add(a + "norm.weight", {h}), add(a + "norm.bias", {h});
    for (const char* n : {"q", "k", "v", "proj_out"}) add(a + n + ".weight", {h, h, 1, 1}), add(a + n + ".bias", {h});
  }
  add(y + "norm_out.weight", {h}), add(y + "norm_out.bias", {h});
  add(y + "conv_out.weight", {h, h, 3, 3}), add(y + "conv_out.bias", {h});
  (void)ffn;
  return keys;
}

class MageVaeTest : public ::testing::Test {
 protected:
  // A checkpoint in upstream's layout: every key random, plus the keys upstream skips.
  std::string write_checkpoint(const MageVaeConfig& c, const std::string& drop = "", const std::string& extra = "") {
    torch::manual_seed(3);
    std::vector<io::NamedTensor> tensors;
    for (const auto& [key, shape] : upstream_keys(c)) {
      if (key != drop) tensors.push_back({key, torch::randn(shape) * 0.1});
    }
    tensors.push_back({"pipeline.y_embedder.encoder.conv_in.weight", torch::randn({4, 3})});
    tensors.push_back({"pipeline.y_embedder.bottleneck.proj.weight", torch::randn({4})});
    tensors.push_back({"student.teacher_head.weight", torch::randn({2})});
    if (!extra.empty()) tensors.push_back({extra, torch::randn({2})});
    const std::string path = dir_ / "diffusion_pytorch_model.safetensors";
    io::save_safetensors(path, tensors);
    return path;
  }
  static std::vector<io::SafetensorsFile> open(const std::string& path) {
    std::vector<io::SafetensorsFile> files;
    files.push_back(io::SafetensorsFile::open(path));
    return files;
  }
  remat::testing::TempDir dir_{"mage_vae"};
};

TEST_F(MageVaeTest, LoadsUpstreamsLayoutStrictly) {
  const auto c = MageVaeConfig::preset("mage-vae-tiny");
  auto vae = MageVae::load(open(write_checkpoint(c)), c, at::kFloat);
  // A key missing, or a stray one under a prefix, is named (upstream would skip either silently).
  for (const auto& [drop, extra, named] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"pipeline.y_embedder.decoder.block.1.q.weight", "", "y_embedder.decoder.block.1.q.weight"},
           {"student.dconv_encoder.blocks.1.adaLN_modulation.1.bias", "", "blocks.1.adaLN_modulation.1.bias"},
           {"", "pipeline.extra_head.weight", "pipeline.extra_head.weight"}}) {
    const auto files = open(write_checkpoint(c, drop, extra));
    try {
      MageVae::load(files, c, at::kFloat);
      ADD_FAILURE() << "loaded without " << named;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what_without_backtrace()).find(named), std::string::npos) << e.what_without_backtrace();
    }
  }
  // Folding dropped the modulation MLPs and the timestep embedders: 2 + 2 blocks x (6h x h + 6h),
  // two embedders x (256 h + h + h h + h) fewer parameters than the checkpoint holds, in float32.
  int64_t checkpoint = 0;
  for (const auto& [key, shape] : upstream_keys(c)) {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    checkpoint += n;
  }
  const int64_t h = c.hidden_size;
  const int64_t dropped = 4 * (6 * h * h + 6 * h) + 2 * (256 * h + h + h * h + h);
  const int64_t folded = 4 * 6 * h;  // one modulation row per block stays, as a buffer
  EXPECT_EQ(vae.parameter_bytes(), (checkpoint - dropped + folded) * 4);
}

// parameter_count (the memory model) and random_checkpoint (the demo pipelines' VAE) against the keys
// written above from upstream's modules, at remat's test size and at the published one.
TEST_F(MageVaeTest, CountAndRandomCheckpointFollowUpstreamsKeys) {
  for (const char* preset : {"mage-vae-tiny", "mage-vae"}) {
    const auto c = MageVaeConfig::preset(preset);
    int64_t expected = 0;
    std::set<std::string> keys;
    for (const auto& [key, shape] : upstream_keys(c)) {
      int64_t n = 1;
      for (auto s : shape) n *= s;
      expected += n;
      keys.insert(key);
    }
    EXPECT_EQ(c.parameter_count(), expected) << preset;
    if (std::string(preset) != "mage-vae-tiny") continue;  // random weights at the published size take too long here
    const auto checkpoint = MageVae::random_checkpoint(c, 1, 0.1, at::kBFloat16);
    std::set<std::string> written;
    for (const auto& [key, tensor] : checkpoint) {
      written.insert(key);
      EXPECT_EQ(tensor.scalar_type(), at::kBFloat16) << key;
    }
    EXPECT_EQ(written, keys);
  }
}

TEST_F(MageVaeTest, ShapesBatchesAndBf16) {
  const auto c = MageVaeConfig::preset("mage-vae-tiny");
  auto vae = MageVae::load(open(write_checkpoint(c)), c, at::kFloat);
  torch::manual_seed(4);
  const at::Tensor pixels = torch::rand({2, 3, 48, 80}) * 2 - 1;
  const at::Tensor mean = vae.encode(pixels);
  EXPECT_EQ(mean.sizes(), (std::vector<int64_t>{2, c.latent_channels, 3, 5}));
  EXPECT_LE(vae.encode_logvar(pixels).max().item<float>(), 10.0f);
  // 3 x 5 latents with windows of 4: padded windows; each sample decodes as it does alone.
  const at::Tensor decoded = vae.decode(mean);
  EXPECT_EQ(decoded.sizes(), (std::vector<int64_t>{2, 3, 48, 80}));
  EXPECT_TRUE(at::allclose(decoded[1], vae.decode(mean.narrow(0, 1, 1))[0], 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(mean[0], vae.encode(pixels.narrow(0, 0, 1))[0], 1e-5, 1e-6));
  EXPECT_TRUE(decoded.isfinite().all().item<bool>());
  auto bf16 = MageVae::load(open(write_checkpoint(c)), c, at::kBFloat16);
  const at::Tensor mean16 = bf16.encode(pixels.to(at::kBFloat16));
  EXPECT_EQ(mean16.scalar_type(), at::kBFloat16);
  EXPECT_LT((mean16.to(at::kFloat) - mean).abs().max().item<float>(), 0.05 * mean.abs().max().item<float>());
}

TEST_F(MageVaeTest, ErrorsNameTheValue) {
  const auto c = MageVaeConfig::preset("mage-vae-tiny");
  auto vae = MageVae::random(c, 1, 0.1, at::kFloat);
  EXPECT_NE(error_of([&] { vae.encode(torch::zeros({1, 3, 40, 32})); }).find("multiples of 16, got (40, 32)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { vae.decode(torch::zeros({1, 5, 2, 2})); }).find("latents must be (B, 16, h, w)"),
            std::string::npos);
  EXPECT_NE(error_of([] { MageVaeConfig::preset("mage-vae-xl"); }).find("mage-vae, mage-vae-tiny"), std::string::npos);
  MageVaeConfig bad = c;
  bad.hidden_size = 48;
  EXPECT_NE(error_of([&] { bad.validate(); }).find("multiple of 32"), std::string::npos);
  // The published sizes: 128-channel latents at 1/16.
  const auto published = MageVaeConfig::preset("mage-vae");
  EXPECT_EQ(published.latent_channels, 128);
  EXPECT_EQ(published.patch_size, 16);
  EXPECT_EQ(published.num_encoder_blocks, 21);
}

}  // namespace mage_vae_test
}  // namespace
}  // namespace remat::encoders
