// The caching phase (remat/data/caches.h) on a tiny random-weight pipeline folder: reuse,
// invalidation, resume after an interrupted run, shares of several processes, bad pictures, and
// the cached tensors against the encoders run independently on the same crop.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cstdio>

#include <filesystem>
#include <fstream>
#include <memory>

#include "remat/image/png_file.h"
#include "remat/data/caches.h"
#include "remat/encoders/demo_pipeline.h"
#include "remat/encoders/flux_encoders.h"
#include "remat/image/image_file.h"
#include "remat/io/safetensors.h"
#include "remat/memory.h"
#include "temp_dir.h"

namespace remat::data {
namespace {
namespace cache_build_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

namespace fs = std::filesystem;
using remat::testing::TempDir;

// One tiny pipeline folder for the whole suite (writing it trains a SentencePiece model).
class CacheBuild : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pipeline_ = std::make_unique<TempDir>("cache_pipeline");
    encoders::DemoPipelineOptions options;
    options.dtype = "fp32";
    encoders::write_demo_pipeline(pipeline_->str(), options);
  }
  static void TearDownTestSuite() { pipeline_.reset(); }

  // A 48x32 picture with a pattern that depends on `shade`, and its record: resized to 24x16,
  // then the 16x16 box at (4, 0) (a bucket of 16x16).
  ImageRecord add_image(const std::string& relative, const std::string& caption, int shade) {
    const fs::path path = fs::path(images_.str()) / relative;
    fs::create_directories(path.parent_path());
    auto picture = (at::arange(48 * 32 * 3, at::kInt).view({32, 48, 3}) * (shade + 1) % 251).to(at::kByte);
    image::write_png(path.string(), picture);
    ImageRecord record;
    record.path = path.string();
    record.relative_path = relative;
    record.width = 48;
    record.height = 32;
    record.caption = caption;
    record.crop = TrainingCrop{24, 16, 4, 0, 16, 16};
    restat(record);
    return record;
  }

  // What a fresh scan would record about the file now.
  static void restat(ImageRecord& record) {
    record.file_size = static_cast<int64_t>(fs::file_size(record.path));
    record.mtime_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          fs::last_write_time(record.path).time_since_epoch())
                          .count();
  }

  CacheOptions options() const {
    CacheOptions o;
    o.pipeline_folder = pipeline_->str();
    o.encoders = encoders::flux_family_encoders();
    o.dtype = "fp32";
    o.tokenizer_max_length = 16;
    o.seed = 42;
    o.log = [](const std::string&) {};
    return o;
  }

  CacheReport run(const std::vector<ImageRecord>& images, const CacheShare& share = {}) {
    return run_in(caches_, images, share);
  }

  // The caching phase with its caches under `root` (vae/ and text/), `share` of the work.
  CacheReport run_in(const TempDir& root, const std::vector<ImageRecord>& images, const CacheShare& share = {}) {
    ScannedDataset d;
    d.config.id = "pictures";
    d.config.instance_data_dir = images_.str();
    d.config.cache_dir_vae = root / "vae";
    d.config.text_embeds = "text";
    d.images = images;
    DataBackendConfig backends;
    backends.text_embeds.push_back({"text", root / "text", true});
    CacheOptions o = options();
    o.share = share;
    return build_caches({d}, backends, o);
  }

  static std::unique_ptr<TempDir> pipeline_;
  TempDir images_{"cache_images"};
  TempDir caches_{"cache_dirs"};
};

std::unique_ptr<TempDir> CacheBuild::pipeline_;

std::string contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(CacheSeeds, LatentSampleSeedIsFnv1a128OfSeedAndPath) {
  // First 64 bits of FNV-1a 128 over "<seed>\0<path>", computed with an independent
  // implementation (Python big integers).
  EXPECT_EQ(latent_sample_seed(0, "a"), 0xa68c8d98fb8b5822ull);
  EXPECT_EQ(latent_sample_seed(42, "cats/tabby.png"), 0x1f9a411d2458898full);
}

