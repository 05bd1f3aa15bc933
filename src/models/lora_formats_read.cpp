// Reading the Flux LoRA files people share into diffusers module names (diffusers'
// FluxLoraLoaderMixin.lora_state_dict in loaders/lora_pipeline.py and
// loaders/lora_conversion_utils.py). BFL / kohya names go through the
// one table of remat/models/flux_weight_formats.h.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "string_helpers.h"
#include "remat/util/error.h"
#include "remat/util/bounded_json.h"
#include "remat/io/safetensors.h"
#include "remat/models/flux_weight_formats.h"
#include "remat/models/lora.h"
#include "remat/models/lora_formats.h"

namespace remat::models {
namespace {

using remat::detail::contains;
using remat::detail::ends_with;
using remat::detail::starts_with;

const char* const kLoraReadTag = "[lora] ";


// (shift, scale) <-> (scale, shift): the two halves of dim 0 trade places.
at::Tensor swap_halves(const at::Tensor& t) {
  const auto halves = t.chunk(2, 0);
  return halves.size() == 2 ? at::cat({halves[1], halves[0]}, 0) : t;
}

class Reader {
 public:
  explicit Reader(const std::string& path) : file_(io::SafetensorsFile::open(path)) { out_.path = path; }

  LoraFile read() {
    for (const auto& k : file_.names()) {
      if (contains(k, "dora_scale")) {
        out_.warnings.push_back("dropped " + k + " (DoRA magnitudes are not supported; the rest loads as LoRA)");
      } else {
        keys_.push_back(k);
      }
    }
    if (keys_.empty()) fail("has no LoRA tensors");
    const auto any = [&](const std::string& part) {
      return std::any_of(keys_.begin(), keys_.end(), [&](const std::string& k) { return contains(k, part); });
    };
    if (any(".lora_down.weight")) {
      out_.format = LoraFileFormat::kohya;
      read_kohya();
    } else if (any("processor")) {
      out_.format = LoraFileFormat::xlabs;
      read_xlabs();
    } else if (any("query_norm.scale")) {
      out_.format = LoraFileFormat::bfl;
      read_bfl_control();
    } else if (any("base_model")) {
      fail("is a fal Kontext LoRA (keys with 'base_model'), which remat does not read");
    } else {
      out_.format = LoraFileFormat::peft;
      read_peft();
    }
    if (out_.modules.empty() && out_.replaced_weights.empty()) {
      fail("holds no LoRA for the transformer (" + std::to_string(out_.warnings.size()) + " parts dropped" +
           (out_.warnings.empty() ? "" : ": " + out_.warnings.front()) + ")");
    }
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw_value_error(kLoraReadTag + file_.path() + " " + what); }
  [[noreturn]] void unrecognised(const std::string& key, const std::string& format) const {
    fail("(" + format + " format): key '" + key + "' is not recognised (expected " + expected_of(format) + ")");
  }
  static std::string expected_of(const std::string& format) {
    if (format == "peft") return "transformer.<module>.lora_A.weight / .lora_B.weight / .alpha";
    if (format == "kohya") return "lora_unet_<BFL module with _>.lora_down.weight / .lora_up.weight / .alpha";
    if (format == "xlabs") return "double_blocks.N.processor.{qkv,proj}_lora{1,2}.{down,up}.weight";
    return "<BFL module>.lora_A.weight / .lora_B.weight or <BFL norm>.scale";
  }

  at::Tensor tensor(const std::string& key) {
    used_.insert(key);
    const auto& info = file_.info(key);
    if (!at::isFloatingType(info.dtype)) fail("key " + key + " must be a floating tensor, is " + c10::toString(info.dtype));
    at::Tensor t = file_.tensor(key, at::kFloat);
    io::require_finite(t, "lora", file_.path(), key);
    return t;
  }
  bool has(const std::string& key) const { return file_.contains(key); }

  void add(const std::string& module, const at::Tensor& down, const at::Tensor& up, double scale,
           const std::string& source) {
    if (down.dim() != 2 || up.dim() != 2 || up.size(1) != down.size(0)) {
      fail("key " + source + ": LoRA factors must be down (r, in) and up (out, r), got " +
           c10::str(down.sizes()) + " and " + c10::str(up.sizes()));
    }
    if (!out_.modules.emplace(module, LoraModuleWeights{down.contiguous(), up.contiguous(), scale}).second) {
      fail("holds two LoRAs for module " + module + " (second from " + source + ")");
    }
  }

