// `remat plan`: the memory layout of a training run for a device-memory budget, from the training
// options alone (no weight is loaded): checkpointing, activation offload and block swap chosen
// together (remat/train/memory/training_plan.h).
#include <cmath>
#include <iostream>
#include <optional>
#include <sstream>

#include "command.h"
#include "remat/byte_size.h"
#include "remat/memory.h"
#include "remat/threads.h"
#include "remat/train/memory/training_plan.h"
#include "remat/train/options/config.h"
#include "remat/util/error.h"

namespace remat::cli {
namespace {

constexpr const char* kPlanUsage =
    "usage: remat plan [--config FILE] [training options] --budget SIZE[,SIZE...] [--host_budget SIZE]\n"
    "                  [--device_tflops N] [--host_bandwidth SIZE]\n"
    "\n"
    "Chooses, for a device-memory budget, which blocks keep their activations, which are\n"
    "recomputed or offloaded, and how many blocks stream their weights from host memory\n"
    "(musubi_blocks_to_swap), from the model's config alone: no weight is loaded. The training\n"
    "options are `remat train`'s (e.g. --model_family flux --model_flavour dev --model_type lora\n"
    "--lora_rank 16 --resolution 1024 --base_model_precision nf4-bnb --train_batch_size 1).\n"
    "\n"
    "  --budget SIZE        device memory a step must fit (e.g. 8GiB, 24GB); a comma list plans each\n"
    "  --host_budget SIZE   host memory the streamed weights and offloaded activations may take\n"
    "  --device_tflops N    stated throughput of the blocks' matrix products (default 400)\n"
    "  --host_bandwidth S   stated host-to-device copy bandwidth per second (default 20GB)\n"
    "\n"
    "Prints one line per group of blocks, `predicted device peak: N`, the host memory, the\n"
    "predicted step-time factor and the `remat train` options that run the plan. A budget\n"
    "nothing fits is an error (exit 2) naming the smallest peak reachable and with what.\n";

struct PlanFlags {
  std::vector<int64_t> budgets;
  std::optional<int64_t> host_budget;
  double device_tflops = 400.0;
  double host_bandwidth = 20e9;
};

std::vector<int64_t> parse_budgets(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const int64_t bytes = parse_byte_size(item, "--budget");
    if (bytes <= 0) throw_value_error("--budget must be more than 0 bytes, got '" + item + "'");
    out.push_back(bytes);
  }
  if (out.empty()) throw_value_error("--budget must name a size (e.g. 8GiB), got '" + text + "'");
  return out;
}

double parse_plan_positive(const std::string& flag, const std::string& text) {
  size_t used = 0;
  double value = 0.0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || !(value > 0.0) || !std::isfinite(value)) {
    throw_value_error(flag + " must be a number above 0, got '" + text + "'");
  }
  return value;
}

// Takes plan's own flags out of `args` (--flag=value or --flag value); the rest are training options.
PlanFlags take_plan_flags(std::vector<std::string>& args) {
  PlanFlags flags;
  std::vector<std::string> rest;
  bool budget_given = false;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i], value;
    const auto eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (name != "--budget" && name != "--host_budget" && name != "--device_tflops" && name != "--host_bandwidth") {
      rest.push_back(args[i]);
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) throw_value_error(name + " needs a value");
      value = args[++i];
    }
    if (name == "--budget") {
      flags.budgets = parse_budgets(value);
      budget_given = true;
    } else if (name == "--host_budget") {
      flags.host_budget = parse_byte_size(value, "--host_budget");
      if (*flags.host_budget <= 0) throw_value_error("--host_budget must be more than 0 bytes, got '" + value + "'");
    } else if (name == "--device_tflops") {
      flags.device_tflops = parse_plan_positive(name, value);
    } else {
      flags.host_bandwidth = static_cast<double>(parse_byte_size(value, "--host_bandwidth"));
      if (flags.host_bandwidth <= 0) throw_value_error("--host_bandwidth must be more than 0 bytes, got '" + value + "'");
    }
  }
  if (!budget_given) throw_value_error("--budget is required: the device memory a step must fit (e.g. --budget 8GiB)");
  args = rest;
  return flags;
}

