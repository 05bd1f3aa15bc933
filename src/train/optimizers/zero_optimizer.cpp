// ZeRO stage 1 (remat/train/optimizers/zero_optimizer.h).
//
// Note [ZeRO broadcasts]
// After the owners' updates, every tensor travels from its owner to the other ranks. One
// collective per tensor would be ~1000 round trips a step for Flux; one per owner would need a
// temporary as large as the owner's shard (a quarter of the model on 4 ranks). So each owner's
// tensors are packed, in order, into byte buffers of at most bucket_bytes (25 MiB, DDP's bucket
// size) and a tensor at least that large is broadcast in place (no copy): the extra memory is one
// bucket. Buffers are raw bytes, so any dtype goes (Gloo in LibTorch 1.13 broadcasts no bfloat16)
// and a copy is exact by construction.
#include "remat/train/optimizers/zero_optimizer.h"

#include <algorithm>
#include <sstream>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "remat/distributed/process_group.h"
#include "remat/util/error.h"
#include "remat/util/bounded_json.h"
#include "remat/util/files.h"
#include "remat/train/options/config.h"

namespace remat::train {
namespace {

// The learning rate of the one parameter group (what set_learning_rate changes).
struct ZeroOptions : public torch::optim::OptimizerCloneableOptions<ZeroOptions> {
  explicit ZeroOptions(double lr) : lr(lr) {}
  double get_lr() const override { return lr; }
  void set_lr(const double value) override { lr = value; }
  double lr;
};

int64_t bytes_of(const at::Tensor& t) { return static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size()); }

// A contiguous tensor's storage as a flat byte view (shares memory: writes reach the tensor).
at::Tensor byte_view(const at::Tensor& t) { return t.detach().reshape({-1}).view(at::kByte); }

// Groups of consecutive tensors for one broadcast each (Note [ZeRO broadcasts]): {indices, in_place}.
std::vector<std::pair<std::vector<size_t>, bool>> pack(const std::vector<int64_t>& sizes, int64_t cap) {
  std::vector<std::pair<std::vector<size_t>, bool>> out;
  int64_t open_bytes = 0;
  bool open = false;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] >= cap) {
      out.push_back({{i}, true});
      open = false;
      continue;
    }
    if (!open || open_bytes + sizes[i] > cap) {
      out.push_back({{}, false});
      open_bytes = 0;
      open = true;
    }
    out.back().first.push_back(i);
    open_bytes += sizes[i];
  }
  return out;
}

// Broadcasts `tensors` (contiguous, on `device`) from `root`: packed into one byte buffer unless
// `in_place` (a single tensor). The root's tensors are read, the others' overwritten.
void broadcast_group(distributed::ProcessGroup& group, const std::vector<at::Tensor>& tensors, bool in_place,
                     int root, const c10::Device& device, const std::string& why) {
  if (in_place) {
    std::vector<at::Tensor> one{byte_view(tensors.front())};
    group.broadcast(one, root, why);
    return;
  }
  int64_t total = 0;
  for (const auto& t : tensors) total += bytes_of(t);
  std::vector<at::Tensor> flat{at::empty({total}, at::TensorOptions().dtype(at::kByte).device(device))};
  const bool sending = group.rank() == root;
  int64_t offset = 0;
  if (sending) {
    for (const auto& t : tensors) {
      flat[0].narrow(0, offset, bytes_of(t)).copy_(byte_view(t));
      offset += bytes_of(t);
    }
  }
  group.broadcast(flat, root, why);
  if (sending) return;
  offset = 0;
  for (const auto& t : tensors) {
    byte_view(t).copy_(flat[0].narrow(0, offset, bytes_of(t)));
    offset += bytes_of(t);
  }
}

// A rank's state entries as text every rank can parse: "<param index>\t<name>\t<dtype>\t<cpu>\t<sizes>".
struct Entry {
  size_t param = 0;
  std::string name;
  at::ScalarType dtype = at::kFloat;
  bool cpu = false;
  std::vector<int64_t> sizes;
};

std::string describe_entries(const std::vector<Entry>& entries) {
  std::ostringstream out;
  for (const auto& e : entries) {
    out << e.param << '\t' << e.name << '\t' << static_cast<int>(e.dtype) << '\t' << (e.cpu ? 1 : 0) << '\t';
    for (size_t d = 0; d < e.sizes.size(); ++d) out << (d ? "," : "") << e.sizes[d];
    out << '\n';
  }
  return out.str();
}

