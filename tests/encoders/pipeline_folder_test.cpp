// Pipeline folders: finding, validating, sharding and loading component weights, model_index.json
// and per-component overrides. Expected values are computed here from the conventions (the hub's
// shard rule, file names), never read back from the code under test.
#include <filesystem>
#include <fstream>
#include <iostream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "remat/encoders/demo_pipeline.h"
#include "remat/encoders/pipeline_folder.h"
#include "remat/io/safetensors.h"
#include "remat/memory.h"
#include "remat/models/flux.h"
#include "temp_dir.h"
#include "value_error.h"

namespace {
namespace pipeline_folder_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

namespace fs = std::filesystem;
using remat::testing::error_of;
using remat::testing::TempDir;
using namespace remat::encoders;
using namespace remat::models;
using Json = nlohmann::json;

// Five parameters of known byte sizes (float32): a, b, c 40 B; big 100 B; e 20 B.
struct FiveTensors : torch::nn::Module {
  explicit FiveTensors(bool extra = false) {
    a = register_parameter("a", torch::randn({10}));
    b = register_parameter("b", torch::randn({10}));
    c = register_parameter("c", torch::randn({2, 5}));
    big = register_parameter("big", torch::randn({25}));
    e = register_parameter("e", torch::randn({5}));
    if (extra) register_parameter("extra", torch::randn({3}));
  }
  at::Tensor a, b, c, big, e;
};

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

Json read_json(const std::string& path) {
  std::ifstream in(path);
  return Json::parse(in);
}

const std::string kConfig = "{\"_class_name\": \"Test\"}";

// A sharded FiveTensors component: limit 90 B gives shards {a, b}, {big}, {c, e} (see below).
std::string sharded_component(const TempDir& tmp, FiveTensors& module) {
  const std::string dir = tmp / "component";
  save_component(dir, module, kConfig, 90);
  return dir;
}

const std::string kShard1 = "diffusion_pytorch_model-00001-of-00003.safetensors";
const std::string kShard2 = "diffusion_pytorch_model-00002-of-00003.safetensors";
const std::string kShard3 = "diffusion_pytorch_model-00003-of-00003.safetensors";

TEST(ComponentWeights, ShardsFollowTheHubRule) {
  // huggingface_hub: in order, a new shard when the next tensor would pass the limit; a tensor
  // above the limit gets its own shard at once. Limit 90: a(40) b(40) -> 80; c would make 120:
  // close {a,b}; big(100) > 90: its own shard {big}; c(40) e(20) -> {c, e}.
  TempDir tmp;
  FiveTensors module;
  const std::string dir = sharded_component(tmp, module);
  const Json index = read_json(dir + "/diffusion_pytorch_model.safetensors.index.json");
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), 40u + 40 + 40 + 100 + 20);
  const Json expected = {{"a", kShard1}, {"b", kShard1}, {"big", kShard2}, {"c", kShard3}, {"e", kShard3}};
  EXPECT_EQ(index["weight_map"], expected);
  EXPECT_FALSE(fs::exists(dir + "/diffusion_pytorch_model.safetensors"));
  EXPECT_EQ(read_json(dir + "/config.json")["_class_name"], "Test");

  const ComponentWeights found = find_component_weights(dir);
  EXPECT_EQ(found.base, "diffusion_pytorch_model");
  ASSERT_TRUE(found.index.has_value());
  EXPECT_EQ(found.files, (std::vector<std::string>{dir + "/" + kShard1, dir + "/" + kShard2, dir + "/" + kShard3}));
}

TEST(ComponentWeights, ResavingUnshardedRemovesTheIndex) {
  TempDir tmp;
  FiveTensors module;
  const std::string dir = sharded_component(tmp, module);
  save_component(dir, module, kConfig, 1000, "diffusion_pytorch_model");
  EXPECT_FALSE(fs::exists(dir + "/diffusion_pytorch_model.safetensors.index.json"));
  const ComponentWeights found = find_component_weights(dir);
  EXPECT_FALSE(found.index.has_value());
  EXPECT_EQ(found.files, std::vector<std::string>{dir + "/diffusion_pytorch_model.safetensors"});
}

