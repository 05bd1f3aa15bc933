// Weight-only quantisation of frozen Linear weights: the formats (int8 per channel, NF4 with
// optional double quantisation, fp8 e4m3) and SimpleTuner's names for them. The matmul lives in
// quantization_linear.cpp, the module walk in quantization_layers.cpp.

#include "remat/models/quantization.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include <torch/version.h>

#include "remat/compat.h"
#include "remat/util/error.h"

namespace remat::models {
namespace {

constexpr const char* kQuantTag = "[quant] ";

// Largest finite float8 e4m3fn value: the per-channel scale maps each row's absmax onto it.
[[maybe_unused]] constexpr double kFp8E4m3Max = 448.0;

struct NamedPrecision {
  const char* name;
  WeightQuantization mode;
  bool double_quantization;
};

// SimpleTuner's base_model_precision values remat implements (weight-only modes). quanto's and
// torchao's int8 weight-only modes both keep one symmetric scale per output channel.
constexpr NamedPrecision kSupported[] = {
    {"no_change", WeightQuantization::none, false},
    {"int8-quanto", WeightQuantization::int8, false},
    {"int8-torchao", WeightQuantization::int8, false},
    // SimpleTuner's BitsAndBytesConfig sets bnb_4bit_use_double_quant=True.
    {"nf4-bnb", WeightQuantization::nf4, true},
    {"fp8-quanto", WeightQuantization::fp8, false},
    {"fp8wo-torchao", WeightQuantization::fp8, false},
};

// The rest of SimpleTuner's choices, each with why remat refuses it.
struct RefusedPrecision {
  const char* name;
  const char* why;
};
constexpr RefusedPrecision kRefused[] = {
    {"int4-quanto", "4-bit integer weights are not implemented (use nf4-bnb for 4 bits)"},
    {"int2-quanto", "2-bit integer weights are not implemented"},
    {"int4-torchao", "4-bit integer weights are not implemented (use nf4-bnb for 4 bits)"},
    {"int8dq-torchao", "it quantises activations dynamically; remat quantises weights only"},
    {"int8dq-int4-torchao", "it quantises activations dynamically; remat quantises weights only"},
    {"fp8uz-quanto", "float8 e4m3fnuz is not implemented (fp8-quanto gives e4m3fn weights)"},
    {"fp8-native", "it scales activations into a float8 matmul; remat quantises weights only"},
    {"fp8-torchao", "it quantises activations dynamically; remat quantises weights only (fp8wo-torchao)"},
    {"fp8-int4-torchao", "it quantises activations dynamically; remat quantises weights only"},
    {"fp8-transformerengine", "TransformerEngine is not available to a LibTorch program"},
};

std::string supported_list() {
  std::string out;
  for (const auto& s : supported_base_model_precisions()) out += (out.empty() ? "" : ", ") + s;
  return out;
}

void require_float8(const char* what) {
  if (!float8_supported()) {
    throw_value_error(std::string(kQuantTag) + what + " needs float8 dtypes (LibTorch / PyTorch 2.1 or newer); this build has " +
                      TORCH_VERSION + " (use int8-quanto or nf4-bnb)");
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Nearest entry of an ascending code book `code` (float32, on `values`' device) for each value:
// the index of the first code whose upper midpoint is >= the value (ties go to the lower code).
at::Tensor nearest_code(const at::Tensor& values, const at::Tensor& code) {
  const int64_t n = code.numel();
  const at::Tensor midpoints = (code.narrow(0, 0, n - 1) + code.narrow(0, 1, n - 1)) / 2;
  return at::bucketize(values, midpoints, /*out_int32=*/true, /*right=*/false).to(at::kByte);
}

at::Tensor nf4_code_tensor(const at::Device& device) {
  const auto& c = nf4_code_book();
  return at::tensor(at::ArrayRef<float>(c.data(), c.size()), at::TensorOptions().dtype(at::kFloat)).to(device);
}

at::Tensor dynamic_code_tensor(const at::Device& device) {
  const auto& c = dynamic_8bit_code();
  return at::tensor(at::ArrayRef<float>(c.data(), c.size()), at::TensorOptions().dtype(at::kFloat)).to(device);
}

// Blockwise absmax of a flat float32 tensor padded with zeros to whole blocks: (blocks, block).
at::Tensor as_blocks(const at::Tensor& flat, int64_t block) {
  const int64_t n = flat.numel();
  const int64_t blocks = ceil_div(n, block);
  if (blocks * block == n) return flat.view({blocks, block});
  return at::constant_pad_nd(flat, {0, blocks * block - n}, 0.0).view({blocks, block});
}

// x / absmax with 0 for an all-zero block (its absmax stays 0, so it dequantises to 0).
at::Tensor normalise(const at::Tensor& blocks, const at::Tensor& absmax) {
  return blocks / at::where(absmax == 0, at::ones_like(absmax), absmax).unsqueeze(1);
}

// A multiple of the NF4 block (64) and of 2 (two codes per byte).
constexpr int64_t kChunkElements = kQuantizeChunkElements;
static_assert(kChunkElements % kNf4BlockSize == 0 && kChunkElements % 2 == 0, "whole NF4 blocks and bytes per chunk");

QuantizedWeight quantize_nf4(const at::Tensor& weight, bool double_quantization) {
  QuantizedWeight q;
  const int64_t n = weight.numel();
  const at::Tensor flat = weight.reshape({-1});  // a view for the contiguous tensors loaders pass
  const at::Tensor code = nf4_code_tensor(weight.device());
  const at::Tensor absmax = at::empty({ceil_div(n, kNf4BlockSize)}, weight.options().dtype(at::kFloat));
  q.data = at::empty({ceil_div(n, 2)}, weight.options().dtype(at::kByte));
  for (int64_t start = 0; start < n; start += kChunkElements) {
    const int64_t len = std::min(kChunkElements, n - start);
    const at::Tensor blocks = as_blocks(flat.narrow(0, start, len).to(at::kFloat), kNf4BlockSize);
    const at::Tensor chunk_absmax = blocks.abs().amax(1);
    absmax.narrow(0, start / kNf4BlockSize, blocks.size(0)).copy_(chunk_absmax);
    at::Tensor codes = nearest_code(normalise(blocks, chunk_absmax), code).reshape({-1}).narrow(0, 0, len);
    if (len % 2 != 0) codes = at::constant_pad_nd(codes, {0, 1}, 0);
    codes = codes.view({-1, 2});
    // bitsandbytes' packing: the even element in the high nibble.
    q.data.narrow(0, start / 2, codes.size(0))
        .copy_(at::bitwise_or(at::bitwise_left_shift(codes.select(1, 0), 4), codes.select(1, 1)));
  }
  if (!double_quantization) {
    q.scales = absmax;
    return q;
  }
  // bitsandbytes' nested quantisation: subtract the mean, then blockwise 8-bit (absmax per
  // kNf4ScaleBlockSize scales) with its signed dynamic code (dynamic_8bit_code()).
  q.scale_offset = absmax.mean();
  const at::Tensor centred = as_blocks(absmax - q.scale_offset, kNf4ScaleBlockSize);
  const at::Tensor scale_absmax = centred.abs().amax(1);
  q.scales = nearest_code(normalise(centred, scale_absmax), dynamic_code_tensor(weight.device()))
                 .reshape({-1})
                 .narrow(0, 0, absmax.numel())
                 .contiguous();
  q.scale_scales = scale_absmax.contiguous();
  return q;
}

// int8 / fp8: one scale per row, `max_code` the largest code; rows quantised a chunk at a time.
QuantizedWeight quantize_per_channel(const at::Tensor& weight, double max_code, at::ScalarType code_dtype) {
  QuantizedWeight q;
  const int64_t rows = weight.size(0), cols = weight.size(1);
  q.data = at::empty({rows, cols}, weight.options().dtype(code_dtype));
  q.scales = at::empty({rows}, weight.options().dtype(at::kFloat));
  const int64_t step = std::max<int64_t>(1, kChunkElements / cols);
  for (int64_t r = 0; r < rows; r += step) {
    const int64_t len = std::min(step, rows - r);
    const at::Tensor w = weight.narrow(0, r, len).to(at::kFloat);
    const at::Tensor absmax = w.abs().amax(1);
    q.scales.narrow(0, r, len).copy_(absmax / max_code);
    // In place: one float32 temporary of the chunk's size.
    at::Tensor scaled = normalise(w, absmax).mul_(max_code);
    if (code_dtype == at::kChar) scaled.round_().clamp_(-max_code, max_code);
    q.data.narrow(0, r, len).copy_(scaled);
  }
  return q;
}

at::Tensor nf4_block_scales(const QuantizedWeight& q) {
  if (!q.scale_scales.defined()) return q.scales;
  const int64_t n = q.scales.numel();
  const at::Tensor code = dynamic_code_tensor(q.scales.device());
  const at::Tensor values = as_blocks(at::index_select(code, 0, q.scales.to(at::kInt)), kNf4ScaleBlockSize);
  return (values * q.scale_scales.unsqueeze(1)).reshape({-1}).narrow(0, 0, n) + q.scale_offset;
}

at::Tensor dequantize_nf4(const QuantizedWeight& q, at::ScalarType dtype) {
  const int64_t n = q.out_features * q.in_features;
  // One lookup per byte: row b of `pairs` is (code[b >> 4], code[b & 15]).
  const at::Tensor code = nf4_code_tensor(q.data.device());
  const at::Tensor byte = at::arange(256, at::TensorOptions().dtype(at::kInt).device(q.data.device()));
  const at::Tensor pairs = at::stack({at::index_select(code, 0, at::bitwise_right_shift(byte, 4)),
                                      at::index_select(code, 0, at::bitwise_and(byte, 15))},
                                     1);
  const at::Tensor values = at::index_select(pairs, 0, q.data.to(at::kInt)).reshape({-1});
  const at::Tensor blocks = as_blocks(values.narrow(0, 0, n), kNf4BlockSize);
  return (blocks * nf4_block_scales(q).unsqueeze(1)).reshape({-1}).narrow(0, 0, n).view({q.out_features, q.in_features}).to(dtype);
}

}  // namespace

BasePrecision parse_base_model_precision(const std::string& name) {
  for (const auto& s : kSupported) {
    if (name == s.name) {
      if (s.mode == WeightQuantization::fp8) require_float8(("base_model_precision " + name).c_str());
      return BasePrecision{name, s.mode, s.double_quantization};
    }
  }
  for (const auto& r : kRefused) {
    if (name == r.name) {
      throw_value_error(std::string(kQuantTag) + "base_model_precision " + name + " is not supported: " + r.why +
                        "; remat supports " + supported_list());
    }
  }
  throw_value_error(std::string(kQuantTag) + "base_model_precision '" + name + "' is not a known precision; remat supports " +
                    supported_list());
}

std::vector<std::string> supported_base_model_precisions() {
  std::vector<std::string> out;
  for (const auto& s : kSupported) out.emplace_back(s.name);
  return out;
}

std::string to_string(WeightQuantization mode) {
  switch (mode) {
    case WeightQuantization::none: return "none";
    case WeightQuantization::int8: return "int8";
    case WeightQuantization::nf4: return "nf4";
    case WeightQuantization::fp8: return "fp8";
  }
  return "unknown";
}

bool float8_supported() { return compat::kHasFloat8; }

const std::array<float, 16>& nf4_code_book() {
  // QLoRA (Dettmers et al. 2023), appendix E / bitsandbytes create_normal_map(offset=0.9677083):
  // 8 positive quantiles of N(0, 1) over [0.5, offset], 7 negative ones, and an exact zero,
  // normalised to [-1, 1]. tests/models/quantization_test.cpp recomputes them from that definition.
  static const std::array<float, 16> book = {
      -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
      -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
      0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
      0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};
  return book;
}

const std::array<float, 256>& dynamic_8bit_code() {
  // bitsandbytes' create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for
  // i = 0..6, the 2^i midpoints of linspace(0.1, 1, 2^i + 1), times +-10^(i - 6); then 0 and 1.
  static const std::array<float, 256> code = [] {
    std::vector<double> values;
    for (int i = 0; i < 7; ++i) {
      const int items = (1 << i) + 1;
      const double magnitude = std::pow(10.0, i - 6);
      for (int k = 0; k + 1 < items; ++k) {
        const double lo = 0.1 + 0.9 * k / (items - 1);
        const double hi = 0.1 + 0.9 * (k + 1) / (items - 1);
        const double mean = (lo + hi) / 2.0;
        values.push_back(magnitude * mean);
        values.push_back(-magnitude * mean);
      }
    }
    values.push_back(0.0);
    values.push_back(1.0);
    std::sort(values.begin(), values.end());
    std::array<float, 256> out{};
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(values[i]);
    return out;
  }();
  return code;
}

int64_t QuantizedWeight::bytes() const {
  int64_t total = 0;
  for (const at::Tensor* t : {&data, &scales, &scale_scales, &scale_offset}) {
    if (t->defined()) total += static_cast<int64_t>(t->nbytes());
  }
  return total;
}

QuantizedWeight QuantizedWeight::to(const at::Device& device) const {
  QuantizedWeight out = *this;
  for (at::Tensor* t : {&out.data, &out.scales, &out.scale_scales, &out.scale_offset}) {
    if (t->defined()) *t = t->to(device);
  }
  return out;
}

QuantizedWeight quantize_weight(const at::Tensor& weight, WeightQuantization mode, bool double_quantization) {
  if (!weight.defined() || weight.dim() != 2 || !at::isFloatingType(weight.scalar_type())) {
    throw_value_error(std::string(kQuantTag) + "quantize_weight needs a 2-D floating (out, in) weight, got " +
                      (weight.defined() ? std::to_string(weight.dim()) + "-D " + c10::toString(weight.scalar_type())
                                        : std::string("an undefined tensor")));
  }
  if (weight.numel() == 0) throw_value_error(std::string(kQuantTag) + "quantize_weight: the weight is empty");
  if (double_quantization && mode != WeightQuantization::nf4) {
    throw_value_error(std::string(kQuantTag) + "double quantisation applies to nf4 only, not " + to_string(mode));
  }
  at::NoGradGuard no_grad;
  QuantizedWeight q;
  switch (mode) {
    case WeightQuantization::none:
      throw_value_error(std::string(kQuantTag) + "quantize_weight: mode none keeps the weight as it is; nothing to quantise");
    case WeightQuantization::int8:
      q = quantize_per_channel(weight, 127.0, at::kChar);
      break;
    case WeightQuantization::nf4:
      q = quantize_nf4(weight, double_quantization);
      break;
    case WeightQuantization::fp8:
      require_float8("fp8 weights");
#if REMAT_HAS_FLOAT8
      q = quantize_per_channel(weight, kFp8E4m3Max, at::kFloat8_e4m3fn);
#endif
      break;
  }
  q.mode = mode;
  q.out_features = weight.size(0);
  q.in_features = weight.size(1);
  return q;
}

at::Tensor dequantize_weight(const QuantizedWeight& weight, at::ScalarType dtype) {
  at::NoGradGuard no_grad;
  switch (weight.mode) {
    case WeightQuantization::int8:
    case WeightQuantization::fp8:
      // In float32, rounded once to `dtype`.
      return (weight.data.to(at::kFloat) * weight.scales.unsqueeze(1)).to(dtype);
    case WeightQuantization::nf4:
      return dequantize_nf4(weight, dtype);
    case WeightQuantization::none:
      break;
  }
  throw_value_error(std::string(kQuantTag) + "dequantize_weight: the weight is not quantised (mode none)");
}

int64_t quantized_weight_bytes(int64_t out_features, int64_t in_features, const BasePrecision& precision) {
  if (out_features < 1 || in_features < 1) {
    throw_value_error(std::string(kQuantTag) + "quantized_weight_bytes: shape (" + std::to_string(out_features) + ", " +
                      std::to_string(in_features) + ") must have both sizes >= 1");
  }
  int64_t n = 0;
  if (__builtin_mul_overflow(out_features, in_features, &n)) {
    throw_value_error(std::string(kQuantTag) + "quantized_weight_bytes: out * in overflows int64");
  }
  switch (precision.mode) {
    case WeightQuantization::int8:
    case WeightQuantization::fp8:
      return n + 4 * out_features;  // one byte per weight, float32 scale per row
    case WeightQuantization::nf4: {
      const int64_t blocks = ceil_div(n, kNf4BlockSize);
      const int64_t data = ceil_div(n, 2);
      if (!precision.double_quantization) return data + 4 * blocks;
      // one byte per block scale, float32 absmax per 256 scales, the float32 mean.
      return data + blocks + 4 * ceil_div(blocks, kNf4ScaleBlockSize) + 4;
    }
    case WeightQuantization::none:
      break;
  }
  throw_value_error(std::string(kQuantTag) + "quantized_weight_bytes: precision " + precision.name +
                    " keeps weights unquantised (their bytes are the training dtype's)");
}

bool is_quantized_linear_name(const std::string& name) {
  // Path segments, so "x.transformer_blocks.3.attn.to_q" (a prefixed model) counts too.
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = name.find('.', start);
    parts.push_back(name.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  for (const auto& p : parts) {
    // LoRA factors stay trainable in their own dtype.
    if (p == "lora_A" || p == "lora_B") return false;
  }
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (parts[i] == "transformer_blocks" || parts[i] == "single_transformer_blocks") return true;
  }
  // The final AdaLN modulation (D -> 2D) is as large as a block's Linears; proj_out (D -> a few
  // channels) and the embedders are small and sit at the model's ends, where error costs most.
  return parts.size() >= 2 && parts[parts.size() - 2] == "norm_out" && parts.back() == "linear";
}

}  // namespace remat::models
