// Note [Budget planner]
// plan_layout minimises the predicted step time over all layouts whose predicted peak fits the
// budget, exactly under predict() (Note [Checkpoint memory timeline] in cost_model.cpp).
//
// Decomposition. Cut a layout into segments τ_1 .. τ_m. Every segment leaves kept(τ) bytes on the
// device from its forward to its backward (Keep: its activations and retained inputs; Recompute:
// its input s_p; moved Offload: nothing; plus the RNG snapshot of a checkpoint). Going forward,
// everything of earlier segments is still there; going backward, everything of later segments
// has gone. So with K_i = sum of kept(τ_j) for j < i, the peak of predict() is
//
//   max over i of  max( base_f + K_i + fwd(τ_i),  base_b + K_i + bwd(τ_i) + X_i )
//
// where base_f = fixed + s_0, base_b = base_f + s_N + g_N, fwd / bwd are the segment's own peaks
// above that (segment_local_cost: they depend only on the segment, its boundaries and whether it
// touches block 0 or N), and X_i is the one non-local term: the input of the nearest moved
// Offload segment before τ_i, prefetched to the device when the nearest moved Offload segment at
// or after τ_i starts its backward. X_i = w (that input's bytes) if τ_i is such a segment or one
// comes after it, else 0. The step time is a sum over segments.
//
// Recurrence. A label is a prefix [0, p) of segments with its (K, time). Labels are grouped by
// key (p, w, promise): w = bytes of the last moved Offload input so far, promise = whether the
// backward constraints of the non-offload segments after it were checked with X = w (a later
// moved Offload segment is promised) or with X = 0 (none may follow). Extending a label by a
// segment τ = [p, q) is allowed iff both constraints of τ hold with the label's K (and X from the
// key); the new label has K + kept(τ), time + time(τ), key (q, w', promise'), where an Offload τ
// resets w' = s_p and picks either promise (and is forbidden after a "none follows" promise). A
// complete layout is a label at p = N whose promise is not "more follow".
//
// The rest of the step (Note [Whole-step model] in cost_model.cpp) adds three terms. Parameter
// gradients of the blocks after τ_i are live during its backward: base_b(q_i) = base_f + s_N +
// g_N + U + sum of P_k for k >= q_i (a constant per position). The head and loss peak after the
// forward, base_f + K_total + s_N + T, depends only on the complete layout's K: it is checked on
// the complete labels. fixed_peak_bytes is a constant: nothing fits below it.
//
// Exactness. Every layout is exactly one path (its promises are determined by it) and passes all
// extensions iff predict(layout).peak <= budget. Within one key, the constraints of every future
// extension depend on the label only through K, and both K and time add up along the path, so a
// label with K' <= K and time' <= time is at least as good as (K, time) in every completion:
// keeping only the Pareto front of (K, time) per key loses no optimum. Keep segments are only
// tried one block long: a Keep run of several blocks is the same timeline as single Keep blocks.
//
// The smallest possible peak is found by bisection on the budget with the same recursion, keeping
// only the smallest K per key (feasibility does not need time); feasibility is monotone in the
// budget, and the keep-all layout bounds it from above.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include <c10/util/Exception.h>

#include "plan/cost_model_impl.h"
#include "remat/memory.h"
#include "remat/util/error.h"
#include "remat/plan.h"

namespace remat {
namespace {

using detail::SegmentLocalCost;

enum class Promise : uint8_t {
  NoOffloadYet,   // no moved Offload segment so far: X = 0
  MoreFollow,     // a later moved Offload segment is promised: X = w
  NoneFollow,     // no moved Offload segment may follow: X = 0
};

struct Label {
  int64_t kept;
  double time;
  int32_t parent;  // index into the arena of expanded labels, -1 for the empty prefix
  Segment segment;
};

// The labels of one key that no other label of the key dominates (smaller or equal K and time),
// kept as they arrive: sorted by K ascending, so time strictly descending.
class ParetoFront {
 public:
  void insert(const Label& label) {
    // First label with K > label.kept; the one before it has the smallest time among K <= kept.
    auto it = std::upper_bound(labels_.begin(), labels_.end(), label.kept,
                               [](int64_t kept, const Label& l) { return kept < l.kept; });
    if (it != labels_.begin() && std::prev(it)->time <= label.time) return;  // dominated
    // Remove the labels it dominates: K >= kept (from the first with K >= kept) and time >= its.
    auto first = std::lower_bound(labels_.begin(), labels_.end(), label.kept,
                                  [](const Label& l, int64_t kept) { return l.kept < kept; });
    auto last = first;
    while (last != labels_.end() && last->time >= label.time) ++last;
    labels_.insert(labels_.erase(first, last), label);
  }
  const std::vector<Label>& labels() const { return labels_; }

