#include "remat/layout.h"
#include "remat/util/error.h"

#include <memory>
#include <sstream>
#include <stdexcept>

#include <c10/util/Exception.h>

#include "detail/run_blocks.h"

namespace remat {

const char* block_mode_name(BlockMode mode) {
  switch (mode) {
    case BlockMode::Keep:
      return "keep";
    case BlockMode::Recompute:
      return "recompute";
    case BlockMode::Offload:
      return "offload";
  }
  return "unknown";
}

std::vector<BlockMode> Layout::block_modes() const {
  std::vector<BlockMode> modes;
  for (const auto& segment : segments) {
    for (int64_t k = segment.begin; k < segment.end; ++k) modes.push_back(segment.mode);
  }
  return modes;
}

int64_t Layout::num_checkpoints() const {
  int64_t count = 0;
  for (const auto& segment : segments) count += segment.mode != BlockMode::Keep ? 1 : 0;
  return count;
}

Layout layout_keep_all(int64_t num_blocks) {
  if (num_blocks < 0) {
    throw_value_error("[Layout] num_blocks must be >= 0, got " + std::to_string(num_blocks));
  }
  Layout layout;
  if (num_blocks > 0) layout.segments.push_back({0, num_blocks, BlockMode::Keep});
  return layout;
}

Layout layout_from_interval(int64_t num_blocks, int64_t interval, std::optional<int64_t> stride,
                            Backend backend) {
  const BlockMode mode = backend == Backend::Offload ? BlockMode::Offload : BlockMode::Recompute;
  Layout layout;
  for (const auto& window : segment_windows(num_blocks, interval, stride)) {
    layout.segments.push_back({window.begin, window.checkpoint_end, mode});
    if (window.end > window.checkpoint_end) {
      layout.segments.push_back({window.checkpoint_end, window.end, BlockMode::Keep});
    }
  }
  return layout;
}

void validate_layout(const Layout& layout, int64_t num_blocks) {
  int64_t expected_begin = 0;
  for (size_t i = 0; i < layout.segments.size(); ++i) {
    const auto& s = layout.segments[i];
    if (s.begin != expected_begin || s.end <= s.begin) {
      std::ostringstream msg;
      msg << "[Layout] segment " << i << " must cover blocks [" << expected_begin
          << ", end > begin), got [" << s.begin << ", " << s.end << ")";
      throw_value_error(msg.str());
    }
    expected_begin = s.end;
  }
  if (expected_begin != num_blocks) {
    std::ostringstream msg;
    msg << "[Layout] segments must cover " << num_blocks << " blocks, got " << expected_begin;
    throw_value_error(msg.str());
  }
}

std::string describe_layout(const Layout& layout) {
  if (layout.segments.empty()) return "(no blocks)";
  std::ostringstream out;
  for (size_t i = 0; i < layout.segments.size(); ++i) {
    const auto& s = layout.segments[i];
    if (i > 0) out << ' ';
    out << block_mode_name(s.mode) << '[' << s.begin;
    if (s.end - 1 > s.begin) out << '-' << s.end - 1;
    out << ']';
  }
  return out.str();
}

Tensors run_layout(const Layout& layout, Tensors state, const RunBlock& run_block,
                   bool preserve_rng_state) {
  validate_layout(layout, layout.num_blocks());
  if (!run_block) throw_value_error("[run_layout] run_block is empty");
  auto block = std::make_shared<const RunBlock>(run_block);
  const auto run_range = [block](int64_t begin, int64_t end, Tensors current) {
    return detail::run_blocks(*block, begin, end, std::move(current), "run_layout");
  };
  for (const auto& segment : layout.segments) {
    if (segment.mode == BlockMode::Keep) {
      state = run_range(segment.begin, segment.end, std::move(state));
      continue;
    }
    CheckpointOptions options;
    options.backend = segment.mode == BlockMode::Offload ? Backend::Offload : Backend::Recompute;
    options.preserve_rng_state = preserve_rng_state;
    const int64_t begin = segment.begin, end = segment.end;
    state = checkpoint([run_range, begin, end](const Tensors& s) { return run_range(begin, end, s); },
                       state, options);
  }
  return state;
}

}  // namespace remat
