// read_data_backend_config: SimpleTuner's keys, defaults and rules
// (https://github.com/bghira/SimpleTuner/blob/main/documentation/DATALOADER.md,
// helpers/data_backend/factory.py, config/image.py, config/validators.py), every error naming the
// file, the backend id, the key, the value and what is supported; one warning for every key
// remat does not implement.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "remat/data/dataset_config.h"
#include "temp_dir.h"
#include "value_error.h"

namespace remat::data {
namespace {
namespace dataset_config_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

class DatasetConfig : public ::testing::Test {
 protected:
  std::string write(const std::string& json) {
    const std::string path = dir_ / ("multidatabackend" + std::to_string(files_++) + ".json");
    std::ofstream(path) << json;
    return path;
  }
  // A run's defaults: its model_family names the default cache folders.
  static DataDefaults run_defaults() {
    DataDefaults d;
    d.model_family = "flux";
    return d;
  }
  DataBackendConfig read(const std::string& json, const DataDefaults& defaults = run_defaults()) {
    return read_data_backend_config(write(json), defaults);
  }
  std::string error(const std::string& json, const DataDefaults& defaults = run_defaults()) {
    const std::string path = write(json);
    const std::string message = testing::error_of([&] { read_data_backend_config(path, defaults); });
    EXPECT_NE(message.find(path), std::string::npos) << "the file is not named: " << message;
    EXPECT_EQ(message.rfind("[data]", 0), 0u) << message;
    return message;
  }
  testing::TempDir dir_;
  int files_ = 0;
};

// Every fragment must be in the message.
void expect_mentions(const std::string& message, std::initializer_list<const char*> fragments) {
  for (const char* f : fragments) EXPECT_NE(message.find(f), std::string::npos) << "no '" << f << "' in: " << message;
}

// SimpleTuner's config/multidatabackend.json.example, its first backend and its local text_embeds
// backend pointed at local folders (its placeholder values "random|center|corner" replaced by
// one value each).
const char* const kSimpleTunerExampleLocal = R"([
  {
    "id": "something-special-to-remember-by",
    "type": "local",
    "instance_data_dir": "/path/to/data/tree",
    "crop": false,
    "crop_style": "center",
    "crop_aspect": "preserve",
    "minimum_image_size": 1024,
    "maximum_image_size": 1536,
    "target_downsample_size": 1024,
    "resolution": 1024,
    "resolution_type": "pixel_area",
    "prepend_instance_prompt": false,
    "instance_prompt": "cat girls",
    "only_instance_prompt": false,
    "caption_strategy": "filename",
    "cache_dir_vae": "/path/to/vaecache",
    "vae_cache_clear_each_epoch": true,
    "probability": 1.0,
    "repeats": 5,
    "text_embeds": "alt-embed-cache",
    "skip_file_discovery": "vae,aspect,text,metadata",
    "preserve_data_backend_cache": true
  },
  {
    "id": "alt-embed-cache",
    "dataset_type": "text_embeds",
    "default": false,
    "type": "local",
    "cache_dir": "/path/to/textembed_cache"
  }
])";