TEST_F(CacheBuild, SecondRunEncodesNothing) {
  const std::vector<ImageRecord> images = {add_image("a.png", "a red square", 1),
                                           add_image("sub/b.png", "a blue circle", 2),
                                           add_image("c.png", "a red square", 3)};
  const auto global_before = at::detail::getDefaultCPUGenerator().get_state();
  const auto first = run(images);
  // Loading the encoders drew from the global generator; the caching phase restored it.
  EXPECT_TRUE(at::equal(at::detail::getDefaultCPUGenerator().get_state(), global_before));
  EXPECT_EQ(first.images_encoded, 3);
  EXPECT_EQ(first.images_reused, 0);
  EXPECT_EQ(first.captions_encoded, 3);  // two distinct captions and the empty one
  EXPECT_GT(first.vae_peak_bytes, 0);
  EXPECT_GT(first.text_peak_bytes, 0);
  {
    // One encoder at a time: the phases' peaks stay below the peak of the same work with all
    // three encoders loaded together (what the caching phase avoids).
    memory::PeakScope together;
    encoders::FluxEncodersOptions all;
    all.dtype = at::kFloat;
    all.max_sequence_length = 16;
    const auto folder = encoders::PipelineFolder::open(pipeline_->str(), encoders::flux_encoder_components(all));
    auto flux = encoders::FluxEncoders::load(folder, all);
    const auto picture = image::crop_picture(image::resize_picture(image::read_image(images[0].path), 24, 16), 4, 0, 16, 16);
    flux.encode_image(image::picture_to_vae_input(picture), c10::nullopt);
    flux.encode_prompt("a red square");
    EXPECT_LT(first.vae_peak_bytes, together.peak_delta());
    EXPECT_LT(first.text_peak_bytes, together.peak_delta());
    std::printf("[ figures  ] caching peaks: VAE phase %lld B, text phase %lld B; all encoders together %lld B\n",
                static_cast<long long>(first.vae_peak_bytes), static_cast<long long>(first.text_peak_bytes),
                static_cast<long long>(together.peak_delta()));
  }
  ASSERT_EQ(first.samples.size(), 1u);
  ASSERT_EQ(first.samples[0].size(), 3u);
  EXPECT_EQ(first.samples[0][1].latents_path, caches_ / "vae/sub/b.png.safetensors");
  EXPECT_EQ(first.samples[0][0].text_path, first.samples[0][2].text_path);  // one file per caption
  EXPECT_NE(first.samples[0][0].text_path, first.samples[0][1].text_path);
  EXPECT_TRUE(fs::is_regular_file(first.empty_caption_path));

  const auto second = run(images);
  EXPECT_EQ(second.images_encoded, 0);
  EXPECT_EQ(second.images_reused, 3);
  EXPECT_EQ(second.captions_encoded, 0);
  EXPECT_EQ(second.captions_reused, 3);
  EXPECT_EQ(second.vae_peak_bytes, 0);  // no encoder was loaded
  EXPECT_EQ(second.text_peak_bytes, 0);
}

TEST_F(CacheBuild, ATouchedImageOrAnEditedCaptionIsReencodedAlone) {
  std::vector<ImageRecord> images = {add_image("a.png", "one", 1), add_image("b.png", "two", 2),
                                     add_image("c.png", "three", 3)};
  const auto first = run(images);
  const std::string untouched = contents(first.samples[0][0].latents_path);

  // touch b.png: a new modification time, same pixels
  fs::last_write_time(images[1].path, fs::last_write_time(images[1].path) + std::chrono::seconds(5));
  restat(images[1]);
  auto report = run(images);
  EXPECT_EQ(report.images_encoded, 1);
  EXPECT_EQ(report.images_reused, 2);
  EXPECT_EQ(report.captions_encoded, 0);
  EXPECT_EQ(contents(first.samples[0][0].latents_path), untouched);
  const auto file = io::SafetensorsFile::open(report.samples[0][1].latents_path);
  EXPECT_EQ(file.metadata().at("remat.source_mtime_ns"), std::to_string(images[1].mtime_ns));

  // edit c's caption: exactly that caption is encoded
  images[2].caption = "three, edited";
  report = run(images);
  EXPECT_EQ(report.images_encoded, 0);
  EXPECT_EQ(report.captions_encoded, 1);
  EXPECT_EQ(report.captions_reused, 3);  // "one", "two", ""
  const auto text = io::SafetensorsFile::open(report.samples[0][2].text_path);
  EXPECT_EQ(text.metadata().at("remat.caption"), "three, edited");

  // a new crop (another bucket) is a new entry too
  images[0].crop = TrainingCrop{24, 16, 0, 0, 16, 16};
  EXPECT_EQ(run(images).images_encoded, 1);
}