  // Splits one adapter of a fused BFL layer (qkv, linear1) onto its diffusers targets. `shared_down`:
  // every target gets the whole down (xlabs, BFL control); otherwise kohya's rule (diffusers'
  // _convert_kohya_flux_lora_to_diffusers): a
  // block-diagonal up with rank divisible by the part count is split into rank chunks, anything
  // else shares down.
  void add_fused(const BflModule& m, const at::Tensor& down, const at::Tensor& up, bool kohya_sparse_check,
                 const std::string& source) {
    const size_t n = m.diffusers.size();
    if (m.split_rows.empty() || up.dim() != 2 || down.dim() != 2) {
      fail("key " + source + ": up rows " + (up.dim() == 2 ? std::to_string(up.size(0)) : std::string("?")) +
           " cannot be split into " + std::to_string(n) + " parts of the fused layer " + m.bfl);
    }
    const int64_t rank = down.size(0);
    bool sparse = false;
    if (kohya_sparse_check && rank % static_cast<int64_t>(n) == 0) {
      const int64_t part_rank = rank / static_cast<int64_t>(n);
      sparse = true;
      int64_t row = 0;
      for (size_t j = 0; j < n && sparse; ++j) {
        for (size_t k = 0; k < n && sparse; ++k) {
          if (j == k) continue;
          sparse = up.narrow(0, row, m.split_rows[j]).narrow(1, k * part_rank, part_rank).eq(0).all().item<bool>();
        }
        row += m.split_rows[j];
      }
    }
    int64_t row = 0;
    for (size_t j = 0; j < n; ++j) {
      const at::Tensor rows = up.narrow(0, row, m.split_rows[j]);
      if (sparse) {
        const int64_t part_rank = rank / static_cast<int64_t>(n);
        add(m.diffusers[j], down.narrow(0, j * part_rank, part_rank), rows.narrow(1, j * part_rank, part_rank), 1.0,
            source);
      } else {
        add(m.diffusers[j], down, rows, 1.0, source);
      }
      row += m.split_rows[j];
    }
  }