TEST_F(DatasetConfig, SimpleTunerExampleReadsEveryKey) {
  const auto config = read(kSimpleTunerExampleLocal);
  ASSERT_EQ(config.images.size(), 1u);
  const auto& image = config.images[0];
  EXPECT_EQ(image.id, "something-special-to-remember-by");
  EXPECT_EQ(image.instance_data_dir, "/path/to/data/tree");
  EXPECT_FALSE(image.crop);
  EXPECT_EQ(image.crop_style, CropStyle::center);
  EXPECT_EQ(image.crop_aspect, CropAspect::preserve);
  EXPECT_EQ(image.minimum_image_size, 1024);
  EXPECT_EQ(image.maximum_image_size, 1536);
  EXPECT_EQ(image.target_downsample_size, 1024);
  EXPECT_EQ(image.resolution, 1024);
  EXPECT_EQ(image.resolution_type, ResolutionType::pixel_area);
  EXPECT_EQ(image.instance_prompt, "cat girls");
  EXPECT_FALSE(image.prepend_instance_prompt);
  EXPECT_FALSE(image.only_instance_prompt);
  EXPECT_EQ(image.caption_strategy, CaptionStrategy::filename);
  EXPECT_EQ(image.cache_dir_vae, "/path/to/vaecache");
  EXPECT_EQ(image.probability, 1.0);
  EXPECT_EQ(image.repeats, 5);
  EXPECT_EQ(image.text_embeds, "alt-embed-cache");
  ASSERT_EQ(config.text_embeds.size(), 1u);
  EXPECT_EQ(config.text_embeds[0].cache_dir, "/path/to/textembed_cache");
  // The only text_embeds backend becomes the default (SimpleTuner marks the first one).
  EXPECT_TRUE(config.text_embeds[0].is_default);
  EXPECT_EQ(&config.text_embeds_of("alt-embed-cache"), &config.text_embeds[0]);
  // One warning, naming the backend and every key remat does not implement.
  ASSERT_EQ(config.warnings.size(), 1u);
  expect_mentions(config.warnings[0], {"something-special-to-remember-by", "vae_cache_clear_each_epoch",
                                       "skip_file_discovery", "preserve_data_backend_cache"});
}

TEST_F(DatasetConfig, SimpleTunerExampleAwsBackendIsRefused) {
  // The example's second backend, as SimpleTuner ships it.
  const std::string message = error(R"([
    {"id": "local-one", "instance_data_dir": "/data"},
    {
        "id": "another-special-name-for-another-backend",
        "type": "aws",
        "aws_bucket_name": "something-yummy",
        "aws_region_name": null,
        "aws_endpoint_url": "https://foo.bar/",
        "aws_data_prefix": "",
        "cache_dir_vae": "s3prefix/for/vaecache",
        "repeats": 2
    }
  ])");
  expect_mentions(message, {"another-special-name-for-another-backend", "type", "\"aws\"", "supported: local"});
  // Its aws text_embeds backend likewise.
  expect_mentions(error(R"([{"id": "img", "instance_data_dir": "/d"},
      {"id": "an example backend for text embeds.", "dataset_type": "text_embeds", "default": true,
       "type": "aws", "aws_bucket_name": "textembeds-something-yummy", "cache_dir": ""}])"),
                  {"an example backend for text embeds.", "type", "\"aws\"", "supported: local"});
  for (const char* type : {"huggingface", "csv", "webshart", "memory"}) {
    expect_mentions(error(std::string(R"([{"id": "x", "instance_data_dir": "/d", "type": ")") + type + "\"}]"),
                    {"'x'", "type", type, "supported: local"});
  }
}

TEST_F(DatasetConfig, DefaultsComeFromTheGlobalOptionsAndSimpleTunersLayout) {
  DataDefaults d = run_defaults();
  d.cache_dir = "/run/cache";
  d.resolution = 512;
  d.resolution_type = ResolutionType::pixel;
  d.minimum_image_size = 256;
  d.crop = true;
  d.crop_style = CropStyle::corner;
  d.crop_aspect = CropAspect::preserve;
  d.caption_strategy = CaptionStrategy::textfile;
  d.instance_prompt = "global prompt";
  d.caption_dropout_probability = 0.25;
  const auto config = read(R"([{"id": "a", "instance_data_dir": "/data/a/"},
                               {"id": "b", "instance_data_dir": "/data/b", "minimum_image_size": null,
                                "crop": false, "probability": null, "repeats": null}])",
                           d);
  ASSERT_EQ(config.images.size(), 2u);
  const auto& a = config.images[0];
  EXPECT_EQ(a.instance_data_dir, "/data/a");  // trailing slash dropped, as SimpleTuner
  EXPECT_EQ(a.resolution, 512);
  EXPECT_EQ(a.resolution_type, ResolutionType::pixel);
  EXPECT_EQ(a.minimum_image_size, 256);
  EXPECT_TRUE(a.crop);
  EXPECT_EQ(a.crop_style, CropStyle::corner);
  EXPECT_EQ(a.crop_aspect, CropAspect::preserve);
  EXPECT_EQ(a.caption_strategy, CaptionStrategy::textfile);
  EXPECT_EQ(a.instance_prompt, "global prompt");
  EXPECT_EQ(a.caption_dropout_probability, 0.25);
  EXPECT_EQ(a.repeats, 0);
  EXPECT_EQ(a.probability, 1.0);
  EXPECT_EQ(a.cache_dir_vae, "/run/cache/vae/flux/a");
  const auto& b = config.images[1];
  EXPECT_FALSE(b.minimum_image_size.has_value());  // a present null replaces the global value
  EXPECT_FALSE(b.crop);
  EXPECT_EQ(b.probability, 1.0);  // SimpleTuner: null probability is 1.0
  EXPECT_EQ(b.repeats, 0);
  // No text_embeds backend: SimpleTuner makes a default one.
  ASSERT_EQ(config.text_embeds.size(), 1u);
  EXPECT_EQ(config.text_embeds[0].id, "text-embeds");
  EXPECT_EQ(config.text_embeds[0].cache_dir, "/run/cache/text/flux");
  EXPECT_TRUE(config.text_embeds[0].is_default);
  EXPECT_EQ(a.text_embeds, "text-embeds");
  EXPECT_TRUE(config.warnings.empty());
}

