#include "step_model_json.h"

namespace remat::ui::detail {
namespace {

nlohmann::json block_json(const BlockCost& b) {
  return {{"kind", b.kind},
          {"forward_s", b.forward_s},
          {"backward_s", b.backward_s},
          {"activation_bytes", b.activation_bytes},
          {"retained_input_bytes", b.retained_input_bytes},
          {"boundary_bytes", b.boundary_bytes},
          {"boundary_grad_bytes", b.boundary_grad_bytes},
          {"output_bytes", b.output_bytes},
          {"output_grad_bytes", b.output_grad_bytes},
          {"forward_peak_bytes", b.forward_peak_bytes},
          {"backward_peak_bytes", b.backward_peak_bytes},
          {"parameter_grad_bytes", b.parameter_grad_bytes}};
}

BlockCost block_from_json(const nlohmann::json& j) {
  BlockCost b;
  j.at("kind").get_to(b.kind);
  j.at("forward_s").get_to(b.forward_s);
  j.at("backward_s").get_to(b.backward_s);
  j.at("activation_bytes").get_to(b.activation_bytes);
  j.at("retained_input_bytes").get_to(b.retained_input_bytes);
  j.at("boundary_bytes").get_to(b.boundary_bytes);
  j.at("boundary_grad_bytes").get_to(b.boundary_grad_bytes);
  j.at("output_bytes").get_to(b.output_bytes);
  j.at("output_grad_bytes").get_to(b.output_grad_bytes);
  j.at("forward_peak_bytes").get_to(b.forward_peak_bytes);
  j.at("backward_peak_bytes").get_to(b.backward_peak_bytes);
  j.at("parameter_grad_bytes").get_to(b.parameter_grad_bytes);
  return b;
}

nlohmann::json chain_json(const Chain& c) {
  nlohmann::json blocks = nlohmann::json::array();
  for (const BlockCost& b : c.blocks) blocks.push_back(block_json(b));
  return {{"blocks", blocks},
          {"fixed_bytes", c.fixed_bytes},
          {"forced_boundaries", c.forced_boundaries},
          {"offload_to_host", c.offload_to_host},
          {"host_bandwidth_bytes_per_s", c.host_bandwidth_bytes_per_s},
          {"checkpoint_overhead_bytes", c.checkpoint_overhead_bytes},
          {"tail_peak_bytes", c.tail_peak_bytes},
          {"tail_backward_bytes", c.tail_backward_bytes},
          {"fixed_peak_bytes", c.fixed_peak_bytes},
          {"fixed_time_s", c.fixed_time_s}};
}

Chain chain_from_json(const nlohmann::json& j) {
  Chain c;
  for (const auto& b : j.at("blocks")) c.blocks.push_back(block_from_json(b));
  j.at("fixed_bytes").get_to(c.fixed_bytes);
  j.at("forced_boundaries").get_to(c.forced_boundaries);
  j.at("offload_to_host").get_to(c.offload_to_host);
  j.at("host_bandwidth_bytes_per_s").get_to(c.host_bandwidth_bytes_per_s);
  j.at("checkpoint_overhead_bytes").get_to(c.checkpoint_overhead_bytes);
  j.at("tail_peak_bytes").get_to(c.tail_peak_bytes);
  j.at("tail_backward_bytes").get_to(c.tail_backward_bytes);
  j.at("fixed_peak_bytes").get_to(c.fixed_peak_bytes);
  j.at("fixed_time_s").get_to(c.fixed_time_s);
  return c;
}

}  // namespace

nlohmann::json step_model_json(const train::StepModel& model) {
  return {{"chain", chain_json(model.chain)},
          {"ffn_chain", model.ffn_chain ? chain_json(*model.ffn_chain) : nlohmann::json()},
          {"stack_sizes", model.stack_sizes},
          {"missing_optimizer_state_bytes", model.missing_optimizer_state_bytes},
          {"block_forward_s", model.block_forward_s}};
}

train::StepModel step_model_from_json(const nlohmann::json& json) {
  train::StepModel model;
  model.chain = chain_from_json(json.at("chain"));
  if (!json.at("ffn_chain").is_null()) model.ffn_chain = chain_from_json(json.at("ffn_chain"));
  json.at("stack_sizes").get_to(model.stack_sizes);
  json.at("missing_optimizer_state_bytes").get_to(model.missing_optimizer_state_bytes);
  json.at("block_forward_s").get_to(model.block_forward_s);
  return model;
}

}  // namespace remat::ui::detail