TEST_F(CacheBuild, AnInterruptedRunResumesWhereItStopped) {
  const std::vector<ImageRecord> images = {add_image("a.png", "one", 1), add_image("b.png", "two", 2),
                                           add_image("c.png", "three", 3), add_image("d.png", "four", 4)};
  const auto first = run(images);
  // What a killed run leaves: entries not yet written, a save stopped before its rename (the
  // temporary file beside the entry), and never a half entry under the real name; a truncated
  // entry (a disk error) is treated the same.
  fs::remove(first.samples[0][0].latents_path);
  fs::remove(first.samples[0][3].text_path);
  const std::string leftover = caches_ / "vae/.b.png.safetensors.tmp.Ab12Cd";
  std::ofstream(leftover) << "partial";
  const std::string truncated = first.samples[0][2].latents_path;
  fs::resize_file(truncated, fs::file_size(truncated) / 2);

  const auto resumed = run(images);
  EXPECT_EQ(resumed.images_encoded, 2);  // a (missing) and c (truncated)
  EXPECT_EQ(resumed.images_reused, 2);
  EXPECT_EQ(resumed.captions_encoded, 1);  // "four"
  EXPECT_FALSE(fs::exists(leftover));
  EXPECT_EQ(run(images).images_encoded, 0);
}

TEST_F(CacheBuild, CachedTensorsAreTheEncodersOutputsOnTheSameCrop) {
  const auto record = add_image("x.png", "a green triangle", 5);
  const auto report = run({record});

  // Independently: decode, resize, crop by slicing, encode with the documented generator seed.
  encoders::FluxEncodersOptions options;
  options.dtype = at::kFloat;
  options.max_sequence_length = 16;
  const auto folder = encoders::PipelineFolder::open(pipeline_->str(), encoders::flux_encoder_components(options));
  auto flux = encoders::FluxEncoders::load(folder, options);
  const auto resized = image::resize_picture(image::read_image(record.path), 24, 16);
  const auto crop = resized.slice(0, 0, 16).slice(1, 4, 20).contiguous();
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(latent_sample_seed(42, "x.png"));
  const auto expected = flux.encode_image(image::picture_to_vae_input(crop), generator);
  const auto cached = io::SafetensorsFile::open(report.samples[0][0].latents_path).tensor("latents");
  const int64_t f = flux.vae_scale_factor();
  EXPECT_EQ(cached.sizes(), (std::vector<int64_t>{16, 16 / f, 16 / f}));
  EXPECT_TRUE(at::equal(cached, expected));

  const auto embeddings = flux.encode_prompt("a green triangle");
  const auto text = io::SafetensorsFile::open(report.samples[0][0].text_path);
  EXPECT_TRUE(at::equal(text.tensor("prompt_embeds"), embeddings.prompt_embeds));
  EXPECT_TRUE(at::equal(text.tensor("pooled_prompt_embeds"), embeddings.pooled_prompt_embeds));
  const auto empty = flux.encode_prompt("");
  EXPECT_TRUE(at::equal(io::SafetensorsFile::open(report.empty_caption_path).tensor("prompt_embeds"),
                        empty.prompt_embeds));
}

