// The Flux LoRA formats: kohya (sd-scripts, ComfyUI, lora_transformer_), BFL control and xlabs
// files made from one set of PEFT factors by converters written here give the same merged model
// as the PEFT file and as the live LoRA branch; alpha baking; scale 0; bad files; kohya export.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "models/flux_formats_test_util.h"
#include "models/model_test_util.h"
#include "remat/io/safetensors.h"
#include "remat/memory.h"
#include "remat/models/layers.h"
#include "remat/models/lora.h"
#include "remat/models/lora_formats.h"
#include "temp_dir.h"
#include "value_error.h"

namespace remat::models {
namespace {
namespace lora_formats_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using test::close;
using test::diffusers_state;
using test::forward_once;
using test::random_flux;

constexpr int64_t kRank = 4;
constexpr double kAlpha = 2.0;  // scale alpha / r = 0.5

struct Factors {
  at::Tensor A, B;  // (r, in), (out, r)
};

// Random factors for every Linear of `config`. With shared_fused_down, the parts of each fused BFL
// layer (q, k, v [, mlp]) share one A, as the xlabs / BFL control / shared-down kohya forms need.
std::map<std::string, Factors> random_factors(const FluxConfig& config, bool shared_fused_down, uint64_t seed) {
  torch::manual_seed(seed);
  std::map<std::string, Factors> out;
  for (const auto& l : linear_layers(config)) {
    out[l.name] = {torch::randn({kRank, l.in_features}) * 0.2, torch::randn({l.out_features, kRank}) * 0.2};
  }
  if (shared_fused_down) {
    for (int64_t i = 0; i < config.num_layers; ++i) {
      const std::string t = "transformer_blocks." + std::to_string(i) + ".attn.";
      for (const std::string s : {"to_k", "to_v"}) out[t + s].A = out[t + "to_q"].A;
      for (const std::string s : {"add_k_proj", "add_v_proj"}) out[t + s].A = out[t + "add_q_proj"].A;
    }
    for (int64_t i = 0; i < config.num_single_layers; ++i) {
      const std::string t = "single_transformer_blocks." + std::to_string(i) + ".";
      for (const std::string s : {"attn.to_k", "attn.to_v", "proj_mlp"}) out[t + s].A = out[t + "attn.to_q"].A;
    }
  }
  return out;
}

std::map<std::string, Factors> only(const std::map<std::string, Factors>& all, const std::set<std::string>& names) {
  std::map<std::string, Factors> out;
  for (const auto& n : names) out[n] = all.at(n);
  return out;
}

// What remat's trainer writes: PEFT keys plus diffusers' lora_adapter_metadata.
void write_peft(const std::string& path, const std::map<std::string, Factors>& f, double alpha) {
  std::vector<io::NamedTensor> e;
  for (const auto& [m, x] : f) {
    e.emplace_back("transformer." + m + ".lora_A.weight", x.A);
    e.emplace_back("transformer." + m + ".lora_B.weight", x.B);
  }
  const nlohmann::json adapter{{"transformer.r", kRank}, {"transformer.lora_alpha", alpha}};
  io::save_safetensors(path, e, {{"format", "pt"}, {"lora_adapter_metadata", adapter.dump()}});
}

// ---- converters written for the test from diffusers' lora_conversion_utils, read backwards ----

// BFL module name of each fused group and its parts, for a config.
struct Fused {
  std::string bfl;
  std::vector<std::string> parts;
};
std::vector<Fused> fused_groups(const FluxConfig& c) {
  std::vector<Fused> out;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string b = "double_blocks." + std::to_string(i) + ".", t = "transformer_blocks." + std::to_string(i) + ".attn.";
    out.push_back({b + "img_attn.qkv", {t + "to_q", t + "to_k", t + "to_v"}});
    out.push_back({b + "txt_attn.qkv", {t + "add_q_proj", t + "add_k_proj", t + "add_v_proj"}});
  }
  for (int64_t i = 0; i < c.num_single_layers; ++i) {
    const std::string b = "single_blocks." + std::to_string(i) + ".", t = "single_transformer_blocks." + std::to_string(i) + ".";
    out.push_back({b + "linear1", {t + "attn.to_q", t + "attn.to_k", t + "attn.to_v", t + "proj_mlp"}});
  }
  return out;
}
// The one-to-one Linear rows (diffusers -> BFL), from diffusers'
// convert_flux_transformer_checkpoint_to_diffusers.
std::vector<std::pair<std::string, std::string>> plain_layers(const FluxConfig& c) {
  std::vector<std::pair<std::string, std::string>> out = {
      {"x_embedder", "img_in"}, {"context_embedder", "txt_in"},
      {"time_text_embed.timestep_embedder.linear_1", "time_in.in_layer"},
      {"time_text_embed.timestep_embedder.linear_2", "time_in.out_layer"},
      {"time_text_embed.text_embedder.linear_1", "vector_in.in_layer"},
      {"time_text_embed.text_embedder.linear_2", "vector_in.out_layer"},
      {"time_text_embed.guidance_embedder.linear_1", "guidance_in.in_layer"},
      {"time_text_embed.guidance_embedder.linear_2", "guidance_in.out_layer"}};
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string b = "double_blocks." + std::to_string(i) + ".", t = "transformer_blocks." + std::to_string(i) + ".";
    for (const auto& [d, f] : std::vector<std::pair<std::string, std::string>>{
             {"norm1.linear", "img_mod.lin"}, {"norm1_context.linear", "txt_mod.lin"}, {"attn.to_out.0", "img_attn.proj"},
             {"attn.to_add_out", "txt_attn.proj"}, {"ff.net.0.proj", "img_mlp.0"}, {"ff.net.2", "img_mlp.2"},
             {"ff_context.net.0.proj", "txt_mlp.0"}, {"ff_context.net.2", "txt_mlp.2"}}) {
      out.emplace_back(t + d, b + f);
    }
  }
  for (int64_t i = 0; i < c.num_single_layers; ++i) {
    const std::string b = "single_blocks." + std::to_string(i) + ".", t = "single_transformer_blocks." + std::to_string(i) + ".";
    out.emplace_back(t + "proj_out", b + "linear2");
    out.emplace_back(t + "norm.linear", b + "modulation.lin");
  }
  return out;
}
at::Tensor swap_rows(const at::Tensor& t) {
  const auto h = t.chunk(2, 0);
  return torch::cat({h[1], h[0]}, 0);
}
std::string underscored(std::string s) {
  std::replace(s.begin(), s.end(), '.', '_');
  return s;
}

