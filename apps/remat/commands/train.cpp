// `remat train`: SimpleTuner-style options (config.json + --key=value flags), validated before
// any work starts (exit code 2 with the option, the value and what is valid), then training.
// Ctrl-C or SIGTERM saves a checkpoint after the current step and exits cleanly; a second one kills.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>

#include "command.h"
#include "remat/memory.h"
#include "remat/train/family/hub_models.h"
#include "remat/train/options/config.h"
#include "remat/train/options/options.h"
#include "remat/train/run/progress.h"
#include "remat/train/run/trainer.h"

namespace remat::cli {
namespace {

std::atomic<bool> g_stop_requested{false};
std::atomic<int> g_stop_signal{0};

// SIGINT (Ctrl-C) and SIGTERM (what schedulers, `docker stop` and `kill` send) both stop after
// the current step with a checkpoint. The first signal restores the default action of both, so a
// second one ends the process at once.
extern "C" void on_stop_signal(int sig) {
  g_stop_requested = true;
  g_stop_signal = sig;
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  static const char kInterrupt[] = "\n[train] interrupted: saving a checkpoint after this step "
                                   "(Ctrl-C again to abort)\n";
  static const char kTerminate[] = "\n[train] SIGTERM: saving a checkpoint after this step "
                                   "(a second SIGTERM aborts)\n";
  if (sig == SIGTERM) (void)!write(2, kTerminate, sizeof(kTerminate) - 1);
  else (void)!write(2, kInterrupt, sizeof(kInterrupt) - 1);
}

int run_train(const std::vector<std::string>& args) {
  if (train::parse_command_line(args).help) {
    std::cout << train::train_help_text();
    return 0;
  }
  std::vector<std::string> warnings;
  train::TrainConfig config = train::load_train_config(args, warnings);  // throws: exit 2
  for (const auto& warning : warnings) std::cerr << "warning: " << warning << "\n";
  for (const auto& line : train::resolve_hub_models(config)) std::cerr << line << "\n";  // throws: exit 2

  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  train::TrainerHooks hooks;
  hooks.stop_requested = &g_stop_requested;
  hooks.progress_is_terminal = train::ProgressReporter::stream_is_terminal(stdout);
  hooks.log = [](const std::string& line) { std::cerr << line << "\n"; };
  const train::TrainResult result = train::run_training(config, hooks);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);

  if (!result.records.empty()) std::cout << train::format_summary(result.summary) << "\n";
  if (!result.weights_path.empty()) std::cout << "weights: " << result.weights_path << "\n";
  if (!result.last_checkpoint.empty()) std::cout << "checkpoint: " << result.last_checkpoint << "\n";
  // 128 + the signal, as a shell reports a process the signal ended: 130 for Ctrl-C, 143 for
  // SIGTERM; the checkpoint was saved.
  return result.interrupted ? 128 + (g_stop_signal ? g_stop_signal.load() : SIGINT) : 0;
}

REMAT_COMMAND("train", "train Flux / MageFlow (LoRA or full) with segmented checkpointing",
              run_train);

}  // namespace
}  // namespace remat::cli
