// The conversion of a decoded picture to 8-bit pixels (diffusers' VaeImageProcessor.postprocess and
// numpy_to_pil in image_processor.py).

#include "remat/sample/sampler.h"

#include <string>

#include <torch/torch.h>

#include "remat/util/error.h"

namespace remat::sample {

namespace {

class LoopDenoiser final : public Denoiser {
 public:
  explicit LoopDenoiser(DenoisingLoop loop) : loop_(std::move(loop)) {}
  at::Tensor denoise(const PromptEmbeddings& positive, const PromptEmbeddings* negative,
                     const SamplingSettings& settings, const StepCallback& on_step) override {
    return loop_(positive, negative, settings, on_step);
  }

 private:
  DenoisingLoop loop_;
};

// A decoded picture as (3, H, W): throws naming the shape unless it is (1, 3, H, W) or (3, H, W).
at::Tensor one_picture(const at::Tensor& decoded) {
  const bool batched = decoded.defined() && decoded.dim() == 4 && decoded.size(0) == 1;
  if (!decoded.defined() || !(batched || decoded.dim() == 3) || decoded.size(batched ? 1 : 0) != 3) {
    throw_value_error("[sample] a decoded picture must be (1, 3, H, W) or (3, H, W), got " +
                      (decoded.defined() ? c10::str(decoded.sizes()) : std::string("none")));
  }
  return batched ? decoded[0] : decoded;
}

}  // namespace

std::unique_ptr<Denoiser> make_denoiser(DenoisingLoop loop) { return std::make_unique<LoopDenoiser>(std::move(loop)); }

at::Tensor to_uint8_image(const at::Tensor& decoded, encoders::PixelConversion conversion) {
  if (conversion == encoders::PixelConversion::diffusers_postprocess) return to_uint8_image(decoded);
  torch::NoGradGuard no_grad;
  const at::Tensor image = one_picture(decoded);
  // _tokens_to_image: (127.5 * (decoded.clamp(-1, 1) + 1.0)).byte(), every operation in the decoded
  // dtype; the conversion to uint8 truncates toward zero.
  const at::Tensor scaled = (image.clamp(-1, 1) + 1.0) * 127.5;
  return scaled.permute({1, 2, 0}).to(at::kCPU).to(at::kByte).contiguous();
}

at::Tensor to_uint8_image(const at::Tensor& decoded) {
  const bool batched = decoded.defined() && decoded.dim() == 4 && decoded.size(0) == 1;
  if (!decoded.defined() || !(batched || decoded.dim() == 3) || decoded.size(batched ? 1 : 0) != 3) {
    throw_value_error("[sample] a decoded picture must be (1, 3, H, W) or (3, H, W), got " +
                      (decoded.defined() ? c10::str(decoded.sizes()) : std::string("none")));
  }
  torch::NoGradGuard no_grad;
  const at::Tensor image = batched ? decoded[0] : decoded;
  // The clamp in the decoder's dtype, the scaling in float32, numpy's round half to even
  // (torch.round is half to even too).
  const at::Tensor unit = (image * 0.5 + 0.5).clamp(0, 1);
  const at::Tensor scaled = unit.to(at::kCPU, at::kFloat).permute({1, 2, 0}) * 255.0f;
  return at::round(scaled).to(at::kByte).contiguous();
}

}  // namespace remat::sample