TEST_F(DatasetConfig, DisabledBackendsAreSkippedWhateverTheyHold) {
  const auto config = read(R"([{"id": "on", "instance_data_dir": "/d"},
                               {"id": "off", "disabled": true, "type": "aws"},
                               {"id": "off2", "disable": true, "dataset_type": "video"},
                               {"id": "on", "disabled": true}])");
  ASSERT_EQ(config.images.size(), 1u);
  EXPECT_EQ(config.images[0].id, "on");
}

TEST_F(DatasetConfig, TextEmbedsRules) {
  const auto config = read(R"([{"id": "img", "instance_data_dir": "/d", "text_embeds": "second"},
      {"id": "img2", "instance_data_dir": "/e"},
      {"id": "first", "dataset_type": "text_embeds", "cache_dir": "/c1"},
      {"id": "second", "dataset_type": "text_embeds", "cache_dir": "/c2", "default": true}])");
  EXPECT_EQ(config.images[0].text_embeds, "second");
  EXPECT_EQ(config.images[1].text_embeds, "second");  // the default
  EXPECT_FALSE(config.text_embeds_of("first").is_default);
  expect_mentions(testing::error_of([&] { config.text_embeds_of("nope"); }), {"'nope'", "'first'", "'second'"});

  expect_mentions(error(R"([{"id": "img", "instance_data_dir": "/d"},
      {"id": "t1", "dataset_type": "text_embeds", "cache_dir": "/c1", "default": true},
      {"id": "t2", "dataset_type": "text_embeds", "cache_dir": "/c2", "default": true}])"),
                  {"only one text_embeds backend", "'t1'", "'t2'"});
  expect_mentions(error(R"([{"id": "img", "instance_data_dir": "/d", "text_embeds": "missing"},
      {"id": "t1", "dataset_type": "text_embeds", "cache_dir": "/c1"}])"),
                  {"'img'", "text_embeds", "\"missing\"", "t1"});
}

// Two spellings of one folder are one cache: "x/.", "a/../x" and a symlink to x all collide with
// x (each dataset trained on the other's latents before).
TEST_F(DatasetConfig, CacheFoldersAreComparedByWhatTheyResolveTo) {
  const std::string root = dir_.path().string();
  std::filesystem::create_directories(root + "/x");
  std::filesystem::create_directories(root + "/a");
  std::filesystem::create_symlink(root + "/x", root + "/x-link");
  for (const std::string& spelling : {root + "/x/.", root + "/a/../x", root + "/x-link", root + "/x/"}) {
    const std::string text = R"([{"id": "one", "instance_data_dir": "/d", "cache_dir_vae": ")" + root +
                             R"(/x"}, {"id": "two", "instance_data_dir": "/e", "cache_dir_vae": ")" + spelling +
                             R"("}, {"id": "t", "dataset_type": "text_embeds", "cache_dir": ")" + root + R"(/t"}])";
    expect_mentions(error(text), {"backend 'two'", spelling.c_str(), "VAE cache of backend 'one'",
                                  ("both are '" + root + "/x'").c_str()});
  }
  const std::string text_alias = R"([{"id": "one", "instance_data_dir": "/d", "cache_dir_vae": ")" + root +
                                 R"(/x"}, {"id": "t", "dataset_type": "text_embeds", "cache_dir": ")" + root +
                                 R"(/x-link/."}])";
  expect_mentions(error(text_alias), {"backend 't'", "text embeddings and latents need separate folders"});
}