enum class KohyaFused { block_diagonal, shared_down };

// kohya sd-scripts: lora_unet_<BFL name with _>; fused layers either block-diagonal (rank n r,
// alpha n alpha) or with the shared down (rank r, up stacked). `comfy` writes ComfyUI's
// "diffusion_model.<dotted BFL name>" spelling instead. The final layer is read by diffusers
// without alpha and with lora_up's halves swapped, so its alpha is baked into lora_up and a
// deliberately wrong alpha written (it must be ignored).
void write_kohya(const std::string& path, const std::map<std::string, Factors>& f, const FluxConfig& c, KohyaFused fused,
                 bool comfy = false, double kohya_alpha = kAlpha) {
  std::vector<io::NamedTensor> e;
  const auto name = [&](const std::string& bfl) { return comfy ? "diffusion_model." + bfl : "lora_unet_" + underscored(bfl); };
  const auto put = [&](const std::string& bfl, const at::Tensor& down, const at::Tensor& up, double alpha) {
    e.emplace_back(name(bfl) + ".lora_down.weight", down);
    e.emplace_back(name(bfl) + ".lora_up.weight", up);
    e.emplace_back(name(bfl) + ".alpha", torch::tensor(alpha));
  };
  // kohya_alpha / rank must equal kAlpha / kRank: the factors carry the rest.
  const double rescale = (kAlpha / kRank) / (kohya_alpha / kRank);
  for (const auto& [d, b] : plain_layers(c)) {
    if (f.count(d)) put(b, f.at(d).A, f.at(d).B * rescale, kohya_alpha);
  }
  for (const auto& g : fused_groups(c)) {
    if (!f.count(g.parts[0])) continue;
    const int64_t n = static_cast<int64_t>(g.parts.size());
    std::vector<at::Tensor> downs, ups;
    if (fused == KohyaFused::block_diagonal) {
      for (int64_t j = 0; j < n; ++j) {
        const auto& x = f.at(g.parts[j]);
        downs.push_back(x.A);
        at::Tensor rows = torch::zeros({x.B.size(0), n * kRank});
        rows.narrow(1, j * kRank, kRank).copy_(x.B);
        ups.push_back(rows);
      }
      put(g.bfl, torch::cat(downs, 0), torch::cat(ups, 0) * rescale, n * kohya_alpha);
    } else {
      for (const auto& p : g.parts) ups.push_back(f.at(p).B);
      put(g.bfl, f.at(g.parts[0]).A, torch::cat(ups, 0) * rescale, kohya_alpha);
    }
  }
  const double s = kAlpha / kRank;
  if (f.count("proj_out")) put("final_layer.linear", f.at("proj_out").A, f.at("proj_out").B * s, 77.0);
  if (f.count("norm_out.linear")) {
    put("final_layer.adaLN_modulation.1", f.at("norm_out.linear").A, swap_rows(f.at("norm_out.linear").B) * s, 77.0);
  }
  io::save_safetensors(path, e);
}

