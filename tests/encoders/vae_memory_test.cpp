// The VAE's inference memory, counted by remat's tracking allocator: an encode holds no tensor
// longer than diffusers' Encoder does (models/autoencoders/vae.py, models/resnet.py), and the
// in-place arithmetic it uses without autograd changes no output bit.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/encoders/autoencoder_kl.h"
#include "remat/encoders/autoencoder_kl_config.h"
#include "remat/memory.h"

namespace {
namespace vae_memory_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using namespace remat::encoders;

AutoencoderKLConfig narrow_config() {
  // FLUX.1's four levels (so the mid-block attention runs at 1/8 of the side, over 4096 tokens at
  // 512 px), an eighth of its widths.
  AutoencoderKLConfig c = AutoencoderKLConfig::tiny();
  c.block_out_channels = {16, 32, 64, 64};
  c.norm_num_groups = 8;
  return c;
}

int64_t bytes_of(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// The peak of a 512 px encode, above the weights and the input, is the first full-resolution
// ResnetBlock2D's: its input, the activated norm output, and one convolution's output and
// workspace (the convolution measured alone, so the formula holds whatever kernel LibTorch picks).
// diffusers holds more there: the block's input stays referenced by Encoder.forward while the
// whole down block runs, and ResnetBlock2D's residual sum and its division are new tensors.
TEST(VaeMemory, EncodePeakIsOneResnetBlocksLiveActivations) {
  remat::memory::install_cpu_tracking();
  ASSERT_TRUE(remat::memory::cpu_tracking_installed());
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  const AutoencoderKLConfig config = narrow_config();
  AutoencoderKL vae(config);
  vae->eval();
  const at::Tensor image = torch::rand({1, 3, 512, 512}) * 2 - 1;

  // In both memory layouts (a convolution's workspace differs: NCHW may reorder to a blocked
  // layout and back, NHWC runs in place of its layout).
  for (const bool nhwc : {false, true}) {
    vae->set_channels_last(nhwc);
    const auto format = nhwc ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
    // One activation at full resolution, and what one 3x3 convolution of it costs above its input.
    const at::Tensor activation = torch::randn({1, config.block_out_channels[0], 512, 512}).contiguous(format);
    const int64_t A = bytes_of(activation);
    int64_t conv_cost = 0;
    {
      const auto& conv1 = vae->encoder->down_blocks[0]->named_modules()["resnets.0.conv1"];
      remat::memory::PeakScope scope;
      const at::Tensor out = conv1->as<torch::nn::Conv2d>()->forward(activation);
      conv_cost = scope.peak_delta();
      ASSERT_GE(conv_cost, bytes_of(out));
    }

    int64_t peak = 0;
    at::Tensor mean;
    {
      remat::memory::PeakScope scope;
      mean = vae->encode(image).mean;
      peak = scope.peak_delta();
    }
    // NHWC converts the 3-channel input once (the copy lives through the first convolution).
    const int64_t formula = 2 * A + conv_cost + (nhwc ? bytes_of(image) : 0);
    std::printf("encode 512 px fp32 %s (channels 16, 32, 64, 64): peak %lld bytes above weights + input; formula "
                "2 x %lld (block input, activated norm) + %lld (a convolution)%s = %lld; weights %lld, input %lld\n",
                nhwc ? "NHWC" : "NCHW", static_cast<long long>(peak), static_cast<long long>(A),
                static_cast<long long>(conv_cost), nhwc ? " + the input in NHWC" : "", static_cast<long long>(formula),
                static_cast<long long>(remat::memory::current_bytes()), static_cast<long long>(bytes_of(image)));
    ASSERT_TRUE(mean.defined());
    // GroupNorm's per-group statistics and the latents are a few KiB.
    EXPECT_NEAR(static_cast<double>(peak), static_cast<double>(formula), 256.0 * 1024.0) << (nhwc ? "NHWC" : "NCHW");
  }
}

// Channels-last is the same computation in another layout: encode and decode agree with NCHW to
// float32 rounding, return contiguous tensors, and switching back restores NCHW weights. bf16
// is refused (LibTorch 1.13's CPU GroupNorm is wrong on bf16 channels-last input).
TEST(VaeMemory, ChannelsLastEqualsNchw) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(3);
  AutoencoderKL vae(narrow_config());
  vae->eval();
  const at::Tensor image = torch::rand({2, 3, 64, 48}) * 2 - 1;
  const at::Tensor mean = vae->encode(image).mean, decoded = vae->decode(mean);
  vae->set_channels_last(true);
  EXPECT_TRUE(vae->encoder->conv_in->weight.is_contiguous(at::MemoryFormat::ChannelsLast));
  const at::Tensor mean_nhwc = vae->encode(image).mean, decoded_nhwc = vae->decode(mean);
  EXPECT_TRUE(vae->encode_moments(image).is_contiguous() && decoded_nhwc.is_contiguous());
  const auto relative = [](const at::Tensor& a, const at::Tensor& b) {
    return ((a - b).abs().max() / b.abs().max()).item<double>();
  };
  EXPECT_LT(relative(mean_nhwc, mean), 1e-5);
  EXPECT_LT(relative(decoded_nhwc, decoded), 1e-5);
  vae->set_channels_last(false);
  EXPECT_TRUE(vae->encoder->conv_in->weight.is_contiguous());
  EXPECT_TRUE(torch::equal(vae->encode(image).mean, mean));

  vae->to(at::kBFloat16);
  try {
    vae->set_channels_last(true);
    ADD_FAILURE() << "bf16 channels-last was accepted";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("[vae] channels-last convolutions need float32 weights, got BFloat16"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(vae->channels_last());
}

// Memory admission (remat caches and samples only what the prediction says fits) relies on
// vae_peak_bytes bounding what an encode holds: above the measured peak, and not so far above
// that it refuses pictures this machine could encode. Measured with the attention dominant (a
// 2-level VAE at 256 px: 16384 latent pixels) and with the resnet dominant (4 levels at 512 px).
TEST(VaeMemory, PredictedPeakBoundsTheMeasuredOne) {
  remat::memory::install_cpu_tracking();
  torch::NoGradGuard no_grad;
  torch::manual_seed(2);
  AutoencoderKLConfig attention_heavy = AutoencoderKLConfig::tiny();  // [32, 64]: factor 2
  for (const auto& [config, side] : {std::pair{narrow_config(), 512}, std::pair{attention_heavy, 256}}) {
    AutoencoderKL vae(config);
    vae->eval();
    const at::Tensor image = torch::rand({1, 3, side, side}) * 2 - 1;
    int64_t peak = 0;
    {
      remat::memory::PeakScope scope;
      const at::Tensor mean = vae->encode(image).mean;
      peak = scope.peak_delta() + bytes_of(image);  // the prediction counts the picture too
    }
    const int64_t predicted = vae_peak_bytes(config, side, side, 4, /*tiled=*/false);
    std::printf("encode %d px, %zu levels: measured peak %lld bytes, predicted %lld (x%.2f)\n", side,
                config.block_out_channels.size(), static_cast<long long>(peak), static_cast<long long>(predicted),
                static_cast<double>(predicted) / static_cast<double>(peak));
    EXPECT_GE(predicted, peak);
    EXPECT_LE(predicted, 3 * peak);
  }
  // Tiled, the activations are one tile's whatever the picture's size.
  const AutoencoderKLConfig c = narrow_config();
  const int64_t tile = c.sample_size.front();
  EXPECT_EQ(vae_peak_bytes(c, 4096, 4096, 4, true) - 2 * 3 * 4096 * 4096 * 4,
            vae_peak_bytes(c, tile, tile, 4, false) - 2 * 3 * tile * tile * 4);
}

// Without autograd the blocks overwrite their own intermediates; with it they may not. Both give
// the same bits.
TEST(VaeMemory, InPlaceInferenceEqualsTheAutogradPath) {
  torch::manual_seed(1);
  AutoencoderKL vae(narrow_config());
  vae->eval();
  const at::Tensor image = torch::rand({2, 3, 64, 48}) * 2 - 1;
  at::Tensor with_grad_mean, with_grad_decoded;
  {
    const at::Tensor input = image.clone().requires_grad_(true);
    with_grad_mean = vae->encode(input).mean.detach();
    with_grad_decoded = vae->decode(with_grad_mean).detach();
  }
  torch::NoGradGuard no_grad;
  const at::Tensor mean = vae->encode(image).mean;
  EXPECT_TRUE(torch::equal(mean, with_grad_mean));
  EXPECT_TRUE(torch::equal(vae->decode(mean), with_grad_decoded));
}

}  // namespace vae_memory_test
}  // namespace