TEST_F(DatasetConfig, EveryBadValueNamesBackendKeyValueAndWhatIsSupported) {
  const auto bad = [&](const std::string& extra, std::initializer_list<const char*> fragments) {
    expect_mentions(error(R"([{"id": "ds", "instance_data_dir": "/d", )" + extra + "}]"), fragments);
  };
  bad(R"("crop_style": "face")", {"'ds'", "crop_style", "\"face\"", "not supported", "center, centre, random, corner"});
  bad(R"("crop_style": "diagonal")", {"'ds'", "crop_style", "\"diagonal\"", "center, centre, random, corner"});
  bad(R"("crop_aspect": "random")", {"'ds'", "crop_aspect", "\"random\"", "not supported", "square, preserve, closest"});
  bad(R"("crop": true, "crop_aspect": "closest")", {"'ds'", "crop_aspect", "crop_aspect_buckets"});
  bad(R"("crop_aspect": "closest", "crop_aspect_buckets": [{"aspect": 1.0, "weight": 1.0}])",
      {"'ds'", "crop_aspect_buckets", "weight"});
  bad(R"("resolution_type": "megapixel")", {"'ds'", "resolution_type", "\"megapixel\"", "pixel, area, pixel_area"});
  bad(R"("caption_strategy": "parquet")", {"'ds'", "caption_strategy", "\"parquet\"", "filename, textfile, instanceprompt"});
  bad(R"("caption_strategy": "instanceprompt")", {"'ds'", "caption_strategy", "instance_prompt"});
  bad(R"("prepend_instance_prompt": true)", {"'ds'", "prepend_instance_prompt", "instance_prompt"});
  bad(R"("only_instance_prompt": true)", {"'ds'", "only_instance_prompt", "instance_prompt"});
  bad(R"("instance_prompt": ["a", "b"])", {"'ds'", "instance_prompt", "one string"});
  bad(R"("probability": -0.5)", {"'ds'", "probability", "-0.5", "0 or more"});
  bad(R"("repeats": -1)", {"'ds'", "repeats", "-1", "0 or more"});
  bad(R"("repeats": 1.5)", {"'ds'", "repeats", "1.5", "whole number"});
  // Numbers out of range are refused, not clamped: 1e18 repeats grew a 2.3 GB epoch list, a
  // resolution of 1e308 trained silently in a 16 x 16 bucket.
  bad(R"("repeats": 1e18)", {"'ds'", "repeats", "1e+18", "at most 1000000"});
  bad(R"("resolution": 1e308)", {"'ds'", "resolution", "1e+308", "at most 8192 pixels"});
  bad(R"("resolution": 8193, "resolution_type": "pixel_area")", {"'ds'", "resolution", "8193", "at most 8192 pixels"});
  bad(R"("resolution": 65, "resolution_type": "area")", {"'ds'", "resolution", "65", "at most 64 megapixels"});
  bad(R"("resolution": 0)", {"'ds'", "resolution", "0", "above 0"});
  bad(R"("resolution": 1000.5)", {"'ds'", "resolution", "1000.5", "whole number"});
  bad(R"("resolution": "1024")", {"'ds'", "resolution", "\"1024\"", "must be a number"});
  bad(R"("crop": "yes")", {"'ds'", "crop", "\"yes\"", "true or false"});
  bad(R"("minimum_image_size": -1)", {"'ds'", "minimum_image_size", "-1", "0 or more"});
  bad(R"("maximum_image_size": 2048)", {"'ds'", "maximum_image_size", "2048", "target_downsample_size"});
  bad(R"("resolution_type": "area", "resolution": 1.0, "minimum_image_size": 512)",
      {"'ds'", "minimum_image_size", "512", "5 megapixels"});
  bad(R"("resolution_type": "area", "resolution": 1.0, "maximum_image_size": 40, "target_downsample_size": 2)",
      {"'ds'", "maximum_image_size", "40", "20 megapixels"});
  bad(R"("dataset_type": "video")", {"'ds'", "dataset_type", "\"video\"", "supported: image, text_embeds, conditioning"});
}