std::vector<Entry> parse_entries(const std::string& text) {
  std::vector<Entry> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    Entry e;
    std::string param, dtype, cpu, sizes;
    std::getline(fields, param, '\t');
    std::getline(fields, e.name, '\t');
    std::getline(fields, dtype, '\t');
    std::getline(fields, cpu, '\t');
    std::getline(fields, sizes, '\t');
    e.param = std::stoull(param);
    e.dtype = static_cast<at::ScalarType>(std::stoi(dtype));
    e.cpu = cpu == "1";
    std::istringstream dims(sizes);
    std::string d;
    while (std::getline(dims, d, ',')) e.sizes.push_back(std::stoll(d));
    out.push_back(std::move(e));
  }
  return out;
}

[[noreturn]] void bad_deepspeed_config(const std::string& value, const std::string& why) {
  throw ValidationError("deepspeed_config", util::text_excerpt(value), "[train] deepspeed_config " + why);
}

int checked_stage(const std::string& value, int64_t stage) {
  if (stage == 0 || stage == 1) return static_cast<int>(stage);
  if (stage == 2 || stage == 3) {
    bad_deepspeed_config(value, "asks for ZeRO stage " + std::to_string(stage) +
                                    "; remat implements stage 1 only (sharded optimizer state): use zero1");
  }
  bad_deepspeed_config(value, "stage must be 0 to 3 (remat implements 1), got " + std::to_string(stage));
}

// The stage of a DeepSpeed config (SimpleTuner's _extract_zero_stage reads the same two places).
int stage_of_json(const std::string& value, const std::string& text, std::vector<std::string>* warnings) {
  util::check_json_text(text, util::kMaxJsonFileBytes, "[train] deepspeed_config");
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    bad_deepspeed_config(value, std::string("is not valid JSON: ") + e.what());
  }
  if (!config.is_object()) bad_deepspeed_config(value, "must be a JSON object");
  const nlohmann::json* stage = nullptr;
  std::vector<std::string> ignored;
  for (const auto& [key, item] : config.items()) {
    if (key == "zero_stage") {
      stage = &item;
    } else if (key == "zero_optimization" && item.is_object()) {
      for (const auto& [inner, inner_item] : item.items()) {
        if (inner == "stage") stage = &inner_item;
        else ignored.push_back("zero_optimization." + inner);
      }
    } else {
      ignored.push_back(key);
    }
  }
  if (stage == nullptr) bad_deepspeed_config(value, "sets no zero_optimization.stage");
  if (!stage->is_number_integer()) {
    bad_deepspeed_config(value, "zero_optimization.stage must be an integer, got " + util::json_excerpt(*stage));
  }
  if (!ignored.empty() && warnings) {
    std::string list;
    for (const auto& k : ignored) list += (list.empty() ? "" : ", ") + k;
    warnings->push_back("[train] deepspeed_config: remat reads the ZeRO stage only; ignoring " +
                        util::text_excerpt(list));
  }
  return checked_stage(value, stage->get<int64_t>());
}

}  // namespace

int zero_stage_of(const std::string& deepspeed_config, std::vector<std::string>* warnings) {
  const auto first = deepspeed_config.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || deepspeed_config == "None") return 0;
  const auto last = deepspeed_config.find_last_not_of(" \t\r\n");
  const std::string value = deepspeed_config.substr(first, last - first + 1);
  // SimpleTuner's acceleration presets (helpers/acceleration/preset.py): zero1, zero2, zero3.
  if (value.size() == 5 && value.rfind("zero", 0) == 0 && value[4] >= '0' && value[4] <= '3') {
    return checked_stage(value, value[4] - '0');
  }
  if (value.front() == '{') return stage_of_json(value, value, warnings);
  // A path (SimpleTuner's _parse_json_like_option expands ~ first).
  std::string path = value;
  if (path.rfind("~/", 0) == 0) {
    if (const char* home = std::getenv("HOME")) path = std::string(home) + path.substr(1);
  }
  std::string text;
  try {
    text = util::read_regular_file(path, util::kMaxJsonFileBytes, "train", "deepspeed_config");
  } catch (const c10::ValueError& e) {
    bad_deepspeed_config(value, "must be zero1, DeepSpeed JSON text ({\"zero_optimization\": {\"stage\": 1}}) or "
                                "the path of a JSON file, got '" + util::text_excerpt(value) + "' (" +
                                e.what_without_backtrace() + ")");
  }
  return stage_of_json(value, text, warnings);
}