 private:
  std::vector<Label> labels_;
};

// All local costs of the segments the planner may use, by (begin, end, mode).
class SegmentTable {
 public:
  SegmentTable(const Chain& chain, bool allow_offload, int64_t stream_from) : n_(chain.num_blocks()) {
    modes_ = {BlockMode::Keep, BlockMode::Recompute};
    // Offload that stays on the device costs exactly what Recompute costs: never better.
    if (allow_offload && chain.offload_to_host) modes_.push_back(BlockMode::Offload);
    std::vector<int64_t> limit(n_ + 1, n_);  // first forced boundary after p
    for (int64_t p = 0; p < n_; ++p) {
      for (int64_t b : chain.forced_boundaries) {
        if (b > p) limit[p] = std::min(limit[p], b);
      }
    }
    for (int64_t p = 0; p < n_; ++p) {
      for (BlockMode mode : modes_) {
        const bool streamed = p >= stream_from;  // PlannerOptions::stream_from
        if (streamed && mode == BlockMode::Keep) continue;
        const int64_t last = mode == BlockMode::Keep || streamed ? p + 1 : std::min(limit[p], stream_from);
        for (int64_t q = p + 1; q <= last; ++q) {
          const Segment segment{p, q, mode};
          entries_.push_back({segment, detail::segment_local_cost(chain, segment),
                              detail::moves_to_host(chain, mode),
                              detail::state_bytes(chain, p)});
        }
      }
    }
    std::stable_sort(entries_.begin(), entries_.end(),
                     [](const Entry& a, const Entry& b) { return a.segment.begin < b.segment.begin; });
    first_.assign(n_ + 1, entries_.size());
    for (size_t i = entries_.size(); i-- > 0;) first_[entries_[i].segment.begin] = i;
  }

  struct Entry {
    Segment segment;
    SegmentLocalCost cost;
    bool moves;
    int64_t input_bytes;
  };

  // The segments starting at p.
  std::pair<const Entry*, const Entry*> starting_at(int64_t p) const {
    size_t begin = first_[p], end = begin;
    while (end < entries_.size() && entries_[end].segment.begin == p) ++end;
    return {entries_.data() + begin, entries_.data() + end};
  }