// FLUX.1 Kontext's pairs as SimpleTuner's FLUX_KONTEXT.md configures them: the edit dataset names
// its reference dataset in conditioning_data (a string or a one-id list); a backend with a
// conditioning_type is a conditioning dataset whatever its dataset_type says (factory.py), and
// source_dataset_id links from the other side.
TEST_F(DatasetConfig, ConditioningDatasetsPairWithTheirImageDatasets) {
  const auto c = read(R"([
    {"id": "edits", "instance_data_dir": "/e", "conditioning_data": ["refs"], "caption_strategy": "textfile"},
    {"id": "refs", "instance_data_dir": "/r", "conditioning_type": "reference_strict", "caption_strategy": null,
     "resolution": 512, "resolution_type": "pixel"},
    {"id": "loose", "dataset_type": "conditioning", "instance_data_dir": "/l", "conditioning_type": "reference_loose",
     "source_dataset_id": "more"},
    {"id": "more", "instance_data_dir": "/m"}
  ])");
  ASSERT_EQ(c.images.size(), 2u);
  ASSERT_EQ(c.conditioning.size(), 2u);
  EXPECT_EQ(c.images[0].conditioning_data, std::vector<std::string>{"refs"});
  EXPECT_EQ(c.images[1].conditioning_data, std::vector<std::string>{"loose"});  // through source_dataset_id
  EXPECT_EQ(c.conditioning[0].conditioning_type, std::optional<std::string>(kReferenceStrict));
  EXPECT_EQ(c.conditioning[0].resolution, 512);
  EXPECT_EQ(c.conditioning[0].cache_dir_vae, "cache/vae/flux/refs");  // its own latents folder
  EXPECT_EQ(c.conditioning_of(c.images[0])->id, "refs");
  EXPECT_EQ(c.conditioning_of(c.images[1])->id, "loose");
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();
  EXPECT_EQ(read(R"([{"id": "e", "instance_data_dir": "/e", "conditioning_data": "r"},
                     {"id": "r", "instance_data_dir": "/r", "conditioning_type": "reference_loose"}])")
                .images[0].conditioning_data,
            std::vector<std::string>{"r"});
  // A reference set no image dataset names is said to be unused.
  const auto unused = read(R"([{"id": "e", "instance_data_dir": "/e"},
                               {"id": "r", "instance_data_dir": "/r", "conditioning_type": "reference_loose"}])");
  ASSERT_EQ(unused.warnings.size(), 1u);
  expect_mentions(unused.warnings[0], {"'r'", "not used"});
}

