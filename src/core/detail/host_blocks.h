// Large host blocks from anonymous mappings, with a cache of freed pages bounded by the largest
// footprint the blocks ever had (Note [Host blocks] in host_blocks.cpp).
#pragma once

#include <cstddef>

namespace remat::memory::detail {

/// Blocks of at least this many bytes come from here.
constexpr size_t kHostBlockFrom = size_t{1} << 20;

/// Free pages kept beyond what the live blocks' peak leaves room for.
constexpr size_t kHostBlockSlack = size_t{4} << 20;

/// A page-aligned block of `bytes` rounded up to whole pages (returned in `mapped`). Throws
/// c10::Error when the kernel refuses a mapping.
void* host_block_allocate(size_t bytes, size_t* mapped);

/// Takes a block back as a free range (merged with free neighbours).
void host_block_release(void* base, size_t mapped);

/// Unmaps every free range and takes the live bytes as the new peak.
void host_block_drop_cache();

}  // namespace remat::memory::detail
