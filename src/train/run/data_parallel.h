#pragma once
// What the trainer needs to run as one of several processes (Note [One run, any world size]).
#include <cstdint>
#include <string>

#include "remat/train/options/config.h"

namespace remat::train {

// Note [One run, any world size]
// A run on W processes trains exactly what one process trains with gradient accumulation W x a:
//   - every rank walks the same sequence of batches (the epoch order comes from (seed, epoch));
//     an optimizer step consumes the next W x a of them, and rank r loads only those whose place
//     j in the step has j % W == r, so the ranks read disjoint shards of every epoch;
//   - each batch's noise and sigmas come from a generator seeded by the batch's place in the run
//     (seed, epoch, index in epoch), so they do not depend on which rank trains it;
//   - each rank scales its losses by 1/a and the reducer averages over the W ranks: the mean over
//     W x a micro-batches, as one process computes it. For W = 2 and a = 1 the scalings are powers
//     of two and the sum of two terms is commutative, so the gradients, and the weights after any
//     number of steps, are equal bit for bit; otherwise they agree to float32 rounding;
//   - the checkpoint's position counts batches of the whole run, not of a rank, so a run can be
//     resumed with another world size (the global batch then changes, as it says at start).

/// The noise seed of the batch at (epoch, index) of the run seeded `seed`.
uint64_t batch_noise_seed(int64_t seed, int64_t epoch, int64_t index);

/// The options that decide what a run computes, one "name=value" per line (every option the
/// registry renders, in registry order): ranks compare it at start.
std::string canonical_config_text(const TrainConfig& config);

}  // namespace remat::train