// kohya's other spelling: lora_transformer_<diffusers name with _>, alpha required.
void write_kohya_mixture(const std::string& path, const std::map<std::string, Factors>& f) {
  std::vector<io::NamedTensor> e;
  for (const auto& [m, x] : f) {
    const std::string n = "lora_transformer_" + underscored(m);
    e.emplace_back(n + ".lora_down.weight", x.A);
    e.emplace_back(n + ".lora_up.weight", x.B);
    e.emplace_back(n + ".alpha", torch::tensor(kAlpha));
  }
  io::save_safetensors(path, e);
}

// BFL control LoRA: BFL names with lora_A / lora_B, no alpha (baked into lora_B), fused layers
// with the shared lora_A, the final modulation's halves swapped in lora_B and (a diffusers quirk,
// mirrored) in lora_A, and the query/key norm scales that make the format recognisable.
void write_bfl_control(const std::string& path, const std::map<std::string, Factors>& f, const FluxConfig& c,
                       const std::map<std::string, at::Tensor>& norm_scales) {
  std::vector<io::NamedTensor> e;
  const double s = kAlpha / kRank;
  const auto put = [&](const std::string& bfl, const at::Tensor& A, const at::Tensor& B) {
    e.emplace_back(bfl + ".lora_A.weight", A);
    e.emplace_back(bfl + ".lora_B.weight", B * s);
  };
  for (const auto& [d, b] : plain_layers(c)) {
    if (f.count(d)) put(b, f.at(d).A, f.at(d).B);
  }
  for (const auto& g : fused_groups(c)) {
    std::vector<at::Tensor> ups;
    for (const auto& p : g.parts) ups.push_back(f.at(p).B);
    put(g.bfl, f.at(g.parts[0]).A, torch::cat(ups, 0));
  }
  put("final_layer.linear", f.at("proj_out").A, f.at("proj_out").B);
  put("final_layer.adaLN_modulation.1", swap_rows(f.at("norm_out.linear").A), swap_rows(f.at("norm_out.linear").B));
  for (const auto& [k, t] : norm_scales) e.emplace_back(k, t);
  io::save_safetensors(path, e);
}

