// Black Forest Labs' single-file Flux layout: the same random model saved in diffusers' and BFL's
// layout (the BFL file made by the converter in flux_formats_test_util.h) loads identically,
// strictly, streaming, and from wherever a transformer is loaded.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "models/flux_formats_test_util.h"
#include "remat/models/flux_transformer_weights.h"
#include "remat/io/safetensors.h"
#include "remat/memory.h"
#include "remat/models/flux_weight_formats.h"
#include "remat/train/family/transformer.h"
#include "temp_dir.h"
#include "value_error.h"
#include "test_paths.h"

namespace remat::models {
namespace {
namespace flux_weight_formats_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

using test::diffusers_state;
using test::forward_once;
using test::random_flux;
using test::test_diffusers_to_bfl;

void expect_same_parameters(const FluxImpl& got, const FluxImpl& want) {
  const auto g = diffusers_state(got), w = diffusers_state(want);
  ASSERT_EQ(g.size(), w.size());
  for (const auto& [name, t] : w) {
    ASSERT_TRUE(g.count(name)) << name;
    EXPECT_TRUE(torch::equal(g.at(name), t)) << name;
  }
}

class FluxWeightFormatsTest : public ::testing::Test {
 protected:
  FluxConfig tiny = FluxConfig::preset("flux-tiny");
  remat::testing::TempDir dir{"flux_formats"};