  // ---- kohya / sd-scripts (diffusers' _convert_kohya_flux_lora_to_diffusers) ----
  void read_kohya() {
    const bool peft_inside = std::any_of(keys_.begin(), keys_.end(), [](const auto& k) { return starts_with(k, "transformer."); });
    if (peft_inside) return read_kohya_peft_inside();
    const bool mixture = std::any_of(keys_.begin(), keys_.end(), [](const auto& k) {
      return starts_with(k, "lora_transformer_") && (contains(k, "lora_down") || contains(k, "lora_up") || contains(k, "alpha"));
    });
    // Group the keys by layer name ("lora_unet_double_blocks_0_img_attn_qkv") with its parts.
    std::map<std::string, std::map<std::string, std::string>> layers;  // name -> suffix -> file key
    for (const auto& key : keys_) {
      std::string k = key;
      if (!mixture) {
        if (dropped_kohya_key(key)) continue;
        k = sd_scripts_name(key);
      }
      std::string suffix;
      for (const std::string s : {".lora_down.weight", ".lora_up.weight", ".alpha"}) {
        if (ends_with(k, s)) suffix = s;
      }
      if (suffix.empty()) unrecognised(key, "kohya");
      const std::string name = k.substr(0, k.size() - suffix.size());
      if (starts_with(name, "lora_te")) {
        if (suffix == ".lora_down.weight") out_.warnings.push_back("dropped text-encoder LoRA " + name + " (transformer only)");
        used_.insert(key);
        continue;
      }
      if (mixture && starts_with(name, "lora_unet_")) {
        out_.warnings.push_back("dropped " + key + " (lora_unet_ key in a lora_transformer_ file, as diffusers does)");
        used_.insert(key);
        continue;
      }
      layers[name][suffix] = key;
    }
    for (const auto& layer : layers) {
      // Named references, not a structured binding: C++17 lambdas cannot capture those (clang refuses).
      const std::string& name = layer.first;
      const auto& parts = layer.second;
      const auto part = [&](const std::string& s) -> std::string {
        const auto it = parts.find(s);
        if (it == parts.end()) fail("has " + name + " without its " + s.substr(1) + " tensor");
        return it->second;
      };
      const at::Tensor down = tensor(part(".lora_down.weight"));
      const at::Tensor up = tensor(part(".lora_up.weight"));
      const std::string source = part(".lora_down.weight");
      if (down.dim() != 2) fail("key " + source + " must be 2-D (r, in), has shape " + c10::str(down.sizes()));
      const int64_t rank = down.size(0);
      double alpha = static_cast<double>(rank);
      const bool final_layer = contains(name, "final_layer");
      if (parts.count(".alpha")) {
        const at::Tensor a = tensor(parts.at(".alpha"));
        if (a.numel() != 1) fail("key " + parts.at(".alpha") + " must hold one number");
        // diffusers discards the final layer's alphas (the leftover final_layer .alpha keys in
        // _convert_kohya_flux_lora_to_diffusers): mirrored so outputs match.
        if (!final_layer) alpha = a.item<double>();
        if (!std::isfinite(alpha)) {
          fail("key " + parts.at(".alpha") + " holds " + c10::str(alpha) + "; alpha must be a finite number");
        }
      } else if (mixture) {
        fail("has " + name + " without its alpha tensor (the lora_transformer_ form requires it)");
      }
      // Bake alpha / rank into the factors the way diffusers does (scale 1 afterwards).
      double scale_down = alpha / static_cast<double>(rank), scale_up = 1.0;
      if (final_layer) scale_down = 1.0;
      // By magnitude: diffusers compares the signed value, which never stops for a negative alpha.
      while (std::abs(scale_down) * 2 < scale_up) {
        scale_down *= 2;
        scale_up /= 2;
      }
      const at::Tensor a_scaled = down * scale_down;
      const at::Tensor b_scaled = up * scale_up;
      if (mixture) {
        add_mixture(name, a_scaled, b_scaled, source);
        continue;
      }
      const std::string bfl_name = name.substr(std::string("lora_unet_").size());
      const auto module = starts_with(name, "lora_unet_") ? find_bfl_module(bfl_name, /*underscored=*/true,
                                                                             up.dim() == 2 ? up.size(0) : 0)
                                                          : std::nullopt;
      if (!module || module->pattern->kind != BflModuleKind::linear) unrecognised(source, "kohya");
      if (module->diffusers.size() > 1) {
        add_fused(*module, a_scaled, b_scaled, /*kohya_sparse_check=*/true, source);
      } else {
        // Final layer: lora_B rows swap (shift, scale) -> (scale, shift); lora_A does not.
        add(module->diffusers[0], a_scaled, module->pattern->swap_halves ? swap_halves(b_scaled) : b_scaled, 1.0,
            source);
      }
    }
    check_all_used("kohya");
  }

  // Keys that diffusers' sd-scripts path filters out, with the reason.
  bool dropped_kohya_key(const std::string& key) {
    std::string why;
    if (contains(key, "position_embedding")) why = "position embedding LoRA";
    else if (starts_with(key, "text_encoders.t5xxl.")) why = "T5 LoRA";
    else if (contains(key, "diff_b")) why = "diff_b bias delta";
    else if (contains(key, ".norm") && contains(key, ".diff")) why = "norm diff";
    else if (contains(key, "text_projection")) why = "text_projection";
    if (why.empty()) return false;
    out_.warnings.push_back("dropped " + key + " (" + why + ", not supported, as in diffusers)");
    used_.insert(key);
    return true;
  }

  // ComfyUI spellings to sd-scripts', and '.' -> '_' before the lora_down/lora_up/alpha suffix.
  static std::string sd_scripts_name(std::string k) {
    for (const auto& [from, to] : {std::pair<std::string, std::string>{"diffusion_model.", "lora_unet_"},
                                   {"text_encoders.clip_l.transformer.", "lora_te_"}}) {
      if (starts_with(k, from)) k = to + k.substr(from.size());
    }
    for (const std::string s : {".lora_down.weight", ".lora_up.weight", ".alpha"}) {
      if (ends_with(k, s)) {
        std::string head = k.substr(0, k.size() - s.size());
        std::replace(head.begin(), head.end(), '.', '_');
        return head + s;
      }
    }
    return k;
  }