// FLUX.1 Kontext: a reference picture's latents are cached like the edit's, in its conditioning
// dataset's folder, under its relative path, encoded from its own crop with its own posterior
// noise ("reference\0<path>"); the next run reuses both.
TEST_F(CacheBuild, ReferencePicturesAreCachedInTheirOwnFolder) {
  const auto edit = add_image("pair.png", "make it green", 3);
  ImageRecord reference = add_image("refs/pair.png", "", 9);
  reference.relative_path = "pair.png";  // pairs share their relative path
  reference.crop = TrainingCrop{48, 32, 16, 8, 16, 16};  // not resized; its own box
  ScannedDataset d;
  d.config.id = "edits";
  d.config.instance_data_dir = images_.str();
  d.config.cache_dir_vae = caches_ / "vae";
  d.config.text_embeds = "text";
  d.images = {edit};
  ImageDatasetConfig references;
  references.id = "refs";
  references.cache_dir_vae = caches_ / "refs";
  d.references = ReferenceSet{references, {reference}};
  DataBackendConfig backends;
  backends.text_embeds.push_back({"text", caches_ / "text", true});
  const auto report = build_caches({d}, backends, options());
  EXPECT_EQ(report.images_encoded, 2);
  ASSERT_EQ(report.samples[0].size(), 1u);
  const CachedSample& sample = report.samples[0][0];
  EXPECT_EQ(sample.conditioning_latents_path, (fs::path(caches_ / "refs") / "pair.png.safetensors").string());

  encoders::FluxEncodersOptions eo;
  eo.dtype = at::kFloat;
  eo.max_sequence_length = 16;
  const auto folder = encoders::PipelineFolder::open(pipeline_->str(), encoders::flux_encoder_components(eo));
  auto flux = encoders::FluxEncoders::load(folder, eo);
  const auto crop = image::read_image(reference.path).slice(0, 8, 24).slice(1, 16, 32).contiguous();
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(latent_sample_seed(42, std::string("reference") + '\0' + "pair.png"));
  const auto expected = flux.encode_image(image::picture_to_vae_input(crop), generator);
  EXPECT_TRUE(at::equal(io::SafetensorsFile::open(sample.conditioning_latents_path).tensor("latents"), expected));

  const auto again = build_caches({d}, backends, options());
  EXPECT_EQ(again.images_encoded, 0);
  EXPECT_EQ(again.images_reused, 2);
  EXPECT_EQ(again.samples[0][0].conditioning_latents_path, sample.conditioning_latents_path);
}

// Several processes: each encodes a disjoint share, together everything once, and what they
// wrote is what one process writes (each latent's noise is keyed by its path, not by the order).
TEST_F(CacheBuild, SharesAreDisjointAndTogetherEqualOneProcess) {
  const std::vector<ImageRecord> images = {
      add_image("a.png", "a red square", 1),   add_image("b.png", "a blue circle", 2),
      add_image("c.png", "a red square", 3),   add_image("d.png", "a green triangle", 4),
      add_image("e.png", "a white star", 5),   add_image("sub/f.png", "a blue circle", 6)};
  const auto share0 = run(images, {0, 2});
  const auto share1 = run(images, {1, 2});
  std::printf("[ figures  ] share 0 encoded %lld images, %lld captions; share 1 %lld, %lld\n",
              static_cast<long long>(share0.images_encoded), static_cast<long long>(share0.captions_encoded),
              static_cast<long long>(share1.images_encoded), static_cast<long long>(share1.captions_encoded));
  EXPECT_GT(share0.images_encoded, 0);
  EXPECT_GT(share1.images_encoded, 0);
  EXPECT_EQ(share0.images_encoded + share1.images_encoded, 6);  // disjoint: nothing encoded twice
  // Run one after the other here, the second finds the first's entries current.
  EXPECT_EQ(share0.images_reused, 0);
  EXPECT_EQ(share1.images_reused, share0.images_encoded);
  EXPECT_EQ(share0.captions_encoded + share1.captions_encoded, 5);  // four captions and the empty one
  // The unshared pass after them (what every rank runs after the barrier) finds all current.
  const auto after = run(images);
  EXPECT_EQ(after.images_encoded, 0);
  EXPECT_EQ(after.images_reused, 6);
  EXPECT_EQ(after.captions_encoded, 0);
  EXPECT_EQ(after.captions_reused, 5);

  // A share does not depend on where the caches live (machines may mount them at other paths);
  // where the other shares are missing (caches local to a machine), the unshared pass encodes them.
  const TempDir elsewhere("cache_share_elsewhere");
  const auto share0_elsewhere = run_in(elsewhere, images, {0, 2});
  EXPECT_EQ(share0_elsewhere.images_encoded, share0.images_encoded);
  EXPECT_EQ(share0_elsewhere.captions_encoded, share0.captions_encoded);
  const auto rest_elsewhere = run_in(elsewhere, images);
  EXPECT_EQ(rest_elsewhere.images_encoded, 6 - share0.images_encoded);
  EXPECT_EQ(rest_elsewhere.captions_encoded, 5 - share0.captions_encoded);

  // One process: the same tensors.
  const TempDir alone("cache_one_process");
  const auto reference = run_in(alone, images);
  EXPECT_EQ(reference.images_encoded, 6);
  ASSERT_EQ(after.samples[0].size(), 6u);
  ASSERT_EQ(reference.samples[0].size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    const auto& shared = after.samples[0][i];
    const auto& single = reference.samples[0][i];
    EXPECT_TRUE(at::equal(io::SafetensorsFile::open(shared.latents_path).tensor("latents"),
                          io::SafetensorsFile::open(single.latents_path).tensor("latents")))
        << images[i].relative_path;
    EXPECT_TRUE(at::equal(io::SafetensorsFile::open(shared.text_path).tensor("prompt_embeds"),
                          io::SafetensorsFile::open(single.text_path).tensor("prompt_embeds")))
        << images[i].caption;
  }

  try {
    run(images, {2, 2});
    ADD_FAILURE() << "share 2 of 2 was accepted";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("a share's index must be in [0, count), got 2 of 2"), std::string::npos)
        << e.what();
  }
}

