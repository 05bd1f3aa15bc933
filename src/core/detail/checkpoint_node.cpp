// Note [Checkpoint graph surgery]
// LibTorch 1.13 has no saved-tensor hooks in C++, so remat checkpoints by rewriting the graph:
//
// Forward (grad mode on):
//   1. Detach the state inputs into fresh leaves (requiring grad where the inputs did) and run the
//      segment on them with grad enabled, noting the autograd sequence numbers [first, end) that
//      this thread hands out meanwhile: every node the segment creates has one of them.
//   2. Walk the segment's graph from its outputs. An edge that leaves the segment is a *frontier*
//      edge: one to an AccumulateGrad node (a parameter, or any leaf the closure captured), or to
//      a node created outside [first, end) on this thread (for example the timestep embedding
//      that trainable layers computed before the segment). Edges to our own leaves are the state
//      inputs and are not frontier.
//   3. Drop the segment's graph (and with it every activation it saved). Create one
//      CheckpointNode whose next edges are the state inputs' edges followed by the frontier, and
//      attach the detached outputs to it.
// Backward (CheckpointNode::apply):
//   4. Restore the forward RNG and autocast state, recompute the segment on fresh leaves, and run
//      the autograd engine from the recomputed outputs with the incoming gradients, asking it to
//      *capture* (not accumulate) the gradients that reach the leaves and the frontier edges.
//      Recomputation reaches the same frontier nodes (the same AccumulateGrad objects, the same
//      outside nodes), so the captured gradients are returned through our next edges and the
//      running backward routes them on: `.grad` is written only by the outer backward, and
//      torch::autograd::grad leaves it untouched.
//   Only the next edges the running backward needs are captured (task_should_compute_output).
//
// Known limit: if the closure reads both a tensor made outside the segment and a parameter that
// tensor was computed from, the recomputation walks through the outside node to reach that
// parameter and its gradient would be counted twice. SimpleTuner's models never do this; the
// frontier rule makes it unnecessary (pass the derived tensor, not both).
#include "detail/checkpoint_node.h"
#include "detail/saved_tensor_offload.h"

#include <unordered_set>

#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

namespace remat {
namespace {
// Depth of CheckpointNode::apply recomputations running on this thread (nested checkpoints
// recompute inside a recomputation).
thread_local int t_recomputation_depth = 0;
}  // namespace

bool in_recomputation() { return t_recomputation_depth > 0; }

}  // namespace remat

namespace remat::detail {
namespace {

struct RecomputationScope {
  RecomputationScope() { ++t_recomputation_depth; }
  ~RecomputationScope() { --t_recomputation_depth; }
  RecomputationScope(const RecomputationScope&) = delete;
  RecomputationScope& operator=(const RecomputationScope&) = delete;
};

using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Node;
using torch::autograd::variable_list;

Tensors make_leaves(const Tensors& inputs) {
  Tensors leaves;
  leaves.reserve(inputs.size());
  for (const auto& input : inputs) {
    if (!input.defined()) {
      leaves.emplace_back();
      continue;
    }
    auto leaf = input.detach();
    if (input.requires_grad()) leaf.requires_grad_(true);
    leaves.push_back(std::move(leaf));
  }
  return leaves;
}

struct EdgeKey {
  const Node* node;
  uint32_t input_nr;
  bool operator==(const EdgeKey& o) const { return node == o.node && input_nr == o.input_nr; }
};
struct EdgeKeyHash {
  size_t operator()(const EdgeKey& k) const {
    return std::hash<const void*>()(k.node) ^ (static_cast<size_t>(k.input_nr) * 0x9e3779b97f4a7c15ULL);
  }
};

// Step 2 of the Note: the edges through which gradients leave the segment's graph.
edge_list collect_frontier(const Tensors& outputs, const Tensors& leaves, uint64_t first_seq,
                           uint64_t end_seq, uint64_t thread_id) {
  std::unordered_set<const at::TensorImpl*> own_leaves;
  for (const auto& leaf : leaves) {
    if (leaf.defined()) own_leaves.insert(leaf.unsafeGetTensorImpl());
  }
  const auto inside = [&](const Node* node) {
    return node->thread_id() == thread_id && node->sequence_nr() >= first_seq &&
           node->sequence_nr() < end_seq;
  };

  edge_list frontier;
  std::unordered_set<EdgeKey, EdgeKeyHash> seen_edges;
  std::unordered_set<const Node*> visited;
  std::vector<Node*> stack;

  const auto add_frontier = [&](const Edge& edge) {
    if (seen_edges.insert({edge.function.get(), edge.input_nr}).second) frontier.push_back(edge);
  };
  const auto visit_edge = [&](const Edge& edge) {
    Node* node = edge.function.get();
    if (node == nullptr) return;
    if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) {
      if (own_leaves.count(acc->variable.unsafeGetTensorImpl()) == 0) add_frontier(edge);
      return;
    }
    if (!inside(node)) {
      add_frontier(edge);
      return;
    }
    if (visited.insert(node).second) stack.push_back(node);
  };

  for (const auto& out : outputs) {
    if (!out.defined() || !out.requires_grad()) continue;
    visit_edge(torch::autograd::impl::gradient_edge(out));
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const auto& edge : node->next_edges()) visit_edge(edge);
  }
  return frontier;
}

}  // namespace