  // "lora_transformer_transformer_blocks_3_attn_to_q" -> "transformer_blocks.3.attn.to_q": every
  // diffusers Linear of the table, written with '_', is a candidate.
  void add_mixture(const std::string& name, const at::Tensor& down, const at::Tensor& up, const std::string& source) {
    const std::string wanted = name.substr(std::string("lora_transformer_").size());
    for (const auto& p : flux_bfl_module_patterns()) {
      if (p.kind != BflModuleKind::linear) continue;
      for (const auto& d : p.diffusers) {
        std::string index;
        const size_t brace = d.find("{i}");
        if (brace != std::string::npos) {
          // The block index sits where the pattern has {i}.
          const std::string head = d.substr(0, brace);
          std::string head_u = head;
          std::replace(head_u.begin(), head_u.end(), '.', '_');
          if (!starts_with(wanted, head_u)) continue;
          size_t end = head_u.size();
          while (end < wanted.size() && std::isdigit(static_cast<unsigned char>(wanted[end]))) ++end;
          index = wanted.substr(head_u.size(), end - head_u.size());
          if (index.empty() || index.size() > 9) continue;
        }
        std::string dotted = d;
        if (!index.empty()) dotted.replace(brace, 3, index);
        std::string underscored = dotted;
        std::replace(underscored.begin(), underscored.end(), '.', '_');
        if (underscored == wanted) return add(dotted, down, up, 1.0, source);
      }
    }
    unrecognised(source, "kohya");
  }

  void read_kohya_peft_inside() {
    // A file with both forms: diffusers keeps only the transformer.* keys and renames them.
    std::map<std::string, std::pair<std::string, std::string>> factors;  // module -> (A key, B key)
    for (const auto& key : keys_) {
      if (!starts_with(key, "transformer.")) {
        out_.warnings.push_back("dropped " + key + " (file mixes kohya and diffusers keys; diffusers keeps only "
                                "transformer.*)");
        used_.insert(key);
        continue;
      }
      const std::string k = key.substr(std::string("transformer.").size());
      bool matched = false;
      for (const std::string s : {".lora_down.weight", ".lora_A.weight"}) {
        if (ends_with(k, s)) factors[k.substr(0, k.size() - s.size())].first = key, matched = true;
      }
      for (const std::string s : {".lora_up.weight", ".lora_B.weight"}) {
        if (ends_with(k, s)) factors[k.substr(0, k.size() - s.size())].second = key, matched = true;
      }
      if (!matched) {
        out_.warnings.push_back("dropped " + key + " (not a LoRA factor; alphas of this mixed form are not applied, "
                                "as in diffusers)");
        used_.insert(key);
      }
    }
    for (const auto& [module, keys] : factors) {
      if (keys.first.empty() || keys.second.empty()) fail("has only one LoRA factor of module " + module);
      add(module, tensor(keys.first), tensor(keys.second), 1.0, keys.first);
    }
    check_all_used("kohya");
  }