// xlabs: processor LoRAs on the attention layers only, down shared by q, k, v, no alpha.
void write_xlabs(const std::string& path, const std::map<std::string, Factors>& f, const FluxConfig& c) {
  std::vector<io::NamedTensor> e;
  const double s = kAlpha / kRank;
  const auto put = [&](const std::string& key, const at::Tensor& down, const at::Tensor& up) {
    e.emplace_back(key + ".down.weight", down);
    e.emplace_back(key + ".up.weight", up * s);
  };
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "double_blocks." + std::to_string(i) + ".processor.", t = "transformer_blocks." + std::to_string(i) + ".attn.";
    put(p + "qkv_lora1", f.at(t + "to_q").A, torch::cat({f.at(t + "to_q").B, f.at(t + "to_k").B, f.at(t + "to_v").B}));
    put(p + "qkv_lora2", f.at(t + "add_q_proj").A,
        torch::cat({f.at(t + "add_q_proj").B, f.at(t + "add_k_proj").B, f.at(t + "add_v_proj").B}));
    put(p + "proj_lora1", f.at(t + "to_out.0").A, f.at(t + "to_out.0").B);
    put(p + "proj_lora2", f.at(t + "to_add_out").A, f.at(t + "to_add_out").B);
  }
  for (int64_t i = 0; i < c.num_single_layers; ++i) {
    const std::string p = "single_blocks." + std::to_string(i) + ".processor.", t = "single_transformer_blocks." + std::to_string(i) + ".";
    put(p + "qkv_lora", f.at(t + "attn.to_q").A,
        torch::cat({f.at(t + "attn.to_q").B, f.at(t + "attn.to_k").B, f.at(t + "attn.to_v").B}));
    put(p + "proj_lora", f.at(t + "proj_out").A, f.at(t + "proj_out").B);
  }
  io::save_safetensors(path, e);
}
std::set<std::string> xlabs_modules(const FluxConfig& c) {
  std::set<std::string> out;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    for (const std::string s : {"to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0", "to_add_out"}) {
      out.insert("transformer_blocks." + std::to_string(i) + ".attn." + s);
    }
  }
  for (int64_t i = 0; i < c.num_single_layers; ++i) {
    for (const std::string s : {"attn.to_q", "attn.to_k", "attn.to_v", "proj_out"}) {
      out.insert("single_transformer_blocks." + std::to_string(i) + "." + s);
    }
  }
  return out;
}

// ---- the independent expectation: W + (alpha / r) B A in float64 ----
std::map<std::string, at::Tensor> expected_weights(const FluxImpl& base, const std::map<std::string, Factors>& f,
                                                   double user_scale) {
  auto w = diffusers_state(base);
  for (const auto& [m, x] : f) {
    auto& t = w.at(m + ".weight");
    t = (t.to(at::kDouble) + user_scale * (kAlpha / kRank) * x.B.to(at::kDouble).matmul(x.A.to(at::kDouble))).to(at::kFloat);
  }
  return w;
}

class LoraFormatsTest : public ::testing::Test {
 protected:
  FluxConfig tiny = FluxConfig::preset("flux-tiny");
  remat::testing::TempDir dir{"lora_formats"};
  Flux base = random_flux(tiny, 21);

  Flux merged(const std::string& path, double user_scale = 1.0) {
    Flux m = random_flux(tiny, 21);
    merge_lora(*m, read_lora_file(path), user_scale);
    return m;
  }
  void expect_weights(const FluxImpl& got, const std::map<std::string, at::Tensor>& want, const std::string& label) {
    const auto g = diffusers_state(got);
    int changed = 0;
    for (const auto& [k, t] : want) {
      EXPECT_TRUE(close(g.at(k), t, 1e-5, 1e-6)) << label << ": " << k;
      changed += !torch::equal(t, diffusers_state(*base).at(k));
    }
    EXPECT_GT(changed, 0) << label << ": nothing changed";
  }
};