TEST(ComponentWeights, TransformersNamesAreFoundToo) {
  TempDir tmp;
  FiveTensors module;
  save_component(tmp / "te", module, kConfig, 1000, "model");
  EXPECT_EQ(find_component_weights(tmp / "te").files, std::vector<std::string>{tmp / "te/model.safetensors"});
  save_component(tmp / "te2", module, kConfig, 90, "model");
  EXPECT_EQ(find_component_weights(tmp / "te2").index.value_or(""), tmp / "te2/model.safetensors.index.json");
}

// The acceptance check of sharding: a sharded bf16 Flux transformer loads into float32 exactly
// as the unsharded file does, and both equal the source weights converted to float32.
TEST(ComponentWeights, ShardedLoadEqualsUnshardedBitExactly) {
  TempDir tmp;
  const auto config = remat::models::FluxConfig::preset("flux-tiny");
  torch::manual_seed(7);
  remat::models::Flux source(config);
  source->to(at::kBFloat16);
  const std::string json = flux_transformer_config_json(config);
  save_component(tmp / "whole", *source, json, kDefaultMaxShardBytes);
  save_component(tmp / "sharded", *source, json, 40000);
  const ComponentWeights sharded = find_component_weights(tmp / "sharded");
  ASSERT_GE(sharded.files.size(), 3u);

  remat::models::Flux from_whole(config), from_shards(config);
  load_component(tmp / "whole", *from_whole);
  load_component(tmp / "sharded", *from_shards);
  const auto want = source->named_parameters();
  const auto whole = from_whole->named_parameters();
  const auto shards = from_shards->named_parameters();
  ASSERT_EQ(want.size(), shards.size());
  for (const auto& item : want) {
    const at::Tensor expected = item.value().to(at::kFloat);
    EXPECT_EQ(whole[item.key()].scalar_type(), at::kFloat);
    EXPECT_TRUE(torch::equal(whole[item.key()], expected)) << item.key();
    EXPECT_TRUE(torch::equal(shards[item.key()], expected)) << item.key();
  }
  // The config written with it reads back as the same architecture.
  const auto back = remat::models::FluxConfig::from_json(tmp / "sharded/config.json");
  EXPECT_EQ(remat::models::parameter_count(back), remat::models::parameter_count(config));
}