 private:
  int64_t n_;
  std::vector<BlockMode> modes_;
  std::vector<Entry> entries_;
  std::vector<size_t> first_;
};

struct DpResult {
  std::vector<Segment> segments;
  double time_s = 0.0;
};

// The recursion of Note [Budget planner]. With minimize_time false every label has time 0, so the
// Pareto front of a key is its smallest K and the search only answers "does anything fit".
std::optional<DpResult> solve(const Chain& chain, const SegmentTable& table, int64_t budget,
                              bool minimize_time) {
  const int64_t n = chain.num_blocks();
  if (chain.fixed_peak_bytes > budget) return std::nullopt;
  const int64_t base_f = chain.fixed_bytes + detail::state_bytes(chain, 0);
  const int64_t end_of_forward = base_f + detail::state_bytes(chain, n);  // + K_total
  // base_b(q): what is live during the backward of a segment ending at q besides earlier
  // segments' kept bytes and the segment's own (Note [Budget planner]).
  std::vector<int64_t> base_b(n + 1);
  base_b[n] = end_of_forward + detail::state_grad_bytes(chain, n) + chain.tail_backward_bytes;
  for (int64_t q = n; q-- > 0;) base_b[q] = base_b[q + 1] + chain.blocks[q].parameter_grad_bytes;

  using Key = std::pair<Promise, int64_t>;  // (promise, w)
  std::vector<Label> arena;  // expanded labels, for reconstructing the best path
  std::vector<std::map<Key, ParetoFront>> at(n + 1);
  at[0][{Promise::NoOffloadYet, 0}].insert({0, 0.0, -1, {}});

  for (int64_t p = 0; p < n; ++p) {
    const auto [first, last] = table.starting_at(p);
    for (const auto& [key, front] : at[p]) {
      const auto [promise, w] = key;
      for (const Label& label : front.labels()) {
        arena.push_back(label);
        const auto label_index = static_cast<int32_t>(arena.size() - 1);
        for (const auto* entry = first; entry != last; ++entry) {
          if (entry->moves && promise == Promise::NoneFollow) continue;
          // X of Note [Budget planner]: the prefetched input of the last moved Offload segment.
          const bool prefetched_here = entry->moves || promise == Promise::MoreFollow;
          const int64_t extra = prefetched_here && promise != Promise::NoOffloadYet ? w : 0;
          const int64_t forward_peak = base_f + label.kept + entry->cost.forward_peak;
          const int64_t q = entry->segment.end;
          const int64_t backward_peak = base_b[q] + label.kept + entry->cost.backward_peak + extra;
          if (forward_peak > budget || backward_peak > budget) continue;
          const Label next{label.kept + entry->cost.kept,
                           minimize_time ? label.time + entry->cost.time_s : 0.0, label_index,
                           entry->segment};
          if (!entry->moves) {
            at[q][key].insert(next);
            continue;
          }
          if (q < n) at[q][{Promise::MoreFollow, entry->input_bytes}].insert(next);
          at[q][{Promise::NoneFollow, 0}].insert(next);
        }
      }
    }
    at[p].clear();
  }

  const Label* best = nullptr;
  for (const auto& [key, front] : at[n]) {
    if (key.first == Promise::MoreFollow) continue;  // a promised Offload segment never came
    for (const Label& label : front.labels()) {
      if (end_of_forward + label.kept + chain.tail_peak_bytes > budget) continue;  // head and loss
      if (best == nullptr || label.time < best->time) best = &label;
    }
  }
  if (best == nullptr) return std::nullopt;
  DpResult result;
  result.time_s = best->time;
  result.segments.push_back(best->segment);
  for (int32_t label = best->parent; arena[label].parent >= 0; label = arena[label].parent) {
    result.segments.push_back(arena[label].segment);
  }
  std::reverse(result.segments.begin(), result.segments.end());
  return result;
}

bool is_forced(const Chain& chain, int64_t index) {
  return std::find(chain.forced_boundaries.begin(), chain.forced_boundaries.end(), index) !=
         chain.forced_boundaries.end();
}

// Merges consecutive Keep segments, except across a forced boundary.
Layout to_layout(const Chain& chain, const std::vector<Segment>& segments) {
  Layout layout;
  for (const auto& segment : segments) {
    if (!layout.segments.empty() && segment.mode == BlockMode::Keep &&
        layout.segments.back().mode == BlockMode::Keep && !is_forced(chain, segment.begin)) {
      layout.segments.back().end = segment.end;
    } else {
      layout.segments.push_back(segment);
    }
  }
  return layout;
}

Layout keep_all_layout(const Chain& chain) {
  std::vector<Segment> blocks;
  for (int64_t k = 0; k < chain.num_blocks(); ++k) blocks.push_back({k, k + 1, BlockMode::Keep});
  return to_layout(chain, blocks);
}

int64_t min_peak(const Chain& chain, const SegmentTable& table, int64_t upper) {
  int64_t lo = 0, hi = upper;  // hi always fits
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (solve(chain, table, mid, /*minimize_time=*/false)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return hi;
}

std::string percent_over(double step_s, double reference_s) {
  if (reference_s <= 0.0) return "";
  const int64_t percent = std::lround(100.0 * (step_s / reference_s - 1.0));
  return (percent >= 0 ? "+" : "") + std::to_string(percent) + "%";
}

std::string explain(const Chain& chain, const PlanResult& result, const PlannerOptions& options) {
  std::ostringstream out;
  const int64_t n = chain.num_blocks();
  if (result.fits) {
    int64_t recomputed = 0;
    for (const auto& s : result.layout.segments) recomputed += s.mode != BlockMode::Keep ? s.end - s.begin : 0;
    if (recomputed == 0) {
      out << "every block keeps its activations: the step fits without checkpointing";
    } else {
      out << "the fastest layout that fits recomputes " << recomputed << " of " << n
          << " blocks in " << result.layout.num_checkpoints() << " checkpointed segments ("
          << percent_over(result.prediction.step_s, result.keep_all_step_s)
          << " step time over no checkpointing)";
    }
    return out.str();
  }
  const int64_t over = result.min_possible_peak - result.budget_bytes;
  out << "nothing fits in " << memory::format_bytes(result.budget_bytes)
      << ": the smallest predicted peak is " << memory::format_bytes(result.min_possible_peak)
      << " (" << memory::format_bytes(over) << " over). ";
  const int64_t outside = std::max(chain.fixed_bytes, chain.fixed_peak_bytes);
  if (outside >= result.budget_bytes) {
    out << "Parameters, gradients and optimizer state alone take "
        << memory::format_bytes(outside)
        << ": train fewer parameters (LoRA), use lower-precision weights or optimizer state, or ";
  } else {
    out << "Lower the resolution or the batch size (activations grow with tokens x batch), ";
    if (!options.allow_offload && chain.offload_to_host) {
      const SegmentTable with_offload(chain, /*allow_offload=*/true, options.stream_from);
      const int64_t offload_peak = min_peak(chain, with_offload, result.min_possible_peak);
      if (offload_peak < result.min_possible_peak) {
        out << "enable offloading (gradient_checkpointing_backend: unsloth; smallest peak then "
            << memory::format_bytes(offload_peak) << "), ";
      }
    }
  }
  out << "or use a device with at least " << memory::format_bytes(result.min_possible_peak)
      << " free";
  return out.str();
}

}  // namespace

PlanResult plan_layout(const Chain& chain, int64_t budget_bytes, const PlannerOptions& options) {
  validate_chain(chain);
  if (budget_bytes <= 0) {
    throw_value_error("[plan_layout] budget_bytes must be > 0, got " +
                                std::to_string(budget_bytes));
  }
  PlanResult result;
  result.budget_bytes = budget_bytes;
  result.forced_boundaries = chain.forced_boundaries;
  std::sort(result.forced_boundaries.begin(), result.forced_boundaries.end());

  const Layout keep_all = keep_all_layout(chain);
  const Prediction keep_all_prediction = predict(chain, keep_all);
  result.keep_all_step_s = keep_all_prediction.step_s;
  if (chain.num_blocks() == 0) {
    result.layout = keep_all;
    result.prediction = keep_all_prediction;
    result.min_possible_peak = keep_all_prediction.peak_bytes;
    result.fits = result.prediction.peak_bytes <= budget_bytes;
    result.explanation = explain(chain, result, options);
    return result;
  }

  const SegmentTable table(chain, options.allow_offload, options.stream_from);
  // An upper bound that some allowed layout reaches: keep-all, or with streamed blocks (which
  // may not be kept) every block recomputed on its own, whichever peaks higher.
  int64_t upper = keep_all_prediction.peak_bytes;
  if (options.stream_from < chain.num_blocks()) {
    Layout per_block;
    for (int64_t b = 0; b < chain.num_blocks(); ++b) per_block.segments.push_back({b, b + 1, BlockMode::Recompute});
    upper = std::max(upper, predict(chain, per_block).peak_bytes);
  }
  result.min_possible_peak = min_peak(chain, table, upper);
  std::optional<DpResult> best = solve(chain, table, budget_bytes, /*minimize_time=*/true);
  result.fits = best.has_value();
  if (!best) best = solve(chain, table, result.min_possible_peak, /*minimize_time=*/true);
  TORCH_INTERNAL_ASSERT(best.has_value(), "[plan_layout] no layout at the smallest peak");

  result.layout = to_layout(chain, best->segments);
  result.prediction = predict(chain, result.layout);
  TORCH_INTERNAL_ASSERT(result.prediction.peak_bytes <= std::max(budget_bytes, result.min_possible_peak),
                        "[plan_layout] the planned layout's predicted peak ",
                        result.prediction.peak_bytes, " exceeds what the planner checked");
  result.explanation = explain(chain, result, options);
  return result;
}

std::string describe_plan(const PlanResult& result) {
  std::ostringstream out;
  out << "auto: ";
  const auto& segments = result.layout.segments;
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    if (i > 0) {
      const bool forced = std::binary_search(result.forced_boundaries.begin(),
                                             result.forced_boundaries.end(), s.begin);
      out << (forced ? " | " : " ");
    }
    out << block_mode_name(s.mode) << '[' << s.begin;
    if (s.end - 1 > s.begin) out << '-' << s.end - 1;
    out << ']';
  }
  if (segments.empty()) out << "(no blocks)";
  out << ": predicted peak " << memory::format_bytes(result.prediction.peak_bytes) << " of "
      << memory::format_bytes(result.budget_bytes) << " budget";
  std::ostringstream step;
  step.precision(3);
  step << result.prediction.step_s;
  out << ", step " << step.str() << " s";
  if (result.keep_all_step_s > 0.0) {
    out << " (" << percent_over(result.prediction.step_s, result.keep_all_step_s)
        << " over no checkpointing)";
  }
  if (!result.fits) out << "; " << result.explanation;
  return out.str();
}

}  // namespace remat