std::vector<int> assign_to_ranks(const std::vector<int64_t>& tensor_bytes, int world_size) {
  TORCH_CHECK_VALUE(world_size >= 1, "[zero] world_size must be >= 1, got ", world_size);
  std::vector<int64_t> load(static_cast<size_t>(world_size), 0);
  std::vector<int> owners;
  owners.reserve(tensor_bytes.size());
  for (const int64_t bytes : tensor_bytes) {
    TORCH_CHECK_VALUE(bytes >= 0, "[zero] a tensor's size must be >= 0 bytes, got ", bytes);
    // min_element returns the first minimum: the lowest rank on a tie.
    const auto least = std::min_element(load.begin(), load.end());
    *least += bytes;
    owners.push_back(static_cast<int>(least - load.begin()));
  }
  return owners;
}

std::vector<int64_t> bytes_per_rank(const std::vector<int64_t>& tensor_bytes, const std::vector<int>& owners,
                                    int world_size) {
  TORCH_CHECK_VALUE(tensor_bytes.size() == owners.size(), "[zero] ", tensor_bytes.size(), " sizes but ",
                    owners.size(), " owners");
  std::vector<int64_t> out(static_cast<size_t>(std::max(world_size, 0)), 0);
  for (size_t i = 0; i < owners.size(); ++i) {
    TORCH_CHECK_VALUE(owners[i] >= 0 && owners[i] < world_size, "[zero] owner ", owners[i], " of tensor ", i,
                      " is not a rank of ", world_size);
    out[static_cast<size_t>(owners[i])] += tensor_bytes[i];
  }
  return out;
}

int64_t zero_state_bytes_per_rank(const OptimizerSettings& settings, const std::vector<at::Tensor>& parameters,
                                  int world_size) {
  std::vector<int64_t> sizes;
  for (const auto& p : parameters) sizes.push_back(bytes_of(p));
  const std::vector<int> owners = assign_to_ranks(sizes, world_size);
  int64_t most = 0;
  for (int r = 0; r < world_size; ++r) {
    std::vector<at::Tensor> owned;
    for (size_t i = 0; i < parameters.size(); ++i) {
      if (owners[i] == r) owned.push_back(parameters[i]);
    }
    most = std::max(most, optimizer_state_bytes(settings, owned));
  }
  return most;
}

int64_t zero_broadcast_buffer_bytes(const std::vector<at::Tensor>& parameters, int world_size, int64_t bucket_bytes) {
  std::vector<int64_t> sizes;
  for (const auto& p : parameters) sizes.push_back(bytes_of(p));
  const std::vector<int> owners = assign_to_ranks(sizes, world_size);
  int64_t largest = 0;
  for (int r = 0; r < world_size; ++r) {
    std::vector<int64_t> owned;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (owners[i] == r) owned.push_back(sizes[i]);
    }
    for (const auto& [members, in_place] : pack(owned, bucket_bytes)) {
      if (in_place) continue;  // broadcast without a buffer
      int64_t bytes = 0;
      for (size_t m : members) bytes += owned[m];
      largest = std::max(largest, bytes);
    }
  }
  return largest;
}