  // ---- xlabs (diffusers' _convert_xlabs_flux_lora_to_diffusers) ----
  void read_xlabs() {
    for (const auto& key : keys_) {
      if (!ends_with(key, ".down.weight")) continue;
      std::string k = starts_with(key, "diffusion_model.") ? key.substr(std::string("diffusion_model.").size()) : key;
      const std::string up_key = key.substr(0, key.size() - std::string(".down.weight").size()) + ".up.weight";
      if (!has(up_key)) fail("has " + key + " without " + up_key);
      const size_t at = k.find(".processor.");
      if (at == std::string::npos) unrecognised(key, "xlabs");
      const std::string block = k.substr(0, at);  // "double_blocks.3"
      const std::string lora = k.substr(at + std::string(".processor.").size(),
                                        k.size() - at - std::string(".processor.").size() - std::string(".down.weight").size());
      const bool is_double = starts_with(block, "double_blocks.");
      // The xlabs processor names on BFL modules (their targets come from the table).
      std::string bfl_module;
      if (is_double && lora == "qkv_lora1") bfl_module = block + ".img_attn.qkv";
      else if (is_double && lora == "qkv_lora2") bfl_module = block + ".txt_attn.qkv";
      else if (is_double && lora == "proj_lora1") bfl_module = block + ".img_attn.proj";
      else if (is_double && lora == "proj_lora2") bfl_module = block + ".txt_attn.proj";
      else if (!is_double && lora == "proj_lora") bfl_module = block + ".linear2";
      const at::Tensor down = tensor(key);
      const at::Tensor up = tensor(up_key);
      if (!is_double && lora == "qkv_lora") {
        // Single blocks: the xlabs qkv adapter covers q, k, v of linear1 only (equal thirds).
        const auto m = find_bfl_module(block + ".linear1", false, 0);
        if (!m || up.dim() != 2 || up.size(0) % 3 != 0) unrecognised(key, "xlabs");
        BflModule qkv = *m;
        qkv.diffusers.resize(3);
        qkv.split_rows.assign(3, up.size(0) / 3);
        add_fused(qkv, down, up, /*kohya_sparse_check=*/false, key);
        continue;
      }
      const auto m = bfl_module.empty() ? std::nullopt : find_bfl_module(bfl_module, false, up.dim() == 2 ? up.size(0) : 0);
      if (!m) unrecognised(key, "xlabs");
      if (m->diffusers.size() > 1) {
        add_fused(*m, down, up, /*kohya_sparse_check=*/false, key);
      } else {
        add(m->diffusers[0], down, up, 1.0, key);
      }
    }
    check_all_used("xlabs");
  }

  // ---- BFL control LoRA (diffusers' _convert_bfl_flux_control_lora_to_diffusers) ----
  void read_bfl_control() {
    for (const auto& key : keys_) {
      if (ends_with(key, ".scale")) {
        const auto m = find_bfl_module(key.substr(0, key.size() - std::string(".scale").size()), false, 0);
        if (!m || m->pattern->kind != BflModuleKind::rms_norm) unrecognised(key, "bfl");
        out_.replaced_weights[m->diffusers[0] + ".weight"] = tensor(key);
        continue;
      }
      if (ends_with(key, ".lora_A.bias") || ends_with(key, ".lora_B.bias")) {
        fail("key " + key + ": LoRA biases (lora_bias) are not supported");
      }
      if (!ends_with(key, ".lora_A.weight")) continue;
      const std::string module = key.substr(0, key.size() - std::string(".lora_A.weight").size());
      const std::string up_key = module + ".lora_B.weight";
      if (!has(up_key)) fail("has " + key + " without " + up_key);
      const at::Tensor down = tensor(key);
      const at::Tensor up = tensor(up_key);
      const auto m = find_bfl_module(module, false, up.dim() == 2 ? up.size(0) : 0);
      if (!m || m->pattern->kind != BflModuleKind::linear) unrecognised(key, "bfl");
      if (m->diffusers.size() > 1) {
        add_fused(*m, down, up, /*kohya_sparse_check=*/false, key);
      } else if (m->pattern->swap_halves) {
        // diffusers swaps the halves of lora_A's rank rows too (no mathematical reason; mirrored
        // so that outputs equal diffusers').
        add(m->diffusers[0], swap_halves(down), swap_halves(up), 1.0, key);
      } else {
        add(m->diffusers[0], down, up, 1.0, key);
      }
    }
    check_all_used("bfl");
  }

