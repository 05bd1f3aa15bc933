// Large host blocks, each a mapping of its own, with a cache of freed ones bounded by the
// largest footprint the blocks ever had (Note [Host blocks] in host_blocks.cpp).
#pragma once

#include <cstddef>

namespace remat::memory::detail {

/// Blocks of at least this many bytes are mapped on their own.
constexpr size_t kHostBlockFrom = size_t{1} << 20;

/// A page-aligned block of at least `bytes`; its size is returned in `mapped` (whole pages, up to
/// twice `bytes` when a kept block is reused). Throws c10::Error when the kernel refuses a mapping.
void* host_block_allocate(size_t bytes, size_t* mapped);

/// Takes a block back into the cache.
void host_block_release(void* base, size_t mapped);

/// Unmaps every kept block.
void host_block_drop_cache();

struct HostBlockCounts {
  size_t live;  // handed out, not yet released
  size_t kept;  // released, still mapped
  size_t high;  // the most `live` has been
};
HostBlockCounts host_block_counts();

}  // namespace remat::memory::detail