TEST_F(LoraFormatsTest, EveryFormatMergesToTheSameModel) {
  const auto shared = random_factors(tiny, /*shared_fused_down=*/true, 1);
  const auto independent = random_factors(tiny, /*shared_fused_down=*/false, 2);
  const std::string peft_shared = dir / "peft_shared.safetensors", peft_independent = dir / "peft_independent.safetensors";
  write_peft(peft_shared, shared, kAlpha);
  write_peft(peft_independent, independent, kAlpha);
  write_kohya(dir / "kohya_blockdiag.safetensors", independent, tiny, KohyaFused::block_diagonal);
  write_kohya(dir / "kohya_shared.safetensors", shared, tiny, KohyaFused::shared_down, false, /*kohya_alpha=*/1.0);
  write_kohya(dir / "comfy.safetensors", independent, tiny, KohyaFused::block_diagonal, /*comfy=*/true);
  write_kohya_mixture(dir / "mixture.safetensors", independent);
  std::map<std::string, at::Tensor> norms;  // BFL control norms: the model's own values + 1
  const auto base_state = diffusers_state(*base);
  norms["double_blocks.0.img_attn.norm.query_norm.scale"] = base_state.at("transformer_blocks.0.attn.norm_q.weight") + 1;
  norms["single_blocks.1.norm.key_norm.scale"] = base_state.at("single_transformer_blocks.1.attn.norm_k.weight") + 1;
  write_bfl_control(dir / "bfl.safetensors", shared, tiny, norms);
  const auto xl = only(shared, xlabs_modules(tiny));
  write_xlabs(dir / "xlabs.safetensors", shared, tiny);
  write_peft(dir / "peft_xlabs_modules.safetensors", xl, kAlpha);

  struct Case {
    std::string file, reference_peft;
    LoraFileFormat format;
    const std::map<std::string, Factors>* factors;
  };
  const std::vector<Case> cases = {
      {"kohya_blockdiag.safetensors", peft_independent, LoraFileFormat::kohya, &independent},
      {"kohya_shared.safetensors", peft_shared, LoraFileFormat::kohya, &shared},
      {"comfy.safetensors", peft_independent, LoraFileFormat::kohya, &independent},
      {"mixture.safetensors", peft_independent, LoraFileFormat::kohya, &independent},
      {"bfl.safetensors", peft_shared, LoraFileFormat::bfl, &shared},
      {"xlabs.safetensors", dir / "peft_xlabs_modules.safetensors", LoraFileFormat::xlabs, &xl},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.file);
    const LoraFile file = read_lora_file(dir / c.file);
    EXPECT_EQ(file.format, c.format);
    EXPECT_EQ(file.modules.size(), c.factors->size());
    if (c.file == "kohya_blockdiag.safetensors") {
      // Block-diagonal fused adapters come back at their own rank (diffusers' sparse split).
      EXPECT_EQ(file.modules.at("transformer_blocks.0.attn.to_k").down.size(0), kRank);
      EXPECT_EQ(file.modules.at("single_transformer_blocks.1.proj_mlp").down.size(0), kRank);
    }
    if (c.file == "kohya_shared.safetensors") {
      EXPECT_EQ(file.modules.at("single_transformer_blocks.1.proj_mlp").down.size(0), kRank);
      EXPECT_TRUE(torch::equal(file.modules.at("transformer_blocks.0.attn.to_k").down,
                               file.modules.at("transformer_blocks.0.attn.to_q").down));
    }
    Flux got = merged(dir / c.file);
    auto want = expected_weights(*base, *c.factors, 1.0);
    if (c.format == LoraFileFormat::bfl) {
      want["transformer_blocks.0.attn.norm_q.weight"] = norms.at("double_blocks.0.img_attn.norm.query_norm.scale");
      want["single_transformer_blocks.1.attn.norm_k.weight"] = norms.at("single_blocks.1.norm.key_norm.scale");
    }
    expect_weights(*got, want, c.file);
    Flux via_peft = merged(c.reference_peft);
    if (c.format != LoraFileFormat::bfl) {  // the BFL file also replaces norms
      EXPECT_TRUE(close(forward_once(*got), forward_once(*via_peft), 1e-5, 1e-6)) << "vs the PEFT file";
    }
  }
  EXPECT_EQ(read_lora_file(peft_shared).format, LoraFileFormat::peft);
}

TEST_F(LoraFormatsTest, MergedEqualsTheLiveLoraBranch) {
  const auto f = random_factors(tiny, false, 3);
  const std::string path = dir / "peft.safetensors";
  write_peft(path, f, kAlpha);
  Flux got = merged(path);
  // The same factors in apply_lora's live branch: y = W x + (alpha / r) B (A x).
  Flux live = random_flux(tiny, 21);
  std::vector<std::string> names;
  for (const auto& [m, x] : f) names.push_back(m);
  apply_lora(*live, names, kRank, kAlpha);
  {
    torch::NoGradGuard no_grad;
    for (const auto& item : live->named_modules("", false)) {
      if (auto* l = dynamic_cast<LinearImpl*>(item.value().get()); l && f.count(item.key())) {
        l->lora_A->weight.copy_(f.at(item.key()).A);
        l->lora_B->weight.copy_(f.at(item.key()).B);
      }
    }
  }
  const at::Tensor a = forward_once(*got), b = forward_once(*live);
  EXPECT_FALSE(torch::equal(a, forward_once(*base)));
  EXPECT_TRUE(close(a, b, 1e-4, 1e-5)) << "merged vs live LoRA branch (float32 summation order differs)";
}