void check_zero_run(int zero_stage, const std::string& model_type, const std::string& optimizer, int world_size) {
  if (zero_stage == 0) return;
  const std::string value = "zero" + std::to_string(zero_stage);
  if (zero_stage != 1) {
    throw ValidationError("deepspeed_config", value,
                          "[train] deepspeed_config asks for ZeRO stage " + std::to_string(zero_stage) +
                              "; remat implements stage 1 only (sharded optimizer state)");
  }
  if (model_type != "full") {
    throw ValidationError("deepspeed_config", value,
                          "[train] deepspeed_config (ZeRO stage 1) needs model_type full, got '" + model_type +
                              "': a LoRA's optimizer state is small, and SimpleTuner's DeepSpeed presets "
                              "require a full fine-tune too");
  }
  if (world_size == 1) {
    throw ValidationError("deepspeed_config", value,
                          "[train] deepspeed_config (ZeRO stage 1) shards the optimizer state across processes, "
                          "but this run has " + std::to_string(world_size) +
                              " process (WORLD_SIZE); start it with torchrun or remat launch, or remove "
                              "deepspeed_config");
  }
  if (optimizer == "adamw_bf16") {
    throw ValidationError("deepspeed_config", value,
                          "[train] deepspeed_config (ZeRO stage 1) needs optimizer torch-adamw or optimi-lion, got "
                          "adamw_bf16: its stochastic rounding draws random numbers per updated tensor, so with "
                          "each rank updating only its shard the weights would differ from plain data "
                          "parallel's");
  }
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(distributed::ProcessGroup& group, std::vector<at::Tensor> parameters,
                                                 const OptimizerSettings& settings, int64_t bucket_bytes)
    : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(parameters)},
                              std::make_unique<ZeroOptions>(settings.learning_rate)),
      group_(group),
      parameters_(std::move(parameters)),
      settings_(settings) {
  check_zero_run(1, "full", settings.name, group.world_size());
  TORCH_CHECK_VALUE(bucket_bytes > 0, "[zero] bucket_bytes must be > 0, got ", bucket_bytes);
  std::vector<int64_t> sizes;
  for (const auto& p : parameters_) {
    TORCH_CHECK_VALUE(p.is_contiguous(), "[zero] every trainable tensor must be contiguous");
    TORCH_CHECK_VALUE(p.device() == parameters_.front().device(), "[zero] every trainable tensor must be on ",
                      parameters_.front().device(), ", one is on ", p.device());
    sizes.push_back(bytes_of(p));
  }
  owners_ = assign_to_ranks(sizes, group.world_size());
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (owners_[i] == group.rank()) owned_.push_back(parameters_[i]);
  }
  // The single-process run's optimizer over the owned tensors (a rank may own none: the
  // optimizer then has an empty group and steps nothing).
  local_ = make_optimizer(owned_, settings_);
  for (int owner = 0; owner < group.world_size(); ++owner) {
    std::vector<size_t> indices;
    std::vector<int64_t> owned_sizes;
    for (size_t i = 0; i < parameters_.size(); ++i) {
      if (owners_[i] != owner) continue;
      indices.push_back(i);
      owned_sizes.push_back(sizes[i]);
    }
    for (const auto& [members, in_place] : pack(owned_sizes, bucket_bytes)) {
      Bucket b;
      b.owner = owner;
      b.in_place = in_place;
      for (size_t m : members) {
        b.tensors.push_back(indices[m]);
        b.bytes += sizes[indices[m]];
      }
      buckets_.push_back(std::move(b));
    }
  }
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() = default;

at::Tensor ZeroRedundancyOptimizer::step(LossClosure closure) {
  // A closure would rerun the forward on one rank's shard only; the training step never passes one.
  TORCH_CHECK_VALUE(!closure, "[zero] ZeroRedundancyOptimizer::step takes no closure");
  set_learning_rate(*local_, param_groups().front().options().get_lr());
  local_->step();
  broadcast_parameters();
  return {};
}

void ZeroRedundancyOptimizer::broadcast_parameters() {
  at::NoGradGuard no_grad;
  if (parameters_.empty()) return;
  const c10::Device device = parameters_.front().device();
  for (const Bucket& b : buckets_) {
    std::vector<at::Tensor> tensors;
    for (size_t i : b.tensors) tensors.push_back(parameters_[i]);
    broadcast_group(group_, tensors, b.in_place, b.owner, device,
                    "sending rank " + std::to_string(b.owner) + "'s updated weights (ZeRO-1)");
  }
}

