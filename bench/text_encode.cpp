// Text-encoder cost at Flux's shapes: for each encoder and dtype, the bytes of the weights, the
// median time of one caption's forward pass (inference, no autograd) and the tracked peak that the
// forward adds on top of the weights. Weights are random: the cost does not depend on them.
//
//   text_encode [--encoder clip|all] [--dtype fp32|bf16|all] [--repeats N]
//
// Each encoder is one section (a function below); a new encoder adds its function and its name.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

#include <torch/torch.h>

#include "remat/encoders/clip_text_model.h"
#include "remat/encoders/clip_tokenizer.h"
#include "remat/memory.h"

namespace {

using namespace remat;

constexpr const char* kCaption =
    "a photo of a red fox sitting in the snow at sunrise, soft light, shallow depth of field";

struct Row {
  std::string encoder, dtype;
  int64_t weight_bytes = 0, forward_peak_bytes = 0;
  double median_ms = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// CLIP-L at FluxPipeline's call: one caption, 77 ids, pooled output kept.
Row bench_clip(at::ScalarType dtype, int repeats) {
  // The tiny tokenizer gives real BPE ids for the caption; they are placed between CLIP's own
  // bos/eos ids (49406 / 49407), as the published tokenizer would frame them.
  const auto dir = std::filesystem::temp_directory_path() / ("remat_text_encode_" + std::to_string(::getpid()));
  encoders::write_tiny_clip_tokenizer(dir.string());
  const auto tokenizer = encoders::ClipTokenizer::from_directory(dir.string());
  std::filesystem::remove_all(dir);
  std::vector<int64_t> ids(77, 49407);
  ids[0] = 49406;
  const auto content = tokenizer.content_ids(kCaption);
  for (size_t i = 0; i < content.size() && i < 75; ++i) ids[i + 1] = content[i];
  const auto input = torch::tensor(ids, at::kLong).view({1, 77});

  Row row{"clip-l", dtype == at::kBFloat16 ? "bf16" : "fp32"};
  const int64_t before = memory::current_bytes();
  encoders::ClipTextModel model(encoders::ClipTextConfig::clip_l());
  model->to(dtype);
  model->eval();
  row.weight_bytes = memory::current_bytes() - before;

  torch::NoGradGuard no_grad;
  model->forward(input);  // warm-up
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    memory::PeakScope scope;
    const auto t0 = std::chrono::steady_clock::now();
    const auto out = model->forward(input);
    const auto t1 = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    row.forward_peak_bytes = std::max(row.forward_peak_bytes, scope.peak_delta());
  }
  row.median_ms = median(ms);
  return row;
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "text_encode: %s\nusage: text_encode [--encoder clip|all] [--dtype fp32|bf16|all] [--repeats N]\n",
               why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  memory::install_cpu_tracking();
  std::string encoder = "all", dtype = "all";
  int repeats = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) usage(("missing value after " + arg).c_str());
    const std::string value = argv[++i];
    if (arg == "--encoder") encoder = value;
    else if (arg == "--dtype") dtype = value;
    else if (arg == "--repeats") repeats = std::atoi(value.c_str());
    else usage(("unknown flag " + arg).c_str());
  }
  const std::map<std::string, std::function<Row(at::ScalarType, int)>> sections = {{"clip", bench_clip}};
  if (encoder != "all" && !sections.count(encoder)) usage(("--encoder must be clip or all, got " + encoder).c_str());
  if (dtype != "all" && dtype != "fp32" && dtype != "bf16") usage(("--dtype must be fp32, bf16 or all, got " + dtype).c_str());
  if (repeats < 1 || repeats > 1000) usage("--repeats must be in [1, 1000]");

  std::vector<at::ScalarType> dtypes;
  if (dtype != "bf16") dtypes.push_back(at::kFloat);
  if (dtype != "fp32") dtypes.push_back(at::kBFloat16);
  std::printf("| encoder | dtype | weights | forward peak (above weights) | median ms (%d runs, %d threads) |\n", repeats,
              at::get_num_threads());
  std::printf("| --- | --- | --- | --- | --- |\n");
  for (const auto& [name, run] : sections) {
    if (encoder != "all" && encoder != name) continue;
    for (auto dt : dtypes) {
      const Row r = run(dt, repeats);
      std::printf("| %s | %s | %s | %s | %.1f |\n", r.encoder.c_str(), r.dtype.c_str(),
                  memory::format_bytes(r.weight_bytes).c_str(), memory::format_bytes(r.forward_peak_bytes).c_str(),
                  r.median_ms);
    }
  }
  return 0;
}