// Merging holds one (out, in) float32 matrix at a time, the delta of the module being merged, and
// sums it into a float32 weight in place (the tracking allocator's peak against that formula).
TEST_F(LoraFormatsTest, MergingHoldsOneDeltaMatrixAtATime) {
  const auto f = random_factors(tiny, false, 5);
  const std::string path = dir / "peft.safetensors";
  write_peft(path, f, kAlpha);
  const LoraFile lora = read_lora_file(path);
  int64_t largest_delta = 0;
  for (const auto& l : linear_layers(tiny)) largest_delta = std::max(largest_delta, l.out_features * l.in_features * 4);
  Flux model = random_flux(tiny, 21);
  memory::PeakScope scope;
  merge_lora(*model, lora, 1.0);
  // Plus a few bytes of LibTorch's scalar wrapping (12 here); two such matrices would be 2x.
  EXPECT_GE(scope.peak_delta(), largest_delta);
  EXPECT_LE(scope.peak_delta(), largest_delta + 1024);
  // In place, the sum is still W + (alpha / r) (B A) rounded once.
  const auto got = diffusers_state(*model), before = diffusers_state(*base);
  for (const auto& [name, factors] : f) {
    const at::Tensor want = before.at(name + ".weight") + at::matmul(factors.B, factors.A) * (kAlpha / kRank);
    EXPECT_TRUE(torch::equal(got.at(name + ".weight"), want)) << name;
  }
}

TEST_F(LoraFormatsTest, KohyaAlphaIsBakedAsDiffusersDoes) {
  // rank 4, alpha 1: scale 0.25 -> down x 0.5, up x 0.5; alpha 8: scale 2 -> down x 2, up x 1.
  for (const auto& [alpha, s_down, s_up] : std::vector<std::tuple<double, double, double>>{{1.0, 0.5, 0.5}, {8.0, 2.0, 1.0}}) {
    torch::manual_seed(4);
    const auto down = torch::randn({4, 64}), up = torch::randn({64, 4});
    io::save_safetensors(dir / "alpha.safetensors", {{"lora_unet_double_blocks_0_img_attn_proj.lora_down.weight", down},
                                                     {"lora_unet_double_blocks_0_img_attn_proj.lora_up.weight", up},
                                                     {"lora_unet_double_blocks_0_img_attn_proj.alpha", torch::tensor(alpha)}});
    const auto file = read_lora_file(dir / "alpha.safetensors");
    const auto& m = file.modules.at("transformer_blocks.0.attn.to_out.0");
    EXPECT_TRUE(torch::equal(m.down, down * s_down)) << alpha;
    EXPECT_TRUE(torch::equal(m.up, up * s_up)) << alpha;
    EXPECT_EQ(m.scale, 1.0);
  }
}

// A negative alpha (found by fuzz_lora: diffusers' balancing loop never ends for one) gives the
// delta alpha / r * up @ down like any other; a non-finite alpha is refused naming its key.
TEST_F(LoraFormatsTest, KohyaNegativeAlphaBakesItsDeltaAndInfiniteAlphaIsRefused) {
  torch::manual_seed(4);
  const auto down = torch::randn({4, 64}), up = torch::randn({64, 4});
  const auto write = [&](double alpha) {
    io::save_safetensors(dir / "alpha.safetensors", {{"lora_unet_double_blocks_0_img_attn_proj.lora_down.weight", down},
                                                     {"lora_unet_double_blocks_0_img_attn_proj.lora_up.weight", up},
                                                     {"lora_unet_double_blocks_0_img_attn_proj.alpha", torch::tensor(alpha)}});
  };
  write(-3.0);
  const auto file = read_lora_file(dir / "alpha.safetensors");
  const auto& m = file.modules.at("transformer_blocks.0.attn.to_out.0");
  const at::Tensor want = (-3.0 / 4.0) * torch::matmul(up.to(torch::kDouble), down.to(torch::kDouble));
  const at::Tensor got = m.scale * torch::matmul(m.up.to(torch::kDouble), m.down.to(torch::kDouble));
  EXPECT_TRUE(torch::allclose(got, want, 1e-6, 1e-6));
  write(-std::numeric_limits<double>::infinity());
  const std::string message = remat::testing::error_of([&] { read_lora_file(dir / "alpha.safetensors"); });
  EXPECT_NE(message.find("lora_unet_double_blocks_0_img_attn_proj.alpha"), std::string::npos) << message;
  EXPECT_NE(message.find("holds 1 non-finite value(s) (NaN or inf)"), std::string::npos) << message;
}

