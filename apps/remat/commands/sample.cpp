// `remat sample`: text to image with a diffusers Flux pipeline folder and any number of LoRAs
// (remat/sample/pipeline.h). Writes one PNG per prompt with the generation parameters in PNG text
// chunks; progress per denoising step goes to stderr.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <sstream>

#include <torch/torch.h>

#include "string_helpers.h"
#include "command.h"
#include "parse_args.h"
#include "remat/threads.h"
#include "remat/util/error.h"
#include "remat/util/files.h"
#include "remat/memory.h"
#include "remat/io/hub_cache.h"
#include "remat/models/component_weights.h"
#include "remat/sample/pipeline.h"
#include "remat/image/png_file.h"
#include "remat/train/memory/base_precision.h"
#include "remat/train/run/startup_checks.h"
#include "remat/train/family/text_to_image.h"
#include "utf8.h"

namespace remat::cli {
namespace {

constexpr uint64_t kMaxPromptFileBytes = uint64_t{16} << 20;

// One prompt per line; blank lines are skipped, a trailing '\r' (Windows line ends) dropped.
std::vector<std::string> read_prompt_file(const std::string& path) {
  const std::string text = util::read_regular_file(path, kMaxPromptFileBytes, "sample", "--prompt_file");
  std::vector<std::string> prompts;
  std::istringstream lines(text);
  std::string line;
  for (int64_t number = 1; std::getline(lines, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (const auto bad = remat::detail::invalid_utf8_at(line)) {
      throw_value_error("[sample] --prompt_file '" + path + "' line " + std::to_string(number) +
                        " is not valid UTF-8 (byte " + std::to_string(*bad + 1) + "): '" + remat::detail::printable_utf8(line) +
                        "'");
    }
    if (line.find_first_not_of(" \t") != std::string::npos) prompts.push_back(line);
  }
  if (prompts.empty()) throw_value_error("[sample] --prompt_file '" + path + "' holds no prompt (one per line)");
  return prompts;
}

// --output as given for one picture; for several, <stem>_<i><ext> with i = 001, 002, ... in
// prompt order (the width grows past 999 pictures), next to it.
std::vector<std::string> output_paths(const std::string& output, size_t count) {
  if (count == 1) return {output};
  const std::filesystem::path path(output);
  const size_t width = std::max<size_t>(3, std::to_string(count).size());
  std::vector<std::string> paths;
  for (size_t i = 1; i <= count; ++i) {
    std::string index = std::to_string(i);
    index.insert(0, width - index.size(), '0');
    paths.push_back((path.parent_path() / (path.stem().string() + "_" + index + path.extension().string())).string());
  }
  return paths;
}

std::string number_text(double value) {
  std::ostringstream out;
  out << value;  // shortest form people write: 3.5, 1, 0.75
  return out.str();
}

c10::Device parse_device(const std::string& text) {
  std::optional<c10::Device> device;
  try {
    device = c10::Device(text);
  } catch (const c10::Error&) {
  }
  if (!device || !(device->is_cpu() || device->is_cuda())) {
    throw_value_error("[sample] --device must be cpu, cuda or cuda:N, got '" + text + "'");
  }
  if (device->is_cuda() && !torch::cuda::is_available()) {
    throw_value_error("[sample] --device " + text + ": this build or machine has no CUDA device");
  }
  return *device;
}

int run_sample(const std::vector<std::string>& args) {
  CLI::App app{"Text to image with a diffusers Flux or MageFlow pipeline folder (FluxPipeline, MageFlowPipeline: "
               "flow-matching Euler with the scheduler config's shift) and any number of LoRAs. Writes PNGs with "
               "the prompt, seed, "
               "steps, guidance and model in PNG text chunks.",
               "remat sample"};
  std::string folder, output, prompt_file, dtype = "bfloat16", device_text = "cpu";
  std::vector<std::string> prompts, lora_texts;
  std::optional<std::string> negative_prompt;
  sample::SamplingSettings settings;
  int64_t seed = 0, max_length = 512, tiling_above = 1024, threads = 0;
  std::string revision = "main";
  std::string variant;
  std::optional<std::string> image;
  int64_t max_area = 1024 * 1024;
  bool image_auto_resize = true;
  app.add_option("--pipeline,--pretrained_model_name_or_path", folder,
                 "A diffusers Flux pipeline folder (model_index.json, transformer/, vae/, text_encoder/, "
                 "text_encoder_2/, tokenizer/, tokenizer_2/, scheduler/) or a MageFlow one (transformer/, vae/, "
                 "text_encoder/, scheduler/), or the Hugging Face model id of one "
                 "in the local hub cache (never downloaded)")
      ->required();
  app.add_option("--revision", revision, "The revision of a --pipeline given as a hub id: a branch, a tag or a "
                 "commit hash")
      ->capture_default_str();
  app.add_option("--variant", variant, "The weights variant to read (diffusers' variant=): every component's "
                 "<name>.<variant>.safetensors, e.g. fp16; unset: the plain files");
  app.add_option("--prompt", prompts, "A prompt (repeat for several pictures)");
  app.add_option("--prompt_file", prompt_file, "A text file with one prompt per line (blank lines skipped)");
  app.add_option("--negative_prompt", negative_prompt,
                 "The negative prompt of true classifier-free guidance (used when --true_cfg_scale > 1)");
  app.add_option("--width", settings.width, "Picture width in pixels, a multiple of the family's latent grid "
                 "(16 for FLUX.1)")->capture_default_str();
  app.add_option("--height", settings.height, "Picture height in pixels, a multiple of the family's latent grid "
                 "(16 for FLUX.1)")->capture_default_str();
  app.add_option("--num_inference_steps", settings.num_inference_steps,
                 "Denoising steps (unset: the pipeline's default, FluxPipeline's 28, MageFlowPipeline's 20)")
      ->check(CLI::Range(int64_t{1}, sample::kMaxInferenceSteps))
      ->capture_default_str();
  app.add_option("--guidance_scale", settings.guidance_scale,
                 "The embedded guidance of guidance-distilled models (FLUX.1-dev; ignored by models without it), "
                 "or with MageFlow pipelines the scale of CFG-Zero* on --negative_prompt (unset: 5.0)")
      ->capture_default_str();
  app.add_option("--true_cfg_scale", settings.true_cfg_scale,
                 "True classifier-free guidance: > 1 with --negative_prompt runs a second transformer pass per "
                 "step")
      ->capture_default_str();
  app.add_option("--seed", seed, "Seed of the initial noise; every prompt uses it (same seed, same picture)")
      ->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()))
      ->capture_default_str();
  app.add_option("--image", image,
                 "FLUX.1 Kontext pipelines (model_index.json FluxKontextPipeline): the picture every prompt edits; "
                 "its VAE latents condition each denoising step");
  app.add_option("--max_area", max_area,
                 "FLUX.1 Kontext pipelines: pixels of each picture made, at the aspect ratio of --width / --height "
                 "(FluxKontextPipeline's max_area)")
      ->check(CLI::Range(int64_t{1}, sample::kMaxSampleSide * sample::kMaxSampleSide))
      ->capture_default_str();
  app.add_option("--image_auto_resize", image_auto_resize,
                 "FLUX.1 Kontext pipelines: resize --image to the preferred Kontext resolution nearest its aspect "
                 "ratio (FluxKontextPipeline's _auto_resize); false: keep its size, floored to the latent grid")
      ->capture_default_str();
  app.add_option("--lora", lora_texts,
                 "A LoRA file (PEFT/diffusers, kohya, Black Forest Labs or XLabs form) merged into the "
                 "transformer, PATH or PATH:SCALE (default scale 1); repeat for several. A folder, or a Hugging "
                 "Face model id in the local hub cache (revision main), gives its pytorch_lora_weights.safetensors "
                 "or its one .safetensors file");
  app.add_option("--output", output,
                 "The PNG to write; with several prompts, <stem>_001.png, <stem>_002.png, ... in prompt order")
      ->required();
  app.add_option("--dtype", dtype, "Weights and computation of every model")
      ->check(CLI::IsMember({"bfloat16", "float32", "bf16", "fp32"}))
      ->capture_default_str();
  app.add_option("--device", device_text,
                 "Where the text encoders, the transformer and the VAE run (one at a time): cpu, cuda or cuda:N")
      ->capture_default_str();
  app.add_option("--tokenizer_max_length,--max_sequence_length", max_length,
                 "Text tokens per prompt (the pipeline's max_sequence_length; unset: its default, FluxPipeline's "
                 "512 or MageFlowPipeline's 2048)")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app.add_option("--vae_tiling_above", tiling_above,
                 "The VAE decodes in tiles when the width or height exceeds this many pixels (0: always)")
      ->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()))
      ->capture_default_str();
  std::string base_model_precision = "no_change";
  app.add_option("--base_model_precision", base_model_precision,
                 "The transformer's base weights, SimpleTuner's names: no_change, int8-quanto / int8-torchao "
                 "(int8, one scale per output channel), nf4-bnb (QLoRA NF4 with double quantisation); fp8-quanto "
                 "/ fp8wo-torchao need LibTorch 2.1+. Quantised while loading; LoRAs are merged per layer")
      ->capture_default_str();
  add_registry_option(app, "torch_num_threads", threads);
  if (auto code = parse_or_exit(app, args)) return *code;
  std::cout << "threads: " << describe(set_cpu_threads(threads)) << "\n";

  // Everything is checked before any model loads (remat/sample/pipeline.h checks the rest).
  if (!prompt_file.empty()) {
    for (auto& p : read_prompt_file(prompt_file)) prompts.push_back(std::move(p));
  }
  if (prompts.empty()) throw_value_error("[sample] nothing to sample: give --prompt or --prompt_file");
  const std::string extension = remat::detail::lower(std::filesystem::path(output).extension().string());
  if (extension != ".png") throw_value_error("[sample] --output must name a .png file, got '" + output + "'");
  train::check_output_file(output, "--output");
  settings.seed = static_cast<uint64_t>(seed);

  if (const auto snapshot = io::hub_snapshot_unless_local(folder, revision, {"model_index.json"}, "sample")) {
    std::cout << "pipeline: " << folder << " at revision " << revision << " (commit " << snapshot->commit
              << ") from the Hugging Face cache: " << snapshot->directory << "\n";
    folder = snapshot->directory;
  }

  // The pipeline's own defaults for what was left unset; with MageFlow's pipelines guidance_scale is
  // classifier-free guidance on the negative prompt (train::ModelFamily::guidance_is_cfg).
  const train::ModelFamily& family = train::family_of_pipeline(folder);
  const train::PipelineDefaults& defaults = family.pipeline_defaults;
  if (app.count("--num_inference_steps") == 0) settings.num_inference_steps = defaults.num_inference_steps;
  if (app.count("--guidance_scale") == 0) settings.guidance_scale = defaults.guidance_scale;
  if (app.count("--tokenizer_max_length") == 0) max_length = defaults.max_sequence_length;
  if (family.guidance_is_cfg && app.count("--true_cfg_scale") == 0) settings.true_cfg_scale = settings.guidance_scale;

  sample::PipelineOptions options;
  options.folder = folder;
  if (!variant.empty()) models::check_weights_variant(variant);
  options.variant = variant;
  options.dtype = dtype == "float32" || dtype == "fp32" ? at::kFloat : at::kBFloat16;
  options.device = parse_device(device_text);
  options.max_sequence_length = max_length;
  options.vae_tiling_above = tiling_above;
  options.base_model_precision = train::parse_base_model_precision_option(base_model_precision, "sample");
  options.max_area = max_area;
  options.image_auto_resize = image_auto_resize;
  for (const auto& text : lora_texts) {
    sample::LoraSpec spec = sample::parse_lora_spec(text);
    std::string from_hub;
    spec.path = sample::lora_file_of(spec.path, "main", &from_hub);
    if (!from_hub.empty()) std::cout << "LoRA: " << from_hub << " -> " << spec.path << "\n";
    options.loras.push_back(spec);
  }

  std::vector<sample::SampleRequest> requests;
  for (const auto& p : prompts) requests.push_back({p, negative_prompt, image, settings});
  const std::vector<std::string> paths = output_paths(output, requests.size());

  std::string loras;
  for (const auto& l : options.loras) loras += (loras.empty() ? "" : ", ") + l.path + ":" + number_text(l.scale);
  auto png_text = [&](const sample::SampleRequest& r) {
    image::PngText text{
        {"prompt", r.prompt},
        {"negative_prompt", r.negative_prompt.value_or("")},
        {"seed", std::to_string(r.settings.seed)},
        {"steps", std::to_string(r.settings.num_inference_steps)},
        {"guidance", number_text(r.settings.guidance_scale)},
        {"true_cfg_scale", number_text(r.settings.true_cfg_scale)},
        {"width", std::to_string(r.settings.width)},
        {"height", std::to_string(r.settings.height)},
        {"model", folder},
        {"loras", loras},
        {"base_model_precision", base_model_precision},
        {"software", "remat"},
    };
    if (r.image) text.insert(text.end() - 1, {"image", *r.image});  // a Kontext edit: its input picture
    return text;
  };

  // A run killed while writing left its temporaries; this run writes the same files.
  for (const auto& path : paths) {
    for (const auto& stale : util::remove_stale_temporaries(path)) {
      std::cerr << "remat sample: removed " << stale << ", left by an interrupted write\n";
    }
  }
  // A prompt the PNG cannot record (not UTF-8, a NUL) fails now, not after the sampling.
  for (size_t i = 0; i < requests.size(); ++i) image::check_png_text(png_text(requests[i]), paths[i]);

  sample::PipelineEvents events;
  auto step_start = std::chrono::steady_clock::now();
  events.on_stage = [&](const std::string& line) {
    std::cerr << "remat sample: " << line << "\n";
    step_start = std::chrono::steady_clock::now();  // a picture's first step is timed from its stage line
  };
  events.on_warning = [](const std::string& line) { std::cerr << "remat sample: warning: " << line << "\n"; };
  events.on_step = [&](size_t index, int64_t step, int64_t steps) {
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - step_start).count();
    step_start = now;
    std::fprintf(stderr, "remat sample: picture %zu/%zu step %lld/%lld (%.2f s)\n", index + 1, requests.size(),
                 static_cast<long long>(step), static_cast<long long>(steps), seconds);
  };
  events.on_image = [&](size_t index, const at::Tensor& pixels) {
    // The size made (a Kontext pipeline makes its pictures at --max_area).
    image::PngText text = png_text(requests[index]);
    for (auto& [key, value] : text) {
      if (key == "width") value = std::to_string(pixels.size(1));
      if (key == "height") value = std::to_string(pixels.size(0));
    }
    image::write_png(paths[index], pixels, text);
    std::cout << "wrote " << paths[index] << " (" << pixels.size(1) << " x " << pixels.size(0) << ")\n";
  };
  train::run_text_to_image(options, requests, events);
  std::cerr << "remat sample: peak memory (tracked CPU tensors): " << memory::format_bytes(memory::peak_bytes())
            << "\n";
  return 0;
}

REMAT_COMMAND("sample", "text to image with a Flux pipeline folder and LoRAs, written as PNG", run_sample);

}  // namespace
}  // namespace remat::cli
