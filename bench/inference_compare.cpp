// remat's side of bench/compare_inference.py: one inference case on weights and an input that the
// script wrote in diffusers' layout, timed and measured the way the script measures diffusers.
//
// usage: inference_compare <work_dir> <work> <fp32|bf16> <threads> [side steps]
//   vae-*:   reads <work_dir>/vae/ (config.json and its weights, found as every remat command finds them) and
//            <work_dir>/input.safetensors ("input": the image, or the latents to decode); the
//            -tiled works tile with <work_dir>/case.json's tile_sample_min_size,
//            tile_latent_min_size and tile_overlap_factor
//   clip:    reads <work_dir>/text_encoder/ and "input_ids"; the output is last_hidden_state and
//            pooler_output, flattened and concatenated
//   t5:      reads <work_dir>/text_encoder_2/ and "input_ids"; the output is last_hidden_state
//   denoise: reads <work_dir>/transformer/, <work_dir>/scheduler/scheduler_config.json and
//            <work_dir>/input.safetensors ("prompt_embeds", "pooled_prompt_embeds"); runs
//            FluxPipeline's loop for a side x side picture in `steps` steps, seed 0, guidance 3.5;
//            denoise-cfg adds "negative_prompt_embeds", "negative_pooled_prompt_embeds" and true CFG 4
//   lora-merge: reads <work_dir>/transformer/ and <work_dir>/lora.safetensors, reads the LoRA and
//            merges it (scale 1); the output is the adapted Linear weights, flattened in the
//            order of their sorted names
//   writes <work_dir>/output_remat.safetensors ("output": the posterior mean, the picture, or the
//          final latents unpacked to (C, side / 8, side / 8))
//   prints one JSON line: seconds, tracked_peak (remat's CPU allocator, bytes above the start of
//          the work: weights and input excluded), rss_peak (VmHWM above the RSS at the start),
//          rss_anon and rss_file (the RSS's anonymous and file-backed parts when the work ends,
//          above the start). Every file-backed mapping is paged in before the start (see
//          page_in_mapped_files), so rss_peak counts the memory the work allocates, not the first
//          execution of library code.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "remat/encoders/autoencoder_kl.h"
#include "remat/encoders/autoencoder_kl_config.h"
#include "remat/encoders/clip_text_model.h"
#include "remat/encoders/t5_encoder.h"
#include "remat/io/safetensors.h"
#include "remat/memory.h"
#include "remat/models/component_weights.h"
#include "remat/models/flux.h"
#include "remat/models/lora_formats.h"
#include "remat/sample/flux_sampler.h"
#include "remat/sample/scheduler.h"
#include "remat/threads.h"
#include "remat/train/family/text_to_image.h"

namespace {

// A line of /proc/self/status ("VmRSS:  1234 kB"), in bytes.
int64_t status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  }
  return -1;
}

// Reads every page of every readable file-backed mapping (the libraries' code and read-only
// data), so that the first execution of a kernel during the measured work does not count: those
// pages are shared, clean and evictable, and which of them a process happens to have touched
// before the work differs between a C++ program and a Python interpreter (CLIP bf16: 14.7 MiB of
// code paged in during remat's encode, 11.6 MiB during transformers', for equal anonymous memory).
// compare_inference.py does the same in the Python worker.
void page_in_mapped_files() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    std::istringstream fields(line);
    std::string range, perms, offset, dev, inode, path;
    fields >> range >> perms >> offset >> dev >> inode >> path;
    if (perms.empty() || perms[0] != 'r' || path.empty() || path[0] != '/' || inode == "0") continue;
    const auto dash = range.find('-');
    const uintptr_t begin = std::stoull(range.substr(0, dash), nullptr, 16);
    const uintptr_t end = std::stoull(range.substr(dash + 1), nullptr, 16);
    for (uintptr_t page = begin; page < end; page += 4096) {
      (void)*reinterpret_cast<const volatile char*>(page);
    }
  }
}

// Resets VmHWM to the current RSS (Linux: proc(5), /proc/pid/clear_refs, value 5).
void reset_rss_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }

