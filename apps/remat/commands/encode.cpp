// `remat encode`: loads Flux's encoders from a diffusers pipeline folder and turns a picture and
// a caption into the transformer's inputs, to check a setup end to end. With --output, writes
// them as one latent-cache sample (latents, prompt_embeds, pooled_prompt_embeds) that training
// reads as it is.
#include <chrono>
#include <iostream>

#include <torch/torch.h>

#include "command.h"
#include "parse_args.h"
#include "remat/threads.h"
#include "remat/encoders/flux_encoders.h"
#include "remat/image/image_file.h"
#include "remat/util/error.h"
#include "remat/util/files.h"
#include "remat/io/safetensors.h"
#include "remat/memory.h"
#include "remat/train/run/startup_checks.h"

namespace remat::cli {
namespace {

std::string describe(const at::Tensor& t) {
  const auto f = t.to(at::kDouble);
  return c10::str(t.sizes(), " ", t.scalar_type(), ", mean ", f.mean().item<double>(), ", std ",
                  f.numel() > 1 ? f.std().item<double>() : 0.0);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int run_encode(const std::vector<std::string>& args) {
  CLI::App app{"Load Flux's VAE and text encoders from a diffusers pipeline folder; encode a picture to "
               "latents and a caption to prompt embeddings; print them and optionally write them as a "
               "latent-cache sample.",
               "remat encode"};
  std::string folder, vae_override, image_path, output, dtype = "bfloat16", latents_mode = "sample";
  std::optional<std::string> caption;
  int64_t max_length = 512, seed = 0, threads = 0;
  bool tiling = false;
  app.add_option("--pretrained_model_name_or_path", folder,
                 "A diffusers Flux pipeline folder (model_index.json, vae/, text_encoder/, text_encoder_2/, "
                 "tokenizer/, tokenizer_2/)")->required();
  app.add_option("--pretrained_vae_model_name_or_path", vae_override,
                 "Take the VAE from this pipeline or VAE folder instead");
  app.add_option("--image", image_path, "A picture (PNG, JPEG, ...); centre-cropped to a multiple of twice the VAE's downscale "
                                 "(16 pixels for FLUX.1)");
  app.add_option("--caption", caption, "A caption");
  app.add_option("--output", output, "Write latents / prompt_embeds / pooled_prompt_embeds here (.safetensors)");
  app.add_option("--dtype", dtype, "Encoder weights and computation")
      ->check(CLI::IsMember({"bfloat16", "float32"}))->capture_default_str();
  app.add_option("--tokenizer_max_length", max_length,
                 "T5 tokens per caption (FluxPipeline's max_sequence_length: 512 for dev, 256 for schnell)")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}))->capture_default_str();
  app.add_option("--latents", latents_mode, "The posterior's sample (as training caches it) or its mean")
      ->check(CLI::IsMember({"sample", "mean"}))->capture_default_str();
  add_registry_option(app, "seed", seed);
  app.add_flag("--vae_enable_tiling", tiling, "Encode in overlapping tiles (bounded memory for large pictures)");
  add_registry_option(app, "torch_num_threads", threads);
  if (auto code = parse_or_exit(app, args)) return *code;
  if (image_path.empty() && !caption) {
    throw_value_error("[encode] nothing to encode: give --image, --caption or both");
  }
  std::cout << "threads: " << describe(set_cpu_threads(threads)) << "\n";

  // Every path is checked before anything loads.
  if (!image_path.empty()) util::require_regular_file(image_path, "encode", "--image");
  if (!output.empty()) train::check_output_file(output, "--output");

  encoders::FluxEncodersOptions options;
  options.dtype = dtype == "float32" ? at::kFloat : at::kBFloat16;
  options.max_sequence_length = max_length;
  options.load_vae = !image_path.empty();
  options.load_text = caption.has_value();
  std::map<std::string, encoders::ComponentOverride> overrides;
  if (!vae_override.empty()) overrides["vae"] = encoders::ComponentOverride{vae_override, std::nullopt};
  const auto pipeline =
      encoders::PipelineFolder::open(folder, encoders::flux_encoder_components(options), overrides);

  auto start = std::chrono::steady_clock::now();
  auto flux = encoders::FluxEncoders::load(pipeline, options);
  std::printf("loaded in %.2f s (%s):\n", seconds_since(start), dtype.c_str());
  for (const auto& c : flux.loaded()) {
    std::printf("  %-15s %14lld parameters  %12s  %s\n", c.name.c_str(), static_cast<long long>(c.parameters),
                memory::format_bytes(c.bytes).c_str(), c.directory.c_str());
  }

  std::vector<io::NamedTensor> sample;
  if (!image_path.empty()) {
    if (tiling) flux.vae()->set_tiling(true);
    const auto picture = image::read_image(image_path);
    const auto multiple = 2 * flux.vae_scale_factor();
    const auto cropped = image::center_crop_to_multiple(picture, multiple);
    std::cout << "image " << image_path << ": " << picture.size(1) << " x " << picture.size(0);
    if (!cropped.sizes().equals(picture.sizes())) {
      std::cout << ", centre-cropped to " << cropped.size(1) << " x " << cropped.size(0);
    }
    std::cout << "\n";
    c10::optional<at::Generator> generator;
    if (latents_mode == "sample") {
      generator = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed));
    }
    start = std::chrono::steady_clock::now();
    const auto latents = flux.encode_image(image::picture_to_vae_input(cropped), generator);
    std::cout << "latents (" << latents_mode << "): " << describe(latents) << "  [" << seconds_since(start) << " s]\n";
    sample.emplace_back("latents", latents);
  }
  if (caption) {
    start = std::chrono::steady_clock::now();
    const auto embeddings = flux.encode_prompt(*caption);
    for (const auto& warning : embeddings.warnings) std::cout << "warning: " << warning << "\n";
    std::cout << "caption: " << embeddings.clip_content_tokens << " CLIP tokens, " << embeddings.t5_content_tokens
              << " T5 tokens\n";
    std::cout << "prompt_embeds (T5): " << describe(embeddings.prompt_embeds) << "\n";
    std::cout << "pooled_prompt_embeds (CLIP): " << describe(embeddings.pooled_prompt_embeds) << "  ["
              << seconds_since(start) << " s]\n";
    sample.emplace_back("prompt_embeds", embeddings.prompt_embeds);
    sample.emplace_back("pooled_prompt_embeds", embeddings.pooled_prompt_embeds);
  }
  std::cout << "peak memory (tracked): " << memory::format_bytes(memory::peak_bytes()) << "\n";
  if (!output.empty()) {
    io::save_safetensors(output, sample);
    std::cout << "wrote " << output << (sample.size() == 3 ? " (a latent-cache sample)" : "") << "\n";
  }
  return 0;
}

REMAT_COMMAND("encode", "encode a picture and a caption with a pipeline folder's VAE and text encoders", run_encode);

}  // namespace
}  // namespace remat::cli
