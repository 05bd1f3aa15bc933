#include "step_model_json.h"

// Each struct's fields are listed once (nlohmann's NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE writes both
// directions), so a field added to the cost model cannot be written without being read back. The
// macros define to_json / from_json in the types' own namespace, where nlohmann finds them.
namespace remat {

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(BlockCost, kind, forward_s, backward_s, activation_bytes, retained_input_bytes,
                                   boundary_bytes, boundary_grad_bytes, output_bytes, output_grad_bytes,
                                   forward_peak_bytes, backward_peak_bytes, parameter_grad_bytes)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Chain, blocks, fixed_bytes, forced_boundaries, offload_to_host,
                                   host_bandwidth_bytes_per_s, checkpoint_overhead_bytes, tail_peak_bytes,
                                   tail_backward_bytes, fixed_peak_bytes, fixed_time_s)

}  // namespace remat

namespace remat::ui::detail {

nlohmann::json step_model_json(const train::StepModel& model) {
  return {{"chain", model.chain},
          {"ffn_chain", model.ffn_chain ? nlohmann::json(*model.ffn_chain) : nlohmann::json()},
          {"stack_sizes", model.stack_sizes},
          {"missing_optimizer_state_bytes", model.missing_optimizer_state_bytes},
          {"block_forward_s", model.block_forward_s}};
}

train::StepModel step_model_from_json(const nlohmann::json& json) {
  train::StepModel model;
  json.at("chain").get_to(model.chain);
  if (!json.at("ffn_chain").is_null()) model.ffn_chain = json.at("ffn_chain").get<Chain>();
  json.at("stack_sizes").get_to(model.stack_sizes);
  json.at("missing_optimizer_state_bytes").get_to(model.missing_optimizer_state_bytes);
  json.at("block_forward_s").get_to(model.block_forward_s);
  return model;
}

}  // namespace remat::ui::detail