  // ---- PEFT / diffusers (FluxLoraLoaderMixin.lora_state_dict's default path) ----
  void read_peft() {
    const bool prefixed = std::any_of(keys_.begin(), keys_.end(), [](const auto& k) {
      return starts_with(k, "transformer.") || starts_with(k, "text_encoder.");
    });
    std::map<std::string, std::pair<std::string, std::string>> factors;  // module -> (A key, B key)
    std::map<std::string, double> network_alphas;                       // module -> alpha
    for (const auto& key : keys_) {
      if (starts_with(key, "text_encoder")) {
        if (ends_with(key, ".lora_A.weight")) out_.warnings.push_back("dropped text-encoder LoRA " + key + " (transformer only)");
        used_.insert(key);
        continue;
      }
      if (prefixed && !starts_with(key, "transformer.")) unrecognised(key, "peft");
      const std::string k = prefixed ? key.substr(std::string("transformer.").size()) : key;
      if (ends_with(k, ".lora_A.weight")) {
        factors[k.substr(0, k.size() - 14)].first = key;
      } else if (ends_with(k, ".lora_B.weight")) {
        factors[k.substr(0, k.size() - 14)].second = key;
      } else if (ends_with(k, ".lora_B.bias")) {
        fail("key " + key + ": LoRA biases (lora_bias) are not supported");
      } else if (ends_with(k, ".alpha")) {
        const at::Tensor a = tensor(key);
        if (a.numel() != 1) fail("alpha key " + key + " must hold one float");
        network_alphas[k.substr(0, k.size() - 6)] = a.item<double>();
      } else {
        unrecognised(key, "peft");
      }
    }
    const auto& meta = file_.metadata();
    const auto adapter_it = meta.find("lora_adapter_metadata");
    std::optional<nlohmann::json> adapter;
    if (adapter_it != meta.end()) {
      if (!network_alphas.empty()) fail("has both lora_adapter_metadata and .alpha tensors (diffusers refuses both)");
      util::check_json_text(adapter_it->second, 1 << 20, file_.path() + " lora_adapter_metadata");
      try {
        adapter = nlohmann::json::parse(adapter_it->second);
      } catch (const nlohmann::json::exception& e) {
        fail("has malformed lora_adapter_metadata JSON: " + std::string(e.what()));
      }
      if (!adapter->is_object()) fail("lora_adapter_metadata must be a JSON object");
    }
    for (const auto& [module, keys] : factors) {
      if (keys.first.empty() || keys.second.empty()) fail("has only one LoRA factor of module " + module);
      const at::Tensor down = tensor(keys.first);
      const at::Tensor up = tensor(keys.second);
      if (up.dim() != 2) fail("key " + keys.second + " must be 2-D (out, r), has shape " + c10::str(up.sizes()));
      const double rank = static_cast<double>(up.size(1));
      double alpha = rank;
      if (adapter) {
        alpha = adapter_alpha(*adapter, module, rank);
      } else if (network_alphas.count(module)) {
        alpha = network_alphas.at(module);
      }
      add(module, down, up, alpha / rank, keys.first);
    }
    for (const auto& [module, alpha] : network_alphas) {
      if (!factors.count(module)) fail("has an alpha for module " + module + " without its LoRA factors");
    }
    check_all_used("peft");
  }

  // PEFT LoraConfig fields under "transformer.": alpha_pattern (suffix match, PEFT's
  // `.*\.<key>$`), else lora_alpha, else r (scale 1).
  double adapter_alpha(const nlohmann::json& adapter, const std::string& module, double rank) {
    const auto number = [&](const nlohmann::json& v, const std::string& what) {
      if (!v.is_number()) fail("lora_adapter_metadata " + what + " must be a number, is " + v.dump());
      return v.get<double>();
    };
    const auto pattern = adapter.find("transformer.alpha_pattern");
    if (pattern != adapter.end() && pattern->is_object()) {
      for (const auto& [suffix, value] : pattern->items()) {
        if (lora_target_matches(module, suffix)) return number(value, "alpha_pattern." + suffix);
      }
    }
    const auto alpha = adapter.find("transformer.lora_alpha");
    if (alpha != adapter.end()) return number(*alpha, "transformer.lora_alpha");
    return rank;
  }

  void check_all_used(const std::string& format) {
    for (const auto& k : keys_) {
      if (!used_.count(k)) unrecognised(k, format);
    }
  }

  io::SafetensorsFile file_;
  LoraFile out_;
  std::vector<std::string> keys_;
  std::set<std::string> used_;
};

}  // namespace

std::string lora_format_name(LoraFileFormat format) {
  switch (format) {
    case LoraFileFormat::peft: return "peft";
    case LoraFileFormat::kohya: return "kohya";
    case LoraFileFormat::bfl: return "bfl";
    case LoraFileFormat::xlabs: return "xlabs";
  }
  return "unknown";
}

LoraFile read_lora_file(const std::string& path) { return Reader(path).read(); }

}  // namespace remat::models