Tensors checkpoint_with_graph_surgery(const SegmentFn& fn, const Tensors& inputs,
                                      const CheckpointOptions& options) {
  RngSnapshot rng;
  if (options.preserve_rng_state) rng = RngSnapshot::capture(inputs);
  const AutocastSnapshot autocast = AutocastSnapshot::capture();

  const Tensors leaves = make_leaves(inputs);
  const uint64_t first_seq = at::sequence_number::peek();
  Tensors raw;
  {
    // This graph is dropped below (step 3): what it saves stays where it is.
    const SuppressSavedTensorOffload keep_on_device;
    raw = fn(leaves);
  }
  const uint64_t end_seq = at::sequence_number::peek();
  edge_list frontier = collect_frontier(raw, leaves, first_seq, end_seq,
                                        at::RecordFunction::currentThreadId());

  auto node = std::shared_ptr<CheckpointNode>(
      new CheckpointNode(fn, SavedInputs::create(inputs, options.backend), std::move(rng), autocast,
                         options.preserve_rng_state),
      torch::autograd::deleteNode);

  edge_list next_edges;
  next_edges.reserve(inputs.size() + frontier.size());
  for (const auto& input : inputs) {
    next_edges.push_back(input.defined() && input.requires_grad()
                             ? torch::autograd::impl::gradient_edge(input)
                             : Edge());
  }
  for (auto& edge : frontier) next_edges.push_back(std::move(edge));
  node->set_next_edges(std::move(next_edges));

  Tensors outputs;
  outputs.reserve(raw.size());
  for (auto& r : raw) {
    if (!r.defined()) {
      node->add_input_metadata(Node::undefined_input());
      outputs.emplace_back();
      continue;
    }
    at::Tensor out = r.detach();
    if (r.requires_grad()) {
      const uint32_t slot = node->add_input_metadata(out);
      torch::autograd::impl::set_gradient_edge(out, Edge(node, slot));
    } else {
      node->add_input_metadata(Node::undefined_input());
    }
    outputs.push_back(std::move(out));
  }
  raw.clear();  // frees the segment's graph and the activations it saved
  return outputs;
}

CheckpointNode::CheckpointNode(SegmentFn fn, std::shared_ptr<SavedInputs> saved, RngSnapshot rng,
                               AutocastSnapshot autocast, bool preserve_rng)
    : fn_(std::move(fn)),
      saved_(std::move(saved)),
      rng_(std::move(rng)),
      autocast_(autocast),
      preserve_rng_(preserve_rng),
      num_state_inputs_(saved_->size()) {}

void CheckpointNode::release_variables() {
  released_ = true;
  saved_->release();
  fn_ = nullptr;  // drops whatever the closure captured by value
  // The node itself lives until the graph is freed (the caller drops the loss), so the RNG
  // snapshot goes now: otherwise every finished checkpoint would hold it for the rest of backward.
  rng_ = RngSnapshot();
}

variable_list CheckpointNode::apply(variable_list&& grads) {
  TORCH_CHECK(!released_,
              "[remat::checkpoint] trying to backward through a checkpointed segment a second "
              "time, after its saved inputs were freed; pass retain_graph=true to the first "
              "backward if you need to run it twice");
  TORCH_CHECK(!torch::autograd::GradMode::is_enabled(),
              "[remat::checkpoint] backward with create_graph=true (higher-order gradients) "
              "through a checkpointed segment is not supported; compute higher-order gradients "
              "without checkpointing");

  const size_t num_edges = num_outputs();
  variable_list result(num_edges);
  std::vector<size_t> wanted_slots;
  for (size_t j = 0; j < num_edges; ++j) {
    if (next_edge(j).is_valid() && task_should_compute_output(j)) wanted_slots.push_back(j);
  }
  if (wanted_slots.empty()) return result;

  const Tensors leaves = saved_->unpack();
  Tensors recomputed;
  {
    std::optional<RngFork> fork;
    if (preserve_rng_) fork.emplace(rng_);
    AutocastGuard autocast(autocast_);
    torch::autograd::AutoGradMode grad_on(true);
    RecomputationScope recomputing;
    recomputed = fn_(leaves);
  }
  TORCH_CHECK(recomputed.size() == num_inputs(), "[remat::checkpoint] the segment returned ",
              recomputed.size(), " tensors when recomputed but ", num_inputs(),
              " in the forward pass; a segment must be deterministic in its structure");

  edge_list roots;
  variable_list root_grads;
  for (size_t i = 0; i < recomputed.size(); ++i) {
    const auto& out = recomputed[i];
    if (!out.defined() || !out.requires_grad() || !grads[i].defined()) continue;
    roots.push_back(torch::autograd::impl::gradient_edge(out));
    root_grads.push_back(grads[i]);
  }
  if (roots.empty()) return result;

  edge_list wanted;
  wanted.reserve(wanted_slots.size());
  for (size_t j : wanted_slots) {
    wanted.push_back(j < num_state_inputs_ ? torch::autograd::impl::gradient_edge(leaves[j])
                                           : next_edge(j));
  }
  variable_list captured = torch::autograd::Engine::get_default_engine().execute(
      roots, root_grads, /*keep_graph=*/false, /*create_graph=*/false,
      /*accumulate_grad=*/false, wanted);
  for (size_t k = 0; k < wanted_slots.size(); ++k) result[wanted_slots[k]] = std::move(captured[k]);
  return result;
}

}  // namespace remat::detail