// What the options could change when no plan fits: the shapes always; then a LoRA instead of
// a full fine-tune, or a smaller base than the one given.
std::string what_else_fits(const train::TrainConfig& config) {
  std::string out = "lower the resolution or the batch size";
  if (config.model_type != "lora") return out + ", or train a LoRA (model_type lora) on a quantised base";
  if (config.base_model_precision == "no_change") return out + ", or quantise the base (base_model_precision int8-quanto or nf4-bnb)";
  if (config.base_model_precision != "nf4-bnb") return out + ", or store the base in NF4 (base_model_precision nf4-bnb)";
  return out;
}

int run_plan(const std::vector<std::string>& given) {
  for (const auto& a : given) {
    if (a == "--help" || a == "-h") {
      std::cout << kPlanUsage;
      return 0;
    }
  }
  std::vector<std::string> args = given;
  const PlanFlags flags = take_plan_flags(args);  // throws: exit 2
  std::vector<std::string> warnings;
  // Planned for the device the options name; "auto" plans for an accelerator, as on a GPU machine.
  const train::TrainConfig config = train::load_train_config(args, warnings, train::Environment(/*cuda=*/true));
  for (const auto& warning : warnings) std::cerr << "warning: " << warning << "\n";

  set_cpu_threads(config.torch_num_threads);  // the proxies' profiles run on the CPU
  train::TrainingPlanRequest request = train::plan_request_of(config, flags.budgets.front(), flags.host_budget);
  request.device_flops = flags.device_tflops * 1e12;
  request.host_bandwidth = flags.host_bandwidth;
  std::cerr << "[plan] measuring the memory model: the architecture 1 to 4 heads wide, tokens in proportion "
               "(docs/FIT_IN_N_GB.md)\n";
  const train::StepMemoryModel model = train::build_step_memory_model(request);

  // A config.json given as a path is named; the flavour's shapes otherwise.
  const std::string model_name = request.spec.config_json
                                     ? config.model_family + " (the model of " + *request.spec.config_json + ")"
                                     : config.model_family + " " + config.model_flavour;
  std::cout << "remat plan: " << model_name << ", "
            << (request.lora_rank > 0 ? "LoRA rank " + std::to_string(request.lora_rank) + " (" + request.lora_target + ")"
                                      : std::string("full fine-tune"))
            << ", base_model_precision " << config.base_model_precision << ", batch " << request.batch << ", "
            << request.image_tokens << " image + " << request.text_tokens << " text tokens, "
            << (request.bf16 ? "bf16 autocast" : "float32") << ", " << request.device.str() << "\n";
  int failed = 0;
  for (const int64_t budget : flags.budgets) {
    request.budget_bytes = budget;
    const train::TrainingPlan plan = train::plan_training(model, request);
    std::cout << "\nbudget " << memory::format_bytes(budget) << ":\n";
    if (!plan.fits) {
      std::cerr << "remat plan: error: nothing fits in " << memory::format_bytes(budget)
                << (flags.host_budget ? " (host " + memory::format_bytes(*flags.host_budget) + ")" : "")
                << ": the smallest predicted device peak is " << memory::format_bytes(plan.smallest_peak_bytes)
                << ", with " << plan.smallest_with << "; " << what_else_fits(config) << "\n";
      ++failed;
      continue;
    }
    std::cout << train::format_training_plan(plan);
  }
  return failed > 0 ? kExitUsage : 0;
}

REMAT_COMMAND("plan", "choose checkpointing, offload and block swap for a memory budget, without loading weights",
              run_plan);

}  // namespace
}  // namespace remat::cli