std::vector<std::pair<std::string, at::Tensor>> ZeroRedundancyOptimizer::gather_full_state(
    const std::vector<std::pair<std::string, at::Tensor>>& params) {
  TORCH_CHECK_VALUE(params.size() == parameters_.size(), "[zero] gather_full_state needs the ", parameters_.size(),
                    " trainable tensors the optimizer was built with, got ", params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    TORCH_CHECK_VALUE(params[i].second.is_same(parameters_[i]), "[zero] gather_full_state: tensor ", i, " ('",
                      params[i].first, "') is not the optimizer's tensor ", i);
  }
  at::NoGradGuard no_grad;
  const int rank = group_.rank();
  const c10::Device device = parameters_.empty() ? c10::Device(c10::kCPU) : parameters_.front().device();
  const auto byte_options = at::TensorOptions().dtype(at::kByte).device(device);
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> by_param(params.size());
  for (int owner = 0; owner < group_.world_size(); ++owner) {
    // This owner's entries, in its tensors' order (optimizer_state's order for each tensor).
    std::vector<Entry> entries;
    std::vector<at::Tensor> values;
    if (rank == owner) {
      for (size_t i = 0; i < params.size(); ++i) {
        if (owners_[i] != owner) continue;
        for (auto& [name, t] : optimizer_state(*local_, {params[i]})) {
          entries.push_back({i, name, t.scalar_type(), t.device().is_cpu() && !device.is_cpu(), t.sizes().vec()});
          values.push_back(t);
        }
      }
    }
    if (owner == 0) {  // rank 0 has its own shard
      if (rank == 0) {
        for (size_t k = 0; k < entries.size(); ++k) by_param[entries[k].param].emplace_back(entries[k].name, values[k]);
      }
      continue;
    }
    // The owner tells every rank what it sends, then sends it (Note [ZeRO broadcasts]).
    std::string text = rank == owner ? describe_entries(entries) : std::string();
    std::vector<at::Tensor> length{at::full({1}, static_cast<int64_t>(text.size()),
                                            at::TensorOptions().dtype(at::kLong).device(device))};
    const std::string why = "gathering rank " + std::to_string(owner) + "'s optimizer state (ZeRO-1)";
    group_.broadcast(length, owner, why);
    const int64_t text_bytes = length[0].item<int64_t>();
    if (text_bytes == 0) continue;  // this owner's tensors were never stepped: no state
    std::vector<at::Tensor> bytes{at::empty({text_bytes}, byte_options)};
    if (rank == owner) bytes[0].copy_(at::from_blob(text.data(), {text_bytes}, at::kByte));
    group_.broadcast(bytes, owner, why);
    if (rank != owner) {
      const at::Tensor host = bytes[0].to(at::kCPU);
      entries = parse_entries(std::string(reinterpret_cast<const char*>(host.data_ptr<uint8_t>()),
                                          static_cast<size_t>(host.numel())));
      for (const auto& e : entries) {
        values.push_back(at::empty(e.sizes, at::TensorOptions().dtype(e.dtype).device(device)));
      }
    } else {
      for (auto& v : values) v = v.to(device).contiguous();
    }
    std::vector<int64_t> sizes;
    for (const auto& v : values) sizes.push_back(bytes_of(v));
    for (const auto& [members, in_place] : pack(sizes, ZeroRedundancyOptimizer::kDefaultBucketBytes)) {
      std::vector<at::Tensor> group_tensors;
      for (size_t m : members) group_tensors.push_back(values[m]);
      broadcast_group(group_, group_tensors, in_place, owner, device, why);
    }
    if (rank == 0) {
      for (size_t k = 0; k < entries.size(); ++k) {
        by_param[entries[k].param].emplace_back(entries[k].name,
                                                entries[k].cpu ? values[k].to(at::kCPU) : values[k]);
      }
    }
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (rank != 0) return out;
  for (auto& entries : by_param) {
    for (auto& e : entries) out.push_back(std::move(e));
  }
  return out;
}

void ZeroRedundancyOptimizer::restore_full_state(const std::vector<std::pair<std::string, at::Tensor>>& params,
                                                 const std::vector<std::pair<std::string, at::Tensor>>& state) {
  TORCH_CHECK_VALUE(params.size() == parameters_.size(), "[zero] restore_full_state needs the ", parameters_.size(),
                    " trainable tensors the optimizer was built with, got ", params.size());
  std::vector<std::pair<std::string, at::Tensor>> owned;
  for (size_t i = 0; i < params.size(); ++i) {
    TORCH_CHECK_VALUE(params[i].second.is_same(parameters_[i]), "[zero] restore_full_state: tensor ", i, " ('",
                      params[i].first, "') is not the optimizer's tensor ", i);
    if (owners_[i] == group_.rank()) owned.push_back(params[i]);
  }
  restore_optimizer_state(*local_, owned, state);
}

}  // namespace remat::train
