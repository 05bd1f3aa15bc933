// `remat train`: SimpleTuner-style options (config.json + --key=value flags), validated before
// any work starts (exit code 2 with the option, the value and what is valid), then training.
// Ctrl-C saves a checkpoint after the current step and exits cleanly; a second Ctrl-C kills.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>

#include "command.h"
#include "remat/memory.h"
#include "remat/train/config.h"
#include "remat/train/options.h"
#include "remat/train/progress.h"
#include "remat/train/trainer.h"

namespace remat::cli {
namespace {

std::atomic<bool> g_stop_requested{false};

extern "C" void on_interrupt(int) {
  g_stop_requested = true;
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process at once
  static const char kMessage[] = "\n[train] interrupted: saving a checkpoint after this step "
                                 "(Ctrl-C again to abort)\n";
  (void)!write(2, kMessage, sizeof(kMessage) - 1);
}

int run_train(const std::vector<std::string>& args) {
  if (train::parse_command_line(args).help) {
    std::cout << train::train_help_text();
    return 0;
  }
  std::vector<std::string> warnings;
  const train::TrainConfig config = train::load_train_config(args, warnings);  // throws: exit 2
  for (const auto& warning : warnings) std::cerr << "warning: " << warning << "\n";

  std::signal(SIGINT, on_interrupt);
  train::TrainerHooks hooks;
  hooks.stop_requested = &g_stop_requested;
  hooks.progress_is_terminal = train::ProgressReporter::stream_is_terminal(stdout);
  hooks.log = [](const std::string& line) { std::cerr << line << "\n"; };
  const train::TrainResult result = train::run_training(config, hooks);
  std::signal(SIGINT, SIG_DFL);

  if (!result.records.empty()) std::cout << train::format_summary(result.summary) << "\n";
  if (!result.weights_path.empty()) std::cout << "weights: " << result.weights_path << "\n";
  if (!result.last_checkpoint.empty()) std::cout << "checkpoint: " << result.last_checkpoint << "\n";
  return result.interrupted ? 130 : 0;
}

REMAT_COMMAND("train", "train Flux / MageFlow (LoRA or full) with segmented checkpointing",
              run_train);

}  // namespace
}  // namespace remat::cli