TEST(ComponentWeights, NoWeightsNamesTheDirectoryAndTheExpectedFiles) {
  TempDir tmp;
  fs::create_directories(tmp / "empty");
  const std::string msg = error_of([&] { find_component_weights(tmp / "empty"); });
  EXPECT_NE(msg.find("[pipeline] no weights in '" + tmp / "empty" + "'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("diffusion_pytorch_model.safetensors, model.safetensors"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { find_component_weights(tmp / "absent"); }).find("does not exist"), std::string::npos);
}

TEST(ComponentWeights, VariantsAndPicklesAreRefusedByName) {
  TempDir tmp;
  FiveTensors module;
  const std::string dir = tmp / "vae";
  fs::create_directories(dir);
  remat::io::save_module(dir + "/diffusion_pytorch_model.fp16.safetensors", module);
  write_text(dir + "/diffusion_pytorch_model.bin", "not read");
  const std::string msg = error_of([&] { find_component_weights(dir); });
  EXPECT_NE(msg.find("found only diffusion_pytorch_model.bin, diffusion_pytorch_model.fp16.safetensors"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("read with variant set to its name"), std::string::npos) << msg;
}

// diffusers' and transformers' variant files (`_add_variant`: "<base>.<variant>.safetensors",
// "<base>.safetensors.index.<variant>.json"), read when the variant is asked for, and only then.
TEST(ComponentWeights, AVariantReadsItsOwnFiles) {
  TempDir tmp;
  FiveTensors module;
  const std::string dir = tmp / "vae";
  fs::create_directories(dir);
  remat::io::save_module(dir + "/diffusion_pytorch_model.fp16.safetensors", module);
  remat::io::save_module(dir + "/diffusion_pytorch_model.safetensors", module);
  EXPECT_EQ(find_component_weights(dir).files, std::vector<std::string>{dir + "/diffusion_pytorch_model.safetensors"});
  EXPECT_EQ(find_component_weights(dir, "fp16").files,
            std::vector<std::string>{dir + "/diffusion_pytorch_model.fp16.safetensors"});
  // A sharded variant: its index names the shards.
  save_component(tmp / "sharded", module, "{}", 1);
  const std::string sharded = tmp / "sharded";
  fs::rename(sharded + "/diffusion_pytorch_model.safetensors.index.json",
             sharded + "/diffusion_pytorch_model.safetensors.index.bf16.json");
  const ComponentWeights w = find_component_weights(sharded, "bf16");
  EXPECT_EQ(w.index.value_or(""), sharded + "/diffusion_pytorch_model.safetensors.index.bf16.json");
  EXPECT_GE(w.files.size(), 2u);
  EXPECT_EQ(open_component_weights(sharded, "bf16").size(), w.files.size());
  FiveTensors loaded;
  for (auto& p : loaded.parameters()) p.data().zero_();
  load_component(sharded, loaded, {}, "bf16");
  for (size_t i = 0; i < module.parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal(loaded.parameters()[i], module.parameters()[i]));
  }
  // Asked for and absent: the variant, the names expected and what is there.
  const std::string msg = error_of([&] { find_component_weights(dir, "bf16"); });
  EXPECT_NE(msg.find("the 'bf16' variant"), std::string::npos) << msg;
  EXPECT_NE(msg.find("diffusion_pytorch_model.bf16.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.safetensors.index.bf16.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("found only diffusion_pytorch_model.safetensors"), std::string::npos) << msg;
  // A name that could reach another directory is not a variant.
  for (const char* bad : {"../x", "fp16/x", "a.b", ""}) {
    EXPECT_NE(error_of([&] { check_weights_variant(bad); }).find("variant must be a name"), std::string::npos) << bad;
  }
  EXPECT_NE(error_of([&] { find_component_weights(dir, "../vae"); }).find("variant must be a name"), std::string::npos);
}

// diffusers' from_pretrained takes the index when both layouts of one name exist; the two names
// (diffusers' and transformers') at once are refused.
TEST(ComponentWeights, IndexWinsOverAWholeFileButTwoNamesAreAmbiguous) {
  TempDir tmp;
  FiveTensors module;
  const std::string dir = sharded_component(tmp, module);
  remat::io::save_module(dir + "/diffusion_pytorch_model.safetensors", module);
  EXPECT_EQ(find_component_weights(dir).index.value_or(""), dir + "/diffusion_pytorch_model.safetensors.index.json");
  remat::io::save_module(dir + "/model.safetensors", module);
  const std::string msg = error_of([&] { find_component_weights(dir); });
  EXPECT_NE(msg.find("holds more than one set of weights (diffusion_pytorch_model.safetensors.index.json, "
                     "model.safetensors)"),
            std::string::npos)
      << msg;
}

TEST(ComponentWeights, MissingShardNamesTheIndexKeyAndShard) {
  TempDir tmp;
  FiveTensors module;
  const std::string dir = sharded_component(tmp, module);
  fs::remove(dir + "/" + kShard2);
  const std::string msg = error_of([&] { open_component_weights(dir); });
  EXPECT_NE(msg.find("[pipeline] shard index '" + dir + "/diffusion_pytorch_model.safetensors.index.json' maps key "
                     "'big' to shard '" + kShard2 + "', which does not exist"),
            std::string::npos)
      << msg;
}

TEST(ComponentWeights, IndexNamingAFileThatIsNotThere) {
  TempDir tmp;
  FiveTensors module;
  const std::string dir = sharded_component(tmp, module);
  const std::string index = dir + "/diffusion_pytorch_model.safetensors.index.json";
  Json j = read_json(index);
  j["weight_map"]["e"] = "diffusion_pytorch_model-00004-of-00003.safetensors";
  write_text(index, j.dump());
  const std::string msg = error_of([&] { open_component_weights(dir); });
  EXPECT_NE(msg.find("maps key 'e' to shard 'diffusion_pytorch_model-00004-of-00003.safetensors', which does not "
                     "exist in '" + dir + "'"),
            std::string::npos)
      << msg;
}

TEST(ComponentWeights, ShardKeyTheIndexDoesNotList) {
  TempDir tmp;
  FiveTensors module;
  const std::string dir = sharded_component(tmp, module);
  const std::string index = dir + "/diffusion_pytorch_model.safetensors.index.json";
  Json j = read_json(index);
  j["weight_map"].erase("c");
  write_text(index, j.dump());
  const std::string msg = error_of([&] { open_component_weights(dir); });
  EXPECT_NE(msg.find("[pipeline] shard '" + dir + "/" + kShard3 + "' holds key 'c', which the index '" + index +
                     "' does not list"),
            std::string::npos)
      << msg;
}

TEST(ComponentWeights, ShardKeyTheIndexMapsElsewhere) {
  TempDir tmp;
  FiveTensors module;
  const std::string dir = sharded_component(tmp, module);
  const std::string index = dir + "/diffusion_pytorch_model.safetensors.index.json";
  Json j = read_json(index);
  j["weight_map"]["a"] = kShard2;
  write_text(index, j.dump());
  const std::string msg = error_of([&] { open_component_weights(dir); });
  EXPECT_NE(msg.find("holds key 'a', which the index '" + index + "' maps to shard '" + kShard2 + "'"),
            std::string::npos)
      << msg;
}

TEST(ComponentWeights, IndexKeyAbsentFromItsShard) {
  TempDir tmp;
  FiveTensors module;
  const std::string dir = sharded_component(tmp, module);
  const std::string index = dir + "/diffusion_pytorch_model.safetensors.index.json";
  Json j = read_json(index);
  j["weight_map"]["ghost"] = kShard1;
  write_text(index, j.dump());
  const std::string msg = error_of([&] { open_component_weights(dir); });
  EXPECT_NE(msg.find("shard index '" + index + "' maps key 'ghost' to shard '" + kShard1 + "', but '" + dir + "/" +
                     kShard1 + "' has no such tensor"),
            std::string::npos)
      << msg;
}

TEST(ComponentWeights, MalformedIndexes) {
  TempDir tmp;
  FiveTensors module;
  const std::string dir = sharded_component(tmp, module);
  const std::string index = dir + "/diffusion_pytorch_model.safetensors.index.json";
  const auto message_for = [&](const std::string& text) {
    write_text(index, text);
    return error_of([&] { find_component_weights(dir); });
  };
  EXPECT_NE(message_for("{\"weight_map\": ").find("shard index '" + index + "' is not valid JSON"), std::string::npos);
  EXPECT_NE(message_for("[1]").find("must be a JSON object, got [1]"), std::string::npos);
  EXPECT_NE(message_for("{\"metadata\": {}}").find("must have a \"weight_map\" object"), std::string::npos);
  EXPECT_NE(message_for("{\"weight_map\": {\"a\": 3}}").find("weight_map['a'] must be a shard file name"),
            std::string::npos);
  EXPECT_NE(message_for("{\"weight_map\": {\"a\": \"../x.safetensors\"}}")
                .find("weight_map['a'] must be a file name in the same directory, got '../x.safetensors'"),
            std::string::npos);
  EXPECT_NE(message_for(std::string(100, '[') + std::string(100, ']')).find("nest"), std::string::npos);
}

TEST(ComponentWeights, StrictLoadNamesTheFileOfEachKeyAndLeavesTheModuleUntouched) {
  TempDir tmp;
  FiveTensors module;
  const std::string dir = sharded_component(tmp, module);
  // The module has a key no file has.
  FiveTensors bigger(/*extra=*/true);
  const at::Tensor before = bigger.a.clone();
  std::string msg = error_of([&] { load_component(dir, bigger); });
  EXPECT_NE(msg.find("missing key 'extra' (in the module, in none of the weight files of '" + dir + "')"),
            std::string::npos)
      << msg;
  EXPECT_TRUE(torch::equal(bigger.a, before));
  // A file has a key the module does not; and a shape mismatch.
  struct Fewer : torch::nn::Module {
    Fewer() {
      register_parameter("a", torch::zeros({10}));
      register_parameter("b", torch::zeros({10}));
      register_parameter("c", torch::zeros({10}));
      register_parameter("e", torch::zeros({5}));
    }
  } fewer;
  msg = error_of([&] { load_component(dir, fewer); });
  EXPECT_NE(msg.find("unexpected key 'big' in '" + dir + "/" + kShard2 + "'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("shape mismatch for key 'c' in '" + dir + "/" + kShard3 + "': file [2, 5], module [10]"),
            std::string::npos)
      << msg;
  EXPECT_TRUE(torch::equal(fewer.named_parameters()["a"], torch::zeros({10})));
}

TEST(ComponentWeights, SaveRejectsAConfigThatIsNotAnObject) {
  TempDir tmp;
  FiveTensors module;
  EXPECT_NE(error_of([&] { save_component(tmp / "x", module, "[1, 2]", 100); }).find("must be a JSON object"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(tmp / "x/config.json"));
}

// Memory: a bf16 sharded component loads into a bf16 module with no extra host copy (tensors go
// from the mapping straight into the parameters). An intermediate float32 copy of one shard
// would show as at least that shard's size x 2.
TEST(ComponentWeights, Bf16ShardedLoadAllocatesNothingBeyondTheModule) {
  ASSERT_TRUE(remat::memory::cpu_tracking_installed());
  TempDir tmp;
  const auto config = remat::models::FluxConfig::preset("flux-small");
  int64_t module_bytes = 0;
  {
    torch::manual_seed(1);
    remat::models::Flux source(config);
    source->to(at::kBFloat16);
    save_component(tmp / "t", *source, flux_transformer_config_json(config), 1 << 20);
  }
  ASSERT_GE(find_component_weights(tmp / "t").files.size(), 4u);
  remat::models::Flux target(config);
  target->to(at::kBFloat16);
  for (const auto& [name, t] : remat::io::module_state(*target)) module_bytes += t.numel() * t.element_size();
  remat::memory::PeakScope scope;
  load_component(tmp / "t", *target);
  const double ratio_extra = static_cast<double>(scope.peak_delta()) / static_cast<double>(module_bytes);
  const double ratio_total = static_cast<double>(scope.peak_bytes()) / static_cast<double>(module_bytes);
  std::cout << "[memory] bf16 sharded load of flux-small (" << module_bytes << " B of parameters): peak extra "
            << scope.peak_delta() << " B (" << ratio_extra << " x the module), peak tracked "
            << scope.peak_bytes() << " B (" << ratio_total << " x)\n";
  RecordProperty("peak_extra_bytes", static_cast<int>(scope.peak_delta()));
  EXPECT_LT(ratio_extra, 0.01);
}

// docs/PIPELINE_FOLDER.md's memory table uses these counts: FLUX.1-dev's published parameter
// count (the sum of its transformer/ shards' tensors) against the project's FluxConfig count.
TEST(ComponentWeights, FluxDevTransformerCountOfTheMemoryTable) {
  EXPECT_EQ(remat::models::parameter_count(remat::models::FluxConfig::preset("flux-dev")), int64_t{11'901'408'320});
}

// ---- model_index.json, components, overrides ----

std::string demo(const TempDir& tmp, const std::string& name = "pipe") {
  DemoPipelineOptions options;
  options.transformer_shards = 2;
  write_demo_pipeline(tmp / name, options);
  return tmp / name;
}

TEST(PipelineFolder, DemoFolderOpensWithItsComponents) {
  TempDir tmp;
  const std::string root = demo(tmp);
  // Every component of a FluxPipeline, each with its config and weights or tokenizer files.
  const PipelineFolder folder = PipelineFolder::open(root, flux_pipeline_components());
  const std::map<std::string, std::string> classes = {
      {"scheduler", "FlowMatchEulerDiscreteScheduler"}, {"text_encoder", "CLIPTextModel"},
      {"text_encoder_2", "T5EncoderModel"}, {"tokenizer", "CLIPTokenizer"}, {"tokenizer_2", "T5TokenizerFast"},
      {"transformer", "FluxTransformer2DModel"}, {"vae", "AutoencoderKL"}};
  ASSERT_EQ(folder.components.size(), classes.size());
  for (const auto& [name, class_name] : classes) {
    EXPECT_EQ(folder.directory(name), root + "/" + name);
    EXPECT_EQ(folder.components.at(name).class_name, class_name) << name;
  }
  // The transformer is sharded (2+ shards with an index), as the published one is.
  const ComponentWeights w = find_component_weights(root + "/transformer");
  ASSERT_TRUE(w.index.has_value());
  EXPECT_GE(w.files.size(), 2u);
  const Json scheduler = read_json(root + "/scheduler/scheduler_config.json");
  EXPECT_EQ(scheduler["_class_name"], "FlowMatchEulerDiscreteScheduler");
  EXPECT_EQ(scheduler["shift"], 3.0);
  EXPECT_EQ(scheduler["use_dynamic_shifting"], true);
  // The weights load into the architecture of the written config.json.
  remat::models::Flux model(remat::models::FluxConfig::from_json(root + "/transformer/config.json"));
  EXPECT_TRUE(load_component(root + "/transformer", *model).ok());
  EXPECT_NE(error_of([&] { write_demo_pipeline(root); }).find("already holds a model_index.json"), std::string::npos);
}

TEST(PipelineFolder, MissingRequiredComponentNamesFolderAndComponent) {
  TempDir tmp;
  const std::string root = demo(tmp);
  // Named [null, null] in model_index.json.
  Json index = read_json(root + "/model_index.json");
  index["vae"] = Json::array({nullptr, nullptr});
  std::ofstream(root + "/model_index.json") << index.dump(2);
  std::string msg = error_of([&] { PipelineFolder::open(root, {"transformer", "vae"}); });
  EXPECT_NE(msg.find("'" + root + "/model_index.json' names no component 'vae' (expected \"vae\": [\"diffusers\", "
                     "\"AutoencoderKL\"])"),
            std::string::npos)
      << msg;
  // Named, but its directory is gone.
  fs::remove_all(root + "/transformer");
  msg = error_of([&] { PipelineFolder::open(root, {"transformer"}); });
  EXPECT_NE(msg.find("[pipeline] pipeline folder '" + root + "': component 'transformer' needs the directory '" +
                     root + "/transformer' (with config.json and its safetensors weights), which does not exist"),
            std::string::npos)
      << msg;
}

TEST(PipelineFolder, ComponentWithoutItsConfigOrWeights) {
  TempDir tmp;
  const std::string root = demo(tmp);
  fs::remove(root + "/transformer/config.json");
  std::string msg = error_of([&] { PipelineFolder::open(root, {"transformer"}); });
  EXPECT_NE(msg.find("component 'transformer' directory '" + root + "/transformer' has no config.json"),
            std::string::npos)
      << msg;
  fs::remove(root + "/scheduler/scheduler_config.json");
  msg = error_of([&] { PipelineFolder::open(root, {"scheduler"}); });
  EXPECT_NE(msg.find("has no scheduler_config.json"), std::string::npos) << msg;
}

TEST(PipelineFolder, MalformedModelIndex) {
  TempDir tmp;
  const std::string root = demo(tmp);
  const std::string index = root + "/model_index.json";
  const auto message_for = [&](const std::string& text) {
    write_text(index, text);
    return error_of([&] { PipelineFolder::open(root, {"transformer"}); });
  };
  EXPECT_NE(message_for("{").find("'" + index + "' is not valid JSON"), std::string::npos);
  EXPECT_NE(message_for("[]").find("'" + index + "' must be a JSON object"), std::string::npos);
  EXPECT_NE(message_for("{\"_class_name\": \"StableDiffusionPipeline\"}")
                .find("_class_name must be one of FluxPipeline, FluxKontextPipeline (remat reads Flux pipeline "
                      "folders), got \"StableDiffusionPipeline\""),
            std::string::npos);
  EXPECT_NE(message_for("{\"_class_name\": \"FluxPipeline\", \"transformer\": \"FluxTransformer2DModel\"}")
                .find("component 'transformer' must be [library, class] (two strings) or [null, null], got "
                      "\"FluxTransformer2DModel\""),
            std::string::npos);
  EXPECT_NE(message_for("{\"_class_name\": \"FluxPipeline\", \"transformer\": [\"diffusers\", \"UNet2DModel\"]}")
                .find("component 'transformer' is [\"diffusers\", \"UNet2DModel\"], expected [\"diffusers\", one of "
                      "FluxTransformer2DModel]"),
            std::string::npos);
  fs::remove(index);
  EXPECT_NE(error_of([&] { PipelineFolder::open(root, {"transformer"}); })
                .find("'" + root + "' is not a diffusers pipeline folder: it has no model_index.json"),
            std::string::npos);
}

TEST(PipelineFolder, OverridesReplaceWhereAComponentComesFrom) {
  TempDir tmp;
  const std::string root = demo(tmp, "pipe");
  const std::string other = demo(tmp, "other");
  fs::remove_all(root + "/transformer");  // the folder alone would fail
  // A pipeline folder as the override: its transformer/ (no subfolder given).
  PipelineFolder folder = PipelineFolder::open(root, {"transformer"}, {{"transformer", {other, std::nullopt}}});
  EXPECT_EQ(folder.directory("transformer"), other + "/transformer");
  EXPECT_TRUE(folder.components.at("transformer").overridden);
  // SimpleTuner's pretrained_transformer_subfolder: explicit, and "none" for the path itself.
  folder = PipelineFolder::open(root, {"transformer"}, {{"transformer", {other, std::string("transformer")}}});
  EXPECT_EQ(folder.directory("transformer"), other + "/transformer");
  folder = PipelineFolder::open(root, {"transformer"}, {{"transformer", {other + "/transformer", std::string("None")}}});
  EXPECT_EQ(folder.directory("transformer"), other + "/transformer");
  // A transformer folder alone, subfolder unset: the folder itself.
  folder = PipelineFolder::open(root, {"transformer"}, {{"transformer", {other + "/transformer", std::nullopt}}});
  EXPECT_EQ(folder.directory("transformer"), other + "/transformer");
  // Bad overrides name the override.
  std::string msg = error_of([&] {
    PipelineFolder::open(root, {"transformer"}, {{"transformer", {tmp / "nowhere", std::nullopt}}});
  });
  EXPECT_NE(msg.find("the override for component 'transformer' must be a directory (a pipeline folder or a "
                     "'transformer' folder), got '" + tmp / "nowhere" + "'"),
            std::string::npos)
      << msg;
  msg = error_of([&] {
    PipelineFolder::open(root, {"transformer"}, {{"transformer", {other, std::string("unet")}}});
  });
  EXPECT_NE(msg.find("the override for 'transformer' ('" + other + "'): component 'transformer' needs the directory '" +
                     other + "/unet'"),
            std::string::npos)
      << msg;
  msg = error_of([&] { PipelineFolder::open(root, {"transformer"}, {{"unet", {other, std::nullopt}}}); });
  EXPECT_NE(msg.find("cannot override unknown component 'unet'"), std::string::npos) << msg;
}

TEST(PipelineFolder, ResolveAcceptsAPipelineOrAComponentFolder) {
  TempDir tmp;
  const std::string root = demo(tmp);
  EXPECT_EQ(resolve_component_directory(root, "transformer"), root + "/transformer");
  EXPECT_EQ(resolve_component_directory(root + "/transformer", "transformer"), root + "/transformer");
  fs::create_directories(tmp / "plain");
  const std::string msg = error_of([&] { resolve_component_directory(tmp / "plain", "transformer"); });
  EXPECT_NE(msg.find("'" + tmp / "plain" + "' is neither a diffusers pipeline folder (model_index.json) nor a "
                     "'transformer' folder (config.json and safetensors weights)"),
            std::string::npos)
      << msg;
}

}  // namespace pipeline_folder_test
}  // namespace