  std::string write_bfl(const FluxImpl& model, const std::string& name, const std::string& prefix = "") {
    const std::string path = dir / name;
    io::save_safetensors(path, test_diffusers_to_bfl(diffusers_state(model), model.config(), prefix));
    return path;
  }
};

TEST_F(FluxWeightFormatsTest, BflAndDiffusersFilesLoadToIdenticalModels) {
  for (const bool guidance : {true, false}) {
    FluxConfig config = tiny;
    config.guidance_embeds = guidance;  // schnell-style: no guidance_in
    Flux source = random_flux(config, 1);
    const std::string diffusers_path = dir / "diffusers.safetensors";
    io::save_module(diffusers_path, *source);
    const std::string bfl_path = write_bfl(*source, "bfl.safetensors");
    const std::string prefixed_path = write_bfl(*source, "bfl_prefixed.safetensors", "model.diffusion_model.");
    EXPECT_TRUE(is_bfl_flux_file(bfl_path));
    EXPECT_TRUE(is_bfl_flux_file(prefixed_path));
    EXPECT_FALSE(is_bfl_flux_file(diffusers_path));

    Flux from_diffusers = random_flux(config, 2), from_bfl = random_flux(config, 3), from_prefixed = random_flux(config, 4);
    load_flux_weights(*from_diffusers, diffusers_path);
    load_flux_weights(*from_bfl, bfl_path);
    load_flux_weights(*from_prefixed, prefixed_path);
    expect_same_parameters(*from_bfl, *source);
    expect_same_parameters(*from_prefixed, *source);
    expect_same_parameters(*from_diffusers, *source);
    const at::Tensor want = forward_once(*source);
    EXPECT_TRUE(torch::equal(forward_once(*from_bfl), want)) << "guidance " << guidance;
    EXPECT_TRUE(torch::equal(forward_once(*from_diffusers), want));
  }
}

TEST_F(FluxWeightFormatsTest, WriterMatchesTheTestConverterAndRoundTrips) {
  Flux source = random_flux(tiny, 5);
  const std::string written = dir / "written.safetensors";
  save_flux_bfl(written, *source);
  const auto file = io::SafetensorsFile::open(written);
  const auto reference = test_diffusers_to_bfl(diffusers_state(*source), tiny);
  ASSERT_EQ(file.names().size(), reference.size());
  for (const auto& [key, tensor] : reference) {
    ASSERT_TRUE(file.contains(key)) << key;
    EXPECT_TRUE(torch::equal(file.tensor(key), tensor)) << key;
  }
  Flux back = random_flux(tiny, 6);
  load_flux_weights(*back, written);
  expect_same_parameters(*back, *source);
}

TEST_F(FluxWeightFormatsTest, InfersTheConfigFromBflShapes) {
  for (const std::string preset : {"flux-tiny", "flux-small"}) {
    FluxConfig want = FluxConfig::preset(preset);
    Flux source = random_flux(want, 7);
    const auto got = flux_config_from_bfl(io::SafetensorsFile::open(write_bfl(*source, preset + ".safetensors")));
    EXPECT_EQ(got.num_layers, want.num_layers) << preset;
    EXPECT_EQ(got.num_single_layers, want.num_single_layers) << preset;
    EXPECT_EQ(got.hidden_size(), want.hidden_size()) << preset;
    EXPECT_EQ(got.attention_head_dim, want.attention_head_dim) << preset;
    EXPECT_EQ(got.in_channels, want.in_channels) << preset;
    EXPECT_EQ(got.output_channels(), want.output_channels()) << preset;
    EXPECT_EQ(got.joint_attention_dim, want.joint_attention_dim) << preset;
    EXPECT_EQ(got.pooled_projection_dim, want.pooled_projection_dim) << preset;
    EXPECT_EQ(got.guidance_embeds, want.guidance_embeds) << preset;
    EXPECT_EQ(got.axes_dims_rope, want.axes_dims_rope) << preset;
  }
}

TEST_F(FluxWeightFormatsTest, TableForFluxDevHasThePublishedKeyCount) {
  // flux-dev has 1160 diffusers keys (state_dict_key_count); BFL fuses q,k,v (2 x 2 Linear
  // fusions per double block, 1 per single block), so the BFL file has 780 tensors:
  // 1160 - 19 * 2 * 2 * 2 (qkv weight+bias -> one) - 38 * 3 * 2 (linear1 from four Linear).
  const FluxConfig dev = FluxConfig::preset("flux-dev");
  size_t diffusers_keys = 0;
  for (const auto& t : flux_bfl_tensors(dev)) diffusers_keys += t.diffusers_keys.size();
  EXPECT_EQ(static_cast<int64_t>(diffusers_keys), state_dict_key_count(dev));
  EXPECT_EQ(flux_bfl_tensors(dev).size(), 1160u - 19 * 2 * 2 * 2 - 38 * 3 * 2);
}

TEST_F(FluxWeightFormatsTest, MissingLeftoverAndMisshapedKeysAreRefusedBeforeAnyCopy) {
  Flux source = random_flux(tiny, 8);
  const auto entries = test_diffusers_to_bfl(diffusers_state(*source), tiny);
  const auto write_with = [&](const std::string& name, const std::function<void(std::vector<io::NamedTensor>&)>& edit) {
    auto e = entries;
    edit(e);
    io::save_safetensors(dir / name, e);
    return dir / name;
  };
  const std::string missing = write_with("missing.safetensors", [](auto& e) {
    e.erase(std::remove_if(e.begin(), e.end(), [](const auto& kv) { return kv.first == "single_blocks.1.linear1.bias"; }),
            e.end());
  });
  const std::string leftover = write_with("leftover.safetensors", [](auto& e) {
    e.emplace_back("double_blocks.7.img_attn.qkv.weight", torch::zeros({3, 3}));
  });
  const std::string misshaped = write_with("misshaped.safetensors", [](auto& e) {
    for (auto& kv : e) {
      if (kv.first == "double_blocks.0.txt_attn.qkv.weight") kv.second = kv.second.narrow(0, 0, kv.second.size(0) - 3);
    }
  });
  Flux target = random_flux(tiny, 9);
  const auto before = diffusers_state(*target);
  EXPECT_NE(remat::testing::error_of([&] { load_flux_weights(*target, missing); }).find("single_blocks.1.linear1.bias"),
            std::string::npos);
  EXPECT_NE(remat::testing::error_of([&] { load_flux_weights(*target, leftover); })
                .find("double_blocks.7.img_attn.qkv.weight"),
            std::string::npos);
  const std::string shape_error = remat::testing::error_of([&] { load_flux_weights(*target, misshaped); });
  EXPECT_NE(shape_error.find("double_blocks.0.txt_attn.qkv.weight"), std::string::npos) << shape_error;
  EXPECT_NE(shape_error.find("[189, 64]"), std::string::npos) << shape_error;
  EXPECT_NE(shape_error.find("[192, 64]"), std::string::npos) << shape_error;
  // A file for another model shape (flux-small) into flux-tiny.
  Flux small = random_flux(FluxConfig::preset("flux-small"), 10);
  const std::string small_path = write_bfl(*small, "small.safetensors");
  EXPECT_NE(remat::testing::error_of([&] { load_flux_weights(*target, small_path); }).find("another model shape"),
            std::string::npos);
  const auto after = diffusers_state(*target);
  for (const auto& [name, t] : before) EXPECT_TRUE(torch::equal(after.at(name), t)) << name << " changed";
}

TEST_F(FluxWeightFormatsTest, StreamingLoadHoldsNoSecondCopy) {
  // flux-small: the BFL load must not materialise the converted state dict. Measured with the
  // tracking allocator from before the model is built: model bytes + one tensor + slack.
  const FluxConfig small = FluxConfig::preset("flux-small");
  const std::string path = [&] {
    Flux source = random_flux(small, 11);
    return write_bfl(*source, "small_stream.safetensors");
  }();
  const auto file = io::SafetensorsFile::open(path);
  int64_t largest = 0;
  for (const auto& k : file.names()) largest = std::max<int64_t>(largest, file.info(k).nbytes());
  const int64_t model_bytes = static_cast<int64_t>(file.data_size());
  memory::PeakScope scope;
  Flux target(small);
  load_flux_weights(*target, path);
  const int64_t peak = scope.peak_delta();
  std::cout << "[ measure  ] flux-small BFL streaming load: peak " << memory::format_bytes(peak) << ", model "
            << memory::format_bytes(model_bytes) << ", largest tensor " << memory::format_bytes(largest) << "\n";
  EXPECT_GE(peak, model_bytes);  // the tracking allocator sees the parameters (the check can fail)
  EXPECT_LE(peak, model_bytes + largest + 64 * 1024);
}

TEST_F(FluxWeightFormatsTest, Bfloat16FileLoadsIntoFloat32ModelWithoutTemporaries) {
  // Published BFL files are bfloat16: each slice is converted while it is copied.
  const FluxConfig small = FluxConfig::preset("flux-small");
  Flux source = random_flux(small, 14);
  auto entries = test_diffusers_to_bfl(diffusers_state(*source), small);
  for (auto& kv : entries) kv.second = kv.second.to(at::kBFloat16);
  const std::string path = dir / "small_bf16.safetensors";
  io::save_safetensors(path, entries);
  Flux target(small);
  const int64_t model_bytes = parameter_count(small) * 4;
  memory::PeakScope scope;
  load_flux_weights(*target, path);
  const int64_t peak = scope.peak_delta();
  std::cout << "[ measure  ] flux-small bf16 BFL file into a float32 model: peak above the built model "
            << memory::format_bytes(peak) << " (model " << memory::format_bytes(model_bytes) << ")\n";
  EXPECT_LE(peak, 64 * 1024);
  const auto want = diffusers_state(*source), got = diffusers_state(*target);
  for (const auto& [name, t] : want) {
    EXPECT_TRUE(torch::equal(got.at(name), t.to(at::kBFloat16).to(at::kFloat))) << name;
  }
}

TEST_F(FluxWeightFormatsTest, TransformerLoadingAcceptsBflFilesAndFolders) {
  Flux source = random_flux(tiny, 12);
  const std::string bfl_path = write_bfl(*source, "alone.safetensors");
  const at::Tensor want = forward_once(*source);

  // A single BFL file without config.json: the config comes from its shapes.
  train::TransformerSpec spec;
  spec.family = "flux";
  spec.flavour = "flux-small";  // not what the file holds: the file's shapes win
  spec.weights = bfl_path;
  auto transformer = train::make_transformer(spec, at::kCPU);
  auto* flux = dynamic_cast<FluxImpl*>(&transformer->module());
  ASSERT_NE(flux, nullptr);
  EXPECT_EQ(flux->config().num_layers, tiny.num_layers);
  EXPECT_TRUE(torch::equal(forward_once(*flux), want));

  // A component folder whose weight file is in the BFL layout.
  const std::filesystem::path folder = dir.path() / "transformer";
  std::filesystem::create_directories(folder);
  std::filesystem::copy_file(bfl_path, folder / "diffusion_pytorch_model.safetensors");
  std::ofstream(folder / "config.json")
      << R"({"num_layers": 2, "num_single_layers": 2, "attention_head_dim": 32, "num_attention_heads": 2,
            "joint_attention_dim": 32, "pooled_projection_dim": 16, "in_channels": 64, "guidance_embeds": true,
            "axes_dims_rope": [8, 12, 12]})";
  Flux from_folder = random_flux(tiny, 13);
  models::load_flux_transformer_weights(*from_folder, folder.string());
  EXPECT_TRUE(torch::equal(forward_once(*from_folder), want));
  const auto config = models::flux_config_for_weights(folder.string());
  ASSERT_TRUE(config.has_value());
  EXPECT_EQ(config->hidden_size(), tiny.hidden_size());
}

// docs/WEIGHT_FORMATS.md shows the table rendered from the code; the two must not drift apart.
TEST_F(FluxWeightFormatsTest, DocumentedTableEqualsTheCodeTable) {
  std::ifstream in(remat::testing::source_dir() + "/docs/WEIGHT_FORMATS.md");
  ASSERT_TRUE(in) << "docs/WEIGHT_FORMATS.md not found";
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  const std::string begin = "<!-- bfl-table:begin (generated: render_flux_bfl_table_markdown) -->\n";
  const std::string end = "<!-- bfl-table:end -->";
  const size_t b = doc.find(begin), e = doc.find(end);
  ASSERT_NE(b, std::string::npos);
  ASSERT_NE(e, std::string::npos);
  const std::string rendered = render_flux_bfl_table_markdown();
  if (doc.substr(b + begin.size(), e - b - begin.size()) != rendered) {
    ADD_FAILURE() << "docs/WEIGHT_FORMATS.md's table differs from the code's; the code renders:\n"
                  << begin << rendered << end;
  }
}

}  // namespace flux_weight_formats_test
}  // namespace
}  // namespace remat::models