TEST_F(DatasetConfig, ConditioningErrorsNameTheBackendAndWhatRematTrains) {
  const std::string edit = R"({"id": "e", "instance_data_dir": "/e", "conditioning_data": ["r"]}, )";
  const auto bad = [&](const std::string& reference, std::initializer_list<const char*> fragments) {
    expect_mentions(error("[" + edit + reference + "]"), fragments);
  };
  bad(R"({"id": "r", "instance_data_dir": "/r", "conditioning_type": "controlnet"})",
      {"'r'", "conditioning_type", "\"controlnet\"", "ControlNet", "reference_strict, reference_loose"});
  bad(R"({"id": "r", "instance_data_dir": "/r", "conditioning_type": "mask"})", {"'r'", "mask", "not supported"});
  bad(R"({"id": "r", "instance_data_dir": "/r", "dataset_type": "conditioning"})",
      {"'r'", "conditioning_type", "reference_strict", "reference_loose"});
  bad(R"({"id": "r", "instance_data_dir": "/r", "conditioning_type": "reference_strict", "caption_strategy": "textfile"})",
      {"'r'", "caption_strategy", "edit picture's caption"});
  bad(R"({"id": "x", "instance_data_dir": "/r", "conditioning_type": "reference_strict"})",
      {"'e'", "conditioning_data", "'r'", "no enabled conditioning dataset", "x"});
  bad(R"({"id": "r", "instance_data_dir": "/r"})", {"'e'", "'r'", "an image dataset", "conditioning_type"});
  bad(R"({"id": "r", "instance_data_dir": "/r", "conditioning_type": "reference_strict", "cache_dir_vae": "/v"},
         {"id": "f", "instance_data_dir": "/f", "cache_dir_vae": "/v"})",
      {"cache_dir_vae", "\"/v\""});
  expect_mentions(error(R"([{"id": "e", "instance_data_dir": "/e", "conditioning_data": ["r", "s"]},
                            {"id": "r", "instance_data_dir": "/r", "conditioning_type": "reference_loose"},
                            {"id": "s", "instance_data_dir": "/s", "conditioning_type": "reference_loose"}])"),
                  {"'e'", "conditioning_data", "one conditioning dataset", "conditioning_multidataset_sampling"});
  expect_mentions(error(R"([{"id": "e", "instance_data_dir": "/e", "conditioning_data": 3},
                            {"id": "r", "instance_data_dir": "/r", "conditioning_type": "reference_loose"}])"),
                  {"'e'", "conditioning_data", "3", "id of a conditioning dataset"});
  // A strict reference takes the crops of one edit dataset.
  expect_mentions(error(R"([{"id": "e", "instance_data_dir": "/e", "conditioning_data": "r"},
                            {"id": "f", "instance_data_dir": "/f", "conditioning_data": "r"},
                            {"id": "r", "instance_data_dir": "/r", "conditioning_type": "reference_strict"}])"),
                  {"'r'", "reference_strict", "e, f", "reference_loose"});
  expect_mentions(error(R"([{"id": "e", "instance_data_dir": "/e"},
                            {"id": "r", "instance_data_dir": "/r", "conditioning_type": "reference_loose",
                             "source_dataset_id": "nope"}])"),
                  {"'r'", "source_dataset_id", "nope", "e"});
}

TEST_F(DatasetConfig, StructuralErrors) {
  expect_mentions(error(R"([{"instance_data_dir": "/d"}])"), {"#1", "id", "non-empty"});
  expect_mentions(error(R"([{"id": "a", "instance_data_dir": "/d"}, {"id": "a", "instance_data_dir": "/e"}])"),
                  {"'a'", "id", "another backend"});
  expect_mentions(error(R"([{"id": "a"}])"), {"'a'", "instance_data_dir", "null"});
  expect_mentions(error(R"([{"id": "a", "instance_data_dir": ""}])"), {"'a'", "instance_data_dir"});
  expect_mentions(error(R"([{"id": "t", "dataset_type": "text_embeds", "cache_dir": "/c"}])"),
                  {"no enabled image backend"});
  expect_mentions(error(R"({"id": "a"})"), {"JSON list of backends"});
  expect_mentions(error(R"([])"), {"JSON list of backends"});
  expect_mentions(error(R"([3])"), {"backend 1", "JSON object"});
  expect_mentions(error(R"([{"id": "a", "instance_data_dir": "/d",)"), {"valid JSON"});
  expect_mentions(error(R"([{"id": "a", "instance_data_dir": "/d", "probability": 0}])"), {"probability 0"});
  expect_mentions(error(R"([{"id": "a", "instance_data_dir": "/d", "cache_dir_vae": "/v"},
                            {"id": "b", "instance_data_dir": "/e", "cache_dir_vae": "/v"}])"),
                  {"'b'", "cache_dir_vae", "\"/v\"", "'a'"});
  expect_mentions(error(R"([{"id": "a", "instance_data_dir": "/d", "cache_dir_vae": "/v"},
                            {"id": "t", "dataset_type": "text_embeds", "cache_dir": "/v"}])"),
                  {"'t'", "cache_dir", "'a'"});
  // A missing file names the path.
  expect_mentions(testing::error_of([&] { read_data_backend_config(dir_ / "absent.json", {}); }), {"absent.json"});
}