TEST_F(LoraFormatsTest, ScaleZeroIsTheBaseModelBitForBit) {
  const std::string path = dir / "peft.safetensors";
  write_peft(path, random_factors(tiny, false, 5), kAlpha);
  Flux got = merged(path, 0.0);
  const auto g = diffusers_state(*got), b = diffusers_state(*base);
  for (const auto& [k, t] : b) EXPECT_TRUE(torch::equal(g.at(k), t)) << k;
  // And a scale is honoured: 0.5 merges half the delta.
  expect_weights(*merged(path, 0.5), expected_weights(*base, random_factors(tiny, false, 5), 0.5), "scale 0.5");
}

TEST_F(LoraFormatsTest, ForeignAndUnknownFilesAreRefusedClearly) {
  const std::string small_lora = dir / "small.safetensors";
  write_peft(small_lora, random_factors(FluxConfig::preset("flux-small"), false, 6), kAlpha);
  Flux target = random_flux(tiny, 21);
  const std::string shape_error = remat::testing::error_of([&] { merge_lora(*target, read_lora_file(small_lora), 1.0); });
  EXPECT_NE(shape_error.find("another model"), std::string::npos) << shape_error;
  EXPECT_NE(shape_error.find("small.safetensors"), std::string::npos) << shape_error;
  const auto t = diffusers_state(*target), b = diffusers_state(*base);
  for (const auto& [k, v] : b) EXPECT_TRUE(torch::equal(t.at(k), v)) << k << " changed by a refused merge";

  io::save_safetensors(dir / "unknown.safetensors", {{"transformer.blocks.0.foo", torch::zeros({2})}});
  const std::string unknown = remat::testing::error_of([&] { read_lora_file(dir / "unknown.safetensors"); });
  EXPECT_NE(unknown.find("'transformer.blocks.0.foo'"), std::string::npos) << unknown;
  io::save_safetensors(dir / "kohya_bad.safetensors", {{"lora_unet_double_blocks_0_img_attn_qkvx.lora_down.weight", torch::zeros({2, 2})},
                                                       {"lora_unet_double_blocks_0_img_attn_qkvx.lora_up.weight", torch::zeros({2, 2})}});
  const std::string kohya = remat::testing::error_of([&] { read_lora_file(dir / "kohya_bad.safetensors"); });
  EXPECT_NE(kohya.find("lora_unet_double_blocks_0_img_attn_qkvx"), std::string::npos) << kohya;
}

TEST_F(LoraFormatsTest, KohyaExportReadsBackToTheSameDeltas) {
  // A default-preset-like LoRA: q, k, v of every block but no proj_mlp (its linear1 part is
  // exported as zeros), plus the final layer (alpha baked, halves swapped) and a plain layer.
  auto f = random_factors(tiny, false, 7);
  std::map<std::string, at::Tensor> peft;
  for (const auto& [m, x] : f) {
    if (m.find("proj_mlp") != std::string::npos) continue;
    peft["transformer." + m + ".lora_A.weight"] = x.A;
    peft["transformer." + m + ".lora_B.weight"] = x.B;
  }
  const std::string path = dir / "exported.safetensors";
  save_lora_kohya(path, peft, kAlpha);
  const auto file = read_lora_file(path);
  EXPECT_EQ(file.format, LoraFileFormat::kohya);
  for (const auto& [m, x] : f) {
    SCOPED_TRACE(m);
    ASSERT_TRUE(file.modules.count(m));
    const auto& got = file.modules.at(m);
    const at::Tensor delta = got.up.matmul(got.down) * got.scale;
    const at::Tensor want = m.find("proj_mlp") != std::string::npos ? torch::zeros_like(delta)
                                                                     : x.B.matmul(x.A) * (kAlpha / kRank);
    EXPECT_TRUE(close(delta, want, 1e-5, 1e-6));
  }
  EXPECT_EQ(file.modules.size(), f.size());
}

}  // namespace lora_formats_test
}  // namespace
}  // namespace remat::models