// While several processes cache, a temporary in a cache directory may be another process's write
// in progress: a share never removes one, even when asked to; a process caching alone does.
TEST_F(CacheBuild, ASharedCallLeavesOtherProcessesWritesInProgress) {
  const std::vector<ImageRecord> images = {add_image("a.png", "one", 1), add_image("b.png", "two", 2)};
  run(images);  // the directories exist
  const std::string latents_in_progress = caches_ / "vae/.c.png.safetensors.tmp.Xy12Zw";
  const std::string text_in_progress = caches_ / "text/.0123456789abcdef.safetensors.tmp.Qr34St";
  std::ofstream(latents_in_progress) << "being written";
  std::ofstream(text_in_progress) << "being written";
  run(images, {0, 2, /*remove_interrupted_writes=*/true});
  run(images, {1, 2});
  EXPECT_TRUE(fs::exists(latents_in_progress));
  EXPECT_TRUE(fs::exists(text_in_progress));
  run(images, {0, 1, /*remove_interrupted_writes=*/false});  // the trainer's other ranks, after rank 0
  EXPECT_TRUE(fs::exists(latents_in_progress));
  EXPECT_TRUE(fs::exists(text_in_progress));
  run(images);  // alone: what an interrupted run left is removed
  EXPECT_FALSE(fs::exists(latents_in_progress));
  EXPECT_FALSE(fs::exists(text_in_progress));
}

TEST_F(CacheBuild, APictureThatCannotBeDecodedIsReportedNotFatal) {
  auto good = add_image("good.png", "fine", 1);
  auto bad = add_image("bad.png", "broken", 2);
  fs::resize_file(bad.path, 0);  // emptied after the scan
  restat(bad);
  const auto report = run({good, bad});
  EXPECT_EQ(report.images_encoded, 1);
  EXPECT_EQ(report.images_failed, 1);
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_NE(report.problems[0].find("bad.png"), std::string::npos) << report.problems[0];
  ASSERT_EQ(report.samples[0].size(), 1u);
  EXPECT_EQ(report.samples[0][0].latents_path, caches_ / "vae/good.png.safetensors");
  EXPECT_FALSE(fs::exists(caches_ / "vae/bad.png.safetensors"));
}

}  // namespace cache_build_test
}  // namespace
}  // namespace remat::data