TEST_F(DatasetConfig, OneWarningListsUnimplementedKeysOfEveryBackend) {
  const auto config = read(R"([
    {"id": "a", "instance_data_dir": "/d", "minimum_aspect_ratio": 0.5, "caption_shuffle": {"enable": true}},
    {"id": "b", "instance_data_dir": "/e", "is_regularisation_data": true},
    {"id": "t", "dataset_type": "text_embeds", "cache_dir": "/c", "write_batch_size": 64}])");
  ASSERT_EQ(config.warnings.size(), 1u);
  expect_mentions(config.warnings[0], {"backend 'a': caption_shuffle, minimum_aspect_ratio",
                                       "backend 'b': is_regularisation_data", "backend 't': write_batch_size"});
}

TEST_F(DatasetConfig, PixelAreaAcceptsWholeFloatsAndClosestBuckets) {
  const auto config = read(R"([{"id": "a", "instance_data_dir": "/d", "resolution": 512.0, "crop": true,
                                "crop_aspect": "closest", "crop_aspect_buckets": [1, 0.75, 1.5],
                                "crop_style": "centre"}])");
  EXPECT_EQ(config.images[0].resolution, 512);
  EXPECT_EQ(config.images[0].crop_aspect_buckets, (std::vector<double>{1.0, 0.75, 1.5}));
  EXPECT_EQ(config.images[0].crop_style, CropStyle::center);  // SimpleTuner's British spelling
}

TEST(SingleFolderConfig, OneBackendWithTheGlobalDefaults) {
  DataDefaults d;
  d.model_family = "flux";
  d.cache_dir = "out/cache";
  d.caption_strategy = CaptionStrategy::instanceprompt;
  d.instance_prompt = "sks";
  const auto config = single_folder_config("/pictures/", d);
  ASSERT_EQ(config.images.size(), 1u);
  EXPECT_EQ(config.images[0].id, "instance_data_dir");
  EXPECT_EQ(config.images[0].instance_data_dir, "/pictures");
  EXPECT_EQ(config.images[0].caption_strategy, CaptionStrategy::instanceprompt);
  EXPECT_EQ(config.images[0].cache_dir_vae, "out/cache/vae/flux/instance_data_dir");
  EXPECT_EQ(config.images[0].text_embeds, "text-embeds");
  EXPECT_EQ(config.text_embeds_of("text-embeds").cache_dir, "out/cache/text/flux");
  // The global values are checked by the same rules as a backend's.
  d.instance_prompt.reset();
  expect_mentions(testing::error_of([&] { single_folder_config("/pictures", d); }),
                  {"--instance_data_dir", "caption_strategy", "instance_prompt"});
}

TEST(DataNames, ToString) {
  EXPECT_STREQ(to_string(ResolutionType::pixel_area), "pixel_area");
  EXPECT_STREQ(to_string(ResolutionType::area), "area");
  EXPECT_STREQ(to_string(ResolutionType::pixel), "pixel");
  EXPECT_STREQ(to_string(CaptionStrategy::instanceprompt), "instanceprompt");
  EXPECT_STREQ(to_string(CaptionStrategy::textfile), "textfile");
  EXPECT_STREQ(to_string(CaptionStrategy::filename), "filename");
  EXPECT_STREQ(to_string(CropStyle::center), "center");
  EXPECT_STREQ(to_string(CropStyle::random), "random");
  EXPECT_STREQ(to_string(CropStyle::corner), "corner");
  EXPECT_STREQ(to_string(CropAspect::closest), "closest");
  EXPECT_STREQ(to_string(CropAspect::square), "square");
  EXPECT_STREQ(to_string(CropAspect::preserve), "preserve");
}

}  // namespace dataset_config_test
}  // namespace
}  // namespace remat::data
