// The one table between Black Forest Labs' Flux names and diffusers' (diffusers'
// convert_flux_transformer_checkpoint_to_diffusers in loaders/single_file_utils.py), and what is
// derived from it: the per-model module and tensor lists, name lookups for the LoRA formats, and
// the Markdown rendering in docs/WEIGHT_FORMATS.md.
#include <cctype>
#include <sstream>

#include "remat/models/flux_weight_formats.h"

namespace remat::models {
namespace {

std::string fill_index(std::string pattern, int64_t index) {
  const std::string placeholder = "{i}";
  const size_t at = pattern.find(placeholder);
  if (at != std::string::npos) pattern.replace(at, placeholder.size(), std::to_string(index));
  return pattern;
}

std::string underscore(std::string name) {
  for (char& c : name) {
    if (c == '.') c = '_';
  }
  return name;
}

BflModule instantiate(const BflModulePattern& pattern, int64_t index, int64_t hidden) {
  BflModule out;
  out.pattern = &pattern;
  out.bfl = fill_index(pattern.bfl, index);
  for (const auto& d : pattern.diffusers) out.diffusers.push_back(fill_index(d, index));
  if (hidden > 0) {
    for (int64_t units : pattern.split_units) out.split_rows.push_back(units * hidden);
  }
  return out;
}

int64_t total_units(const BflModulePattern& pattern) {
  int64_t sum = 0;
  for (int64_t u : pattern.split_units) sum += u;
  return sum;
}

// "double_blocks.3.rest" -> {double_block, 3, "rest"}; separator '.' or '_' (kohya).
struct BlockName {
  BflScope scope = BflScope::global;
  int64_t index = -1;
  std::string rest;
};

BlockName split_block_name(const std::string& name, char sep) {
  for (const auto& [prefix, scope] : {std::pair<std::string, BflScope>{"double_blocks", BflScope::double_block},
                                      {"single_blocks", BflScope::single_block}}) {
    const std::string head = prefix + sep;
    if (name.compare(0, head.size(), head) != 0) continue;
    size_t pos = head.size();
    size_t end = pos;
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
    if (end == pos || end >= name.size() || name[end] != sep || end - pos > 9) return {};
    return {scope, std::stoll(name.substr(pos, end - pos)), name.substr(end + 1)};
  }
  return {BflScope::global, -1, name};
}

// The pattern's name after "{i}." (block rows) or whole (global rows).
std::string pattern_rest(const BflModulePattern& p) {
  if (p.scope == BflScope::global) return p.bfl;
  return p.bfl.substr(p.bfl.find("{i}.") + 4);
}

}  // namespace

const std::vector<BflModulePattern>& flux_bfl_module_patterns() {
  using S = BflScope;
  using K = BflModuleKind;
  // clang-format off
  static const std::vector<BflModulePattern> table = {
      {S::global, K::linear, "img_in", {"x_embedder"}, {}, false, false},
      {S::global, K::linear, "time_in.in_layer", {"time_text_embed.timestep_embedder.linear_1"}, {}, false, false},
      {S::global, K::linear, "time_in.out_layer", {"time_text_embed.timestep_embedder.linear_2"}, {}, false, false},
      {S::global, K::linear, "guidance_in.in_layer", {"time_text_embed.guidance_embedder.linear_1"}, {}, false, true},
      {S::global, K::linear, "guidance_in.out_layer", {"time_text_embed.guidance_embedder.linear_2"}, {}, false, true},
      {S::global, K::linear, "vector_in.in_layer", {"time_text_embed.text_embedder.linear_1"}, {}, false, false},
      {S::global, K::linear, "vector_in.out_layer", {"time_text_embed.text_embedder.linear_2"}, {}, false, false},
      {S::global, K::linear, "txt_in", {"context_embedder"}, {}, false, false},

      {S::double_block, K::linear, "double_blocks.{i}.img_mod.lin", {"transformer_blocks.{i}.norm1.linear"}, {}, false, false},
      {S::double_block, K::linear, "double_blocks.{i}.img_attn.qkv",
       {"transformer_blocks.{i}.attn.to_q", "transformer_blocks.{i}.attn.to_k", "transformer_blocks.{i}.attn.to_v"},
       {1, 1, 1}, false, false},
      {S::double_block, K::rms_norm, "double_blocks.{i}.img_attn.norm.query_norm", {"transformer_blocks.{i}.attn.norm_q"}, {}, false, false},
      {S::double_block, K::rms_norm, "double_blocks.{i}.img_attn.norm.key_norm", {"transformer_blocks.{i}.attn.norm_k"}, {}, false, false},
      {S::double_block, K::linear, "double_blocks.{i}.img_attn.proj", {"transformer_blocks.{i}.attn.to_out.0"}, {}, false, false},
      {S::double_block, K::linear, "double_blocks.{i}.img_mlp.0", {"transformer_blocks.{i}.ff.net.0.proj"}, {}, false, false},
      {S::double_block, K::linear, "double_blocks.{i}.img_mlp.2", {"transformer_blocks.{i}.ff.net.2"}, {}, false, false},
      {S::double_block, K::linear, "double_blocks.{i}.txt_mod.lin", {"transformer_blocks.{i}.norm1_context.linear"}, {}, false, false},
      {S::double_block, K::linear, "double_blocks.{i}.txt_attn.qkv",
       {"transformer_blocks.{i}.attn.add_q_proj", "transformer_blocks.{i}.attn.add_k_proj",
        "transformer_blocks.{i}.attn.add_v_proj"},
       {1, 1, 1}, false, false},
      {S::double_block, K::rms_norm, "double_blocks.{i}.txt_attn.norm.query_norm", {"transformer_blocks.{i}.attn.norm_added_q"}, {}, false, false},
      {S::double_block, K::rms_norm, "double_blocks.{i}.txt_attn.norm.key_norm", {"transformer_blocks.{i}.attn.norm_added_k"}, {}, false, false},
      {S::double_block, K::linear, "double_blocks.{i}.txt_attn.proj", {"transformer_blocks.{i}.attn.to_add_out"}, {}, false, false},
      {S::double_block, K::linear, "double_blocks.{i}.txt_mlp.0", {"transformer_blocks.{i}.ff_context.net.0.proj"}, {}, false, false},
      {S::double_block, K::linear, "double_blocks.{i}.txt_mlp.2", {"transformer_blocks.{i}.ff_context.net.2"}, {}, false, false},

      {S::single_block, K::linear, "single_blocks.{i}.linear1",
       {"single_transformer_blocks.{i}.attn.to_q", "single_transformer_blocks.{i}.attn.to_k",
        "single_transformer_blocks.{i}.attn.to_v", "single_transformer_blocks.{i}.proj_mlp"},
       {1, 1, 1, 4}, false, false},
      {S::single_block, K::linear, "single_blocks.{i}.linear2", {"single_transformer_blocks.{i}.proj_out"}, {}, false, false},
      {S::single_block, K::rms_norm, "single_blocks.{i}.norm.query_norm", {"single_transformer_blocks.{i}.attn.norm_q"}, {}, false, false},
      {S::single_block, K::rms_norm, "single_blocks.{i}.norm.key_norm", {"single_transformer_blocks.{i}.attn.norm_k"}, {}, false, false},
      {S::single_block, K::linear, "single_blocks.{i}.modulation.lin", {"single_transformer_blocks.{i}.norm.linear"}, {}, false, false},

      {S::global, K::linear, "final_layer.linear", {"proj_out"}, {}, false, false},
      {S::global, K::linear, "final_layer.adaLN_modulation.1", {"norm_out.linear"}, {}, true, false},
  };
  // clang-format on
  return table;
}

std::vector<BflModule> flux_bfl_modules(const FluxConfig& config) {
  const int64_t hidden = config.hidden_size();
  std::vector<BflModule> out;
  const auto& table = flux_bfl_module_patterns();
  const auto emit = [&](BflScope scope, int64_t count) {
    for (int64_t i = 0; i < count; ++i) {
      for (const auto& p : table) {
        if (p.scope == scope) out.push_back(instantiate(p, i, hidden));
      }
    }
  };
  // BFL's own module order: the embedders, the double blocks, the single blocks, the final layer.
  for (const auto& p : table) {
    if (p.scope != BflScope::global || p.bfl.rfind("final_layer", 0) == 0) continue;
    if (p.guidance_only && !config.guidance_embeds) continue;
    out.push_back(instantiate(p, 0, hidden));
  }
  emit(BflScope::double_block, config.num_layers);
  emit(BflScope::single_block, config.num_single_layers);
  for (const auto& p : table) {
    if (p.scope == BflScope::global && p.bfl.rfind("final_layer", 0) == 0) out.push_back(instantiate(p, 0, hidden));
  }
  return out;
}

std::vector<BflTensor> flux_bfl_tensors(const FluxConfig& config) {
  std::vector<BflTensor> out;
  for (const auto& m : flux_bfl_modules(config)) {
    const bool norm = m.pattern->kind == BflModuleKind::rms_norm;
    const std::vector<std::pair<std::string, std::string>> suffixes =
        norm ? std::vector<std::pair<std::string, std::string>>{{".scale", ".weight"}}
             : std::vector<std::pair<std::string, std::string>>{{".weight", ".weight"}, {".bias", ".bias"}};
    for (const auto& [bfl_suffix, diffusers_suffix] : suffixes) {
      BflTensor t;
      t.bfl_key = m.bfl + bfl_suffix;
      for (const auto& d : m.diffusers) t.diffusers_keys.push_back(d + diffusers_suffix);
      t.split_rows = m.split_rows;
      t.swap_halves = m.pattern->swap_halves;
      out.push_back(std::move(t));
    }
  }
  return out;
}

std::optional<BflModule> find_bfl_module(const std::string& bfl_module, bool underscored, int64_t fused_rows) {
  const char sep = underscored ? '_' : '.';
  const BlockName name = split_block_name(bfl_module, sep);
  for (const auto& p : flux_bfl_module_patterns()) {
    if (p.scope != name.scope) continue;
    const std::string rest = underscored ? underscore(pattern_rest(p)) : pattern_rest(p);
    if (rest != name.rest) continue;
    const int64_t units = total_units(p);
    const int64_t hidden = (units > 0 && fused_rows > 0 && fused_rows % units == 0) ? fused_rows / units : 0;
    BflModule m = instantiate(p, name.index, hidden);
    return m;
  }
  return std::nullopt;
}

std::optional<BflModuleSlot> find_bfl_module_of(const std::string& diffusers_module) {
  // Block rows: find the index from the diffusers prefix, then compare the pattern with it filled.
  int64_t index = 0;
  for (const std::string prefix : {"single_transformer_blocks.", "transformer_blocks."}) {
    if (diffusers_module.rfind(prefix, 0) != 0) continue;
    const size_t end = diffusers_module.find('.', prefix.size());
    const std::string digits = diffusers_module.substr(prefix.size(), end - prefix.size());
    if (digits.empty() || digits.size() > 9 ||
        digits.find_first_not_of("0123456789") != std::string::npos) {
      return std::nullopt;
    }
    index = std::stoll(digits);
    break;
  }
  for (const auto& p : flux_bfl_module_patterns()) {
    if (p.kind != BflModuleKind::linear) continue;
    for (size_t j = 0; j < p.diffusers.size(); ++j) {
      if (fill_index(p.diffusers[j], index) == diffusers_module) return BflModuleSlot{instantiate(p, index, 0), j};
    }
  }
  return std::nullopt;
}

std::string render_flux_bfl_table_markdown() {
  const FluxConfig dev = FluxConfig::preset("flux-dev");
  std::ostringstream out;
  out << "| BFL module | diffusers module(s) | kind | rows per target (flux-dev) | transform |\n";
  out << "| --- | --- | --- | --- | --- |\n";
  for (const auto& p : flux_bfl_module_patterns()) {
    std::string targets;
    for (const auto& d : p.diffusers) targets += (targets.empty() ? "`" : ", `") + d + "`";
    std::string rows = "whole tensor";
    if (!p.split_units.empty()) {
      rows.clear();
      for (int64_t u : p.split_units) rows += (rows.empty() ? "" : ", ") + std::to_string(u * dev.hidden_size());
    }
    std::string transform = p.split_units.empty() ? "copy" : "split along dim 0";
    if (p.swap_halves) transform = "swap the two halves of dim 0 (BFL shift, scale; diffusers scale, shift)";
    if (p.guidance_only) transform += "; guidance-distilled models only";
    const std::string kind =
        p.kind == BflModuleKind::linear ? "Linear (`.weight`, `.bias`)" : "RMSNorm (BFL `.scale`, diffusers `.weight`)";
    out << "| `" << p.bfl << "` | " << targets << " | " << kind << " | " << rows << " | " << transform << " |\n";
  }
  return out.str();
}

}  // namespace remat::models
