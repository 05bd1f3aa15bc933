// `remat encode`: loads a diffusers pipeline folder's encoders (those of the family its
// model_index.json names) and turns a picture and a caption into the transformer's inputs, to
// check a setup end to end. With --output, writes them as one latent-cache sample (latents,
// prompt_embeds and, for families with one, pooled_prompt_embeds) that training reads as it is.
#include <chrono>
#include <iostream>

#include <torch/torch.h>

#include "command.h"
#include "parse_args.h"
#include "remat/threads.h"
#include "remat/encoders/model_encoders.h"
#include "remat/image/image_file.h"
#include "remat/util/error.h"
#include "remat/util/files.h"
#include "remat/io/safetensors.h"
#include "remat/memory.h"
#include "remat/train/family/text_to_image.h"
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
  CLI::App app{"Load a diffusers pipeline folder's VAE and text encoders (its model family's); encode a "
               "picture to latents and a caption to prompt embeddings; print them and optionally write them "
               "as a latent-cache sample.",
               "remat encode"};
  std::string folder, vae_override, image_path, output, dtype = "bfloat16", latents_mode = "sample";
  std::optional<std::string> caption;
  int64_t max_length = 512, seed = 0, threads = 0;
  bool tiling = false;
  app.add_option("--pretrained_model_name_or_path", folder,
                 "A diffusers pipeline folder (model_index.json and its components; for FLUX.1: vae/, "
                 "text_encoder/, text_encoder_2/, tokenizer/, tokenizer_2/)")->required();
  app.add_option("--pretrained_vae_model_name_or_path", vae_override,
                 "Take the VAE from this pipeline or VAE folder instead");
  app.add_option("--image", image_path, "A picture (PNG, JPEG, ...); centre-cropped to the family's latent grid "
                                 "for this folder's VAE (16 pixels for FLUX.1)");
  app.add_option("--caption", caption, "A caption");
  app.add_option("--output", output, "Write latents / prompt_embeds / pooled_prompt_embeds here (.safetensors)");
  app.add_option("--dtype", dtype, "Encoder weights and computation")
      ->check(CLI::IsMember({"bfloat16", "float32"}))->capture_default_str();
  app.add_option("--tokenizer_max_length", max_length,
                 "Text tokens per caption (unset: the pipeline's default, FluxPipeline's 512 or MageFlow's 2048)")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
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

  const train::ModelFamily& family = train::family_of_pipeline(folder);
  const encoders::FamilyEncoders& family_encoders = family.encoders;
  if (app.count("--tokenizer_max_length") == 0) max_length = family.pipeline_defaults.max_sequence_length;
  if (!family_encoders.available()) {
    throw_value_error("[encode] remat has no encoders for the " + family.name + " family of '" + folder + "'");
  }
  const bool encode_image = !image_path.empty(), encode_text = caption.has_value();
  std::map<std::string, encoders::ComponentOverride> overrides;
  if (!vae_override.empty()) overrides["vae"] = encoders::ComponentOverride{vae_override, std::nullopt};
  const auto pipeline = encoders::PipelineFolder::open(
      folder, family_encoders.components(encode_text, encode_image), overrides, family_encoders.layout);
  encoders::EncoderSettings settings;
  settings.dtype = dtype == "float32" ? at::kFloat : at::kBFloat16;
  settings.max_sequence_length = max_length;

  std::vector<io::NamedTensor> sample;
  if (encode_image) {
    auto start = std::chrono::steady_clock::now();
    const auto autoencoder = family_encoders.load_image(pipeline, settings);
    std::printf("loaded the autoencoder in %.2f s (%s)\n", seconds_since(start), dtype.c_str());
    if (tiling) autoencoder->set_tiling(true);
    const auto picture = image::read_image(image_path);
    // The family's latent grid for this folder's autoencoder (for FLUX.1: 8x downsampling, then 2x2 packing).
    const int64_t multiple = family.latents.spatial_multiple * family_encoders.vae_scale_factor(pipeline);
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
    const auto latents = autoencoder->encode_image(image::picture_to_vae_input(cropped), generator);
    std::cout << "latents (" << latents_mode << "): " << describe(latents) << "  [" << seconds_since(start) << " s]\n";
    sample.emplace_back("latents", latents);
  }
  if (encode_text) {
    auto start = std::chrono::steady_clock::now();
    const auto text_encoders = family_encoders.load_text(pipeline, settings);
    std::printf("loaded the text encoders in %.2f s (%s)\n", seconds_since(start), dtype.c_str());
    start = std::chrono::steady_clock::now();
    const auto encoded = text_encoders->encode_caption(*caption);
    for (const auto& warning : encoded.warnings) std::cout << "warning: " << warning << "\n";
    std::cout << "prompt_embeds: " << describe(encoded.prompt_embeds) << "\n";
    sample.emplace_back("prompt_embeds", encoded.prompt_embeds);
    if (encoded.pooled_prompt_embeds.defined()) {
      std::cout << "pooled_prompt_embeds: " << describe(encoded.pooled_prompt_embeds) << "\n";
      sample.emplace_back("pooled_prompt_embeds", encoded.pooled_prompt_embeds);
    }
    std::cout << "[" << seconds_since(start) << " s]\n";
  }
  std::cout << "peak memory (tracked): " << memory::format_bytes(memory::peak_bytes()) << "\n";
  if (!output.empty()) {
    io::save_safetensors(output, sample);
    const bool whole = encode_image && encode_text;
    std::cout << "wrote " << output << (whole ? " (a latent-cache sample)" : "") << "\n";
  }
  return 0;
}

REMAT_COMMAND("encode", "encode a picture and a caption with a pipeline folder's VAE and text encoders", run_encode);

}  // namespace
}  // namespace remat::cli
