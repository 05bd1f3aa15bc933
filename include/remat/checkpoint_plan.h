#pragma once
/// \file
/// A checkpoint plan: everything that decides how a model's block stacks are checkpointed, as one
/// value. It is built once (from SimpleTuner's options, or from a planner's layouts) and handed to
/// a model with one call (`set_checkpoint_plan`).
///
/// Semantics, per block stack (Flux: the double stack and the single stack, windows restarting at
/// 0 in each; MageFlow: its one stack), as SimpleTuner's transformers do
/// (FluxTransformer2DModel.forward in simpletuner/helpers/models/flux/transformer.py,
/// MageFlowTransformer2DModel.forward in simpletuner/helpers/models/mageflow/transformer.py;
/// docs/SEGMENTED_CHECKPOINTING.md):
/// - Nothing is checkpointed unless the plan is enabled and the module is training.
/// - Blocks scope: each stack runs through remat::run_layout with the plan's layout for it: the
///   explicit stack layout when given, else layout_from_interval(num_blocks, interval, stride,
///   backend); an unset interval (or 1) is per-block checkpointing and ignores the stride, since
///   SimpleTuner's segmented path needs interval > 1.
/// - FeedForward scope (backends "torch-ffn" / "unsloth-ffn"): only the feed-forward part inside
///   a block is checkpointed; which blocks is the model's rule (Flux: k % interval == 0, as
///   SimpleTuner's per-block path; MageFlow: every block).
/// - The saved-input policy (remat/saved_inputs.h) says where checkpoints keep their inputs.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "remat/export.h"
#include "remat/layout.h"
#include "remat/saved_inputs.h"

namespace remat {

/// Which part of each block a checkpoint covers.
enum class CheckpointScope {
  Blocks,       ///< whole blocks, in segments
  FeedForward,  ///< the feed-forward half inside each selected block
};

struct REMAT_API CheckpointPlan {
  bool enabled = false;
  CheckpointScope scope = CheckpointScope::Blocks;
  /// Blocks per checkpointed chunk; unset (or 1) = per block.
  std::optional<int64_t> interval;
  /// A chunk starts every `segment_stride` blocks (>= interval); unset = interval.
  std::optional<int64_t> segment_stride;
  /// Where checkpoints keep their inputs. Never null: the built-in policies live for the program.
  const SavedInputPolicy* saved_inputs = &saved_input_policy(Backend::Recompute);
  /// Explicit per-stack layouts (a planner's choice); when set they replace interval, stride and
  /// scope, and their segment modes choose the mechanism.
  std::vector<Layout> stack_layouts;

  /// No checkpointing.
  static CheckpointPlan off();
  /// SimpleTuner's options: `backend` is one of backend_names() ("torch", "unsloth", "torch-ffn",
  /// "unsloth-ffn"). Throws c10::ValueError for an unknown backend or a bad interval/stride.
  static CheckpointPlan simpletuner(bool enabled, std::optional<int64_t> interval,
                                    std::optional<int64_t> segment_stride, const std::string& backend);
  /// Explicit layouts, one per block stack.
  static CheckpointPlan from_layouts(std::vector<Layout> stack_layouts);

  /// The valid values of gradient_checkpointing_backend: each policy name, and each with "-ffn".
  static std::vector<std::string> backend_names();
  /// The policy and scope a backend name stands for ("unsloth-ffn": offload, FeedForward). The
  /// one parser of these names; throws c10::ValueError naming the valid ones.
  static std::pair<const SavedInputPolicy*, CheckpointScope> parse_backend_name(const std::string& name);
  /// The backend name of this plan ("unsloth-ffn", ...).
  std::string backend_name() const;

  /// Whether checkpointing applies now: enabled && training.
  bool active(bool training) const { return enabled && training; }
  /// FeedForward scope without explicit layouts.
  bool ffn_scope() const { return scope == CheckpointScope::FeedForward && stack_layouts.empty(); }
  /// The mechanism of the saved-input policy.
  Backend backend() const { return saved_inputs->backend(); }
  /// FeedForward scope, interval rule: block k is selected when k % interval == 0 (every block
  /// when the interval is unset).
  bool ffn_block_selected(int64_t k) const { return !interval || k % *interval == 0; }

  /// The layout of stack `stack` with `num_blocks` blocks (Blocks scope). Throws c10::ValueError
  /// for a bad stride or an explicit layout of the wrong size or a missing stack.
  Layout layout_for(size_t stack, int64_t num_blocks) const;

  /// Throws c10::ValueError naming the first bad field: interval or stride < 1, stride below an
  /// interval > 1, a null policy.
  void validate() const;

  /// One line per stack, as the trainer logs it: "off", or "double blocks (19): recompute[0-1]
  /// recompute[2-3] ...". `stack_names` and `stack_sizes` are the model's.
  std::string describe(const std::vector<std::string>& stack_names,
                       const std::vector<int64_t>& stack_sizes) const;
};

}  // namespace remat