// The work of one case, with its weights and inputs loaded before `measure` starts.
struct Case {
  std::function<at::Tensor()> run;
  // For a work whose result is the model itself (lora-merge): gathers the output after the measurement.
  std::function<at::Tensor()> output;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Case vae_case(const std::string& dir, const std::string& work, at::ScalarType dtype) {
  const auto config = remat::encoders::AutoencoderKLConfig::from_file(dir + "/vae/config.json");
  auto vae = remat::encoders::load_autoencoder_kl(remat::models::find_component_weights(dir + "/vae").files, config, dtype);
  if (ends_with(work, "-tiled")) {
    const auto geometry = nlohmann::json::parse(std::ifstream(dir + "/case.json"));
    vae->set_tiling(true);
    vae->set_tile_geometry({geometry.at("tile_sample_min_size").get<int64_t>(),
                            geometry.at("tile_latent_min_size").get<int64_t>(),
                            geometry.at("tile_overlap_factor").get<double>()});
  }
  const at::Tensor input = remat::io::SafetensorsFile::open(dir + "/input.safetensors").tensor("input", dtype);
  if (work.rfind("vae-encode", 0) == 0) return {[vae, input] { return vae.ptr()->encode(input).mean; }};
  return {[vae, input] { return vae.ptr()->decode(input); }};
}

Case clip_case(const std::string& dir, at::ScalarType dtype) {
  const auto config = remat::encoders::ClipTextConfig::from_file(dir + "/text_encoder/config.json");
  auto model =
      remat::encoders::load_clip_text_model(remat::models::find_component_weights(dir + "/text_encoder").files, config, dtype);
  const at::Tensor ids = remat::io::SafetensorsFile::open(dir + "/input.safetensors").tensor("input_ids");
  return {[model, ids] {
    const auto out = model.ptr()->forward(ids);
    return at::cat({out.last_hidden_state.flatten(), out.pooled_output.flatten()});
  }};
}

Case t5_case(const std::string& dir, at::ScalarType dtype) {
  const auto config = remat::encoders::T5Config::from_file(dir + "/text_encoder_2/config.json");
  auto model = remat::encoders::load_t5_encoder(remat::models::open_component_weights(dir + "/text_encoder_2"), config, dtype);
  const at::Tensor ids = remat::io::SafetensorsFile::open(dir + "/input.safetensors").tensor("input_ids");
  return {[model, ids] { return model.ptr()->forward(ids); }};
}

Case lora_merge_case(const std::string& dir, at::ScalarType dtype) {
  remat::train::TransformerSpec spec;
  spec.family = "flux";
  spec.config_json = dir + "/transformer/config.json";
  spec.weights = dir + "/transformer";
  spec.dtype = dtype;
  std::shared_ptr<remat::train::Transformer> model = remat::train::load_transformer_with_loras(spec, {}, {});
  const std::string lora_path = dir + "/lora.safetensors";
  auto adapted_modules = std::make_shared<std::vector<std::string>>();
  auto merge = [model, lora_path, adapted_modules] {
    const remat::models::LoraFile lora = remat::models::read_lora_file(lora_path);
    remat::models::merge_lora(model->module(), lora, 1.0);
    for (const auto& entry : lora.modules) adapted_modules->push_back(entry.first);
    return at::Tensor();
  };
  auto gather = [model, adapted_modules] {
    std::map<std::string, at::Tensor> weights;
    for (const auto& item : model->module().named_parameters()) weights[item.key()] = item.value();
    std::vector<at::Tensor> adapted;
    for (const auto& name : *adapted_modules) adapted.push_back(weights.at(name + ".weight").flatten());
    return at::cat(adapted);
  };
  return {merge, gather};
}

Case denoise_case(const std::string& dir, at::ScalarType dtype, int64_t side, int64_t steps, bool cfg) {
  // Built as `remat sample` builds it (the family's one way), then used as the Flux module it is.
  remat::train::TransformerSpec spec;
  spec.family = "flux";
  spec.config_json = dir + "/transformer/config.json";
  spec.weights = dir + "/transformer";
  spec.dtype = dtype;
  auto model = remat::train::load_transformer_with_loras(spec, {}, {});
  remat::models::Flux transformer(
      std::dynamic_pointer_cast<remat::models::FluxImpl>(model->module().shared_from_this()));
  const auto scheduler =
      remat::sample::FlowMatchSchedulerConfig::from_json_file(dir + "/scheduler/scheduler_config.json");
  const auto file = remat::io::SafetensorsFile::open(dir + "/input.safetensors");
  const remat::sample::PromptEmbeddings prompt{file.tensor("prompt_embeds", dtype),
                                               file.tensor("pooled_prompt_embeds", dtype)};
  remat::sample::PromptEmbeddings negative;
  if (cfg) {
    negative = {file.tensor("negative_prompt_embeds", dtype), file.tensor("negative_pooled_prompt_embeds", dtype)};
  }
  remat::sample::SamplingSettings settings;
  settings.width = settings.height = side;
  settings.num_inference_steps = steps;
  settings.guidance_scale = 3.5;
  settings.true_cfg_scale = 4.0;
  settings.seed = 0;
  return {[transformer, scheduler, prompt, negative, settings, cfg] {
    return remat::sample::denoise(*transformer.ptr(), scheduler, prompt, cfg ? &negative : nullptr, settings);
  }};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5 && argc != 7) {
    std::fprintf(stderr, "usage: inference_compare <work_dir> <vae-encode[-tiled]|vae-decode[-tiled]|clip|t5|denoise|"
                         "denoise-cfg|lora-merge> <fp32|bf16> <threads> [side steps]\n");
    return 2;
  }
  const std::string dir = argv[1], work = argv[2], dtype_name = argv[3];
  remat::memory::install_cpu_tracking();
  remat::memory::reuse_freed_host_memory();  // as the CLI does
  remat::set_cpu_threads(std::stoll(argv[4]));
  const at::ScalarType dtype = dtype_name == "bf16" ? at::kBFloat16 : at::kFloat;
  torch::NoGradGuard no_grad;
  Case c;
  if (work == "denoise" || work == "denoise-cfg") {
    if (argc != 7) throw std::invalid_argument(work + " needs <side> <steps>");
    c = denoise_case(dir, dtype, std::stoll(argv[5]), std::stoll(argv[6]), work == "denoise-cfg");
  } else if (work == "clip") {
    c = clip_case(dir, dtype);
  } else if (work == "t5") {
    c = t5_case(dir, dtype);
  } else if (work == "lora-merge") {
    c = lora_merge_case(dir, dtype);
  } else if (work.rfind("vae-", 0) == 0) {
    c = vae_case(dir, work, dtype);
  } else {
    std::fprintf(stderr, "unknown work '%s'\n", work.c_str());
    return 2;
  }

  page_in_mapped_files();
  reset_rss_peak();
  const int64_t rss_start = status_bytes("VmRSS");
  const int64_t anon_start = status_bytes("RssAnon"), file_start = status_bytes("RssFile");
  remat::memory::PeakScope scope;
  const auto start = std::chrono::steady_clock::now();
  at::Tensor output = c.run();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t tracked = scope.peak_delta(), rss = status_bytes("VmHWM") - rss_start;
  const int64_t rss_anon = status_bytes("RssAnon") - anon_start, rss_file = status_bytes("RssFile") - file_start;
  if (c.output) output = c.output();

  remat::io::save_safetensors(dir + "/output_remat.safetensors", {{"output", output.to(at::kFloat)}});
  std::printf("{\"seconds\": %.6f, \"tracked_peak\": %lld, \"rss_peak\": %lld, \"rss_anon\": %lld, "
              "\"rss_file\": %lld}\n",
              seconds, static_cast<long long>(tracked), static_cast<long long>(rss),
              static_cast<long long>(rss_anon), static_cast<long long>(rss_file));
  return 0;
}
