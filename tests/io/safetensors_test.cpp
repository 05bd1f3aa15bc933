// Tests of remat::io safetensors reading, writing and module loading. On-disk layouts are built
// and parsed by hand here (independently of the writer and the reader).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <random>

#include <nlohmann/json.hpp>

#include "remat/io/safetensors.h"
#include "temp_dir.h"
#include "remat/memory.h"
#include "test_paths.h"

using remat::io::LoadOptions;
using remat::io::SafetensorsFile;

namespace {
namespace safetensors_test {  // per file: the suites compile in unity batches (tests/CMakeLists.txt)

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override { torch::manual_seed(0); }
  std::string path(const std::string& name) const { return dir_ / name; }

  std::vector<std::string> dir_entries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_.path())) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

  remat::testing::TempDir dir_{"remat_io"};
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string u64_le(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

// A safetensors file assembled by hand: length, header text, data.
std::string raw_file(const std::string& header, const std::string& data) {
  return u64_le(header.size()) + header + data;
}

std::string tensor_bytes(const at::Tensor& t) {
  auto c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

// Runs `fn`, expects a c10::Error whose message contains every one of `needles`.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
  } catch (const c10::Error& e) {
    const std::string msg = e.what();
    for (const auto& needle : needles) {
      EXPECT_NE(msg.find(needle), std::string::npos) << "message lacks '" << needle << "':\n" << msg;
    }
    return;
  }
  ADD_FAILURE() << "expected an error";
}

// A file of tests/data/regressions (inputs that once crashed or misread; fuzzing seeds too).
std::string regression(const std::string& name) {
  return remat::testing::source_dir() + "/tests/data/regressions/" + name;
}

std::vector<remat::io::NamedTensor> every_dtype() {
  return {
      {"f64", torch::randn({3, 2}, torch::kDouble)},
      {"f32", torch::randn({4, 5})},
      {"f16", torch::randn({7}).to(torch::kHalf)},
      {"bf16", torch::randn({2, 3, 2}).to(torch::kBFloat16)},
      {"i64", torch::randint(-(int64_t{1} << 40), int64_t{1} << 40, {5}, torch::kLong)},
      {"i32", torch::randint(-(1 << 30), 1 << 30, {2, 2}, torch::kInt)},
      {"i16", torch::randint(-30000, 30000, {3}, torch::kShort)},
      {"i8", torch::randint(-128, 128, {9}, torch::kChar)},
      {"u8", torch::randint(0, 256, {3, 3}, torch::kByte)},
      {"bool", torch::randint(0, 2, {5}).to(torch::kBool)},
      {"scalar", torch::tensor(3.5)},
      {"empty", torch::zeros({0, 3})},
      {"transposed", torch::randn({3, 4}).t()},  // non-contiguous
  };
}

TEST_F(SafetensorsTest, RoundTripIsBitExactForEveryDtype) {
  const auto entries = every_dtype();
  remat::io::save_safetensors(path("a.safetensors"), entries);
  const auto file = SafetensorsFile::open(path("a.safetensors"));
  ASSERT_EQ(file.names().size(), entries.size());
  for (const auto& [name, original] : entries) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(file.contains(name));
    EXPECT_EQ(file.info(name).dtype, original.scalar_type());
    EXPECT_EQ(file.info(name).shape, original.sizes().vec());
    const auto copy = file.tensor(name);
    const auto view = file.view(name);
    EXPECT_TRUE(torch::equal(copy, original));
    EXPECT_TRUE(torch::equal(view, original));
    EXPECT_EQ(tensor_bytes(copy), tensor_bytes(original));
  }
}

TEST_F(SafetensorsTest, MetadataRoundTrips) {
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"empty", ""}, {"unicode", "caf\xc3\xa9 \"quoted\"\n"}};
  remat::io::save_safetensors(path("m.safetensors"), {{"x", torch::ones({2})}}, meta);
  EXPECT_EQ(SafetensorsFile::open(path("m.safetensors")).metadata(), meta);

  remat::io::save_safetensors(path("n.safetensors"), {{"x", torch::ones({2})}});
  EXPECT_TRUE(SafetensorsFile::open(path("n.safetensors")).metadata().empty());
}

TEST_F(SafetensorsTest, ReadsAHandBuiltFile) {
  const float a[4] = {1.5f, -2.0f, 3.25f, 1e-3f};
  const int16_t b[3] = {-7, 0, 32000};
  std::string data(reinterpret_cast<const char*>(a), sizeof(a));
  data.append(reinterpret_cast<const char*>(b), sizeof(b));
  // Names deliberately not sorted, metadata last: names() must keep the header's order.
  const std::string header =
      R"({"b":{"dtype":"I16","shape":[3],"data_offsets":[16,22]},)"
      R"("a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
      R"("__metadata__":{"format":"pt"}}  )";
  write_bytes(path("h.safetensors"), raw_file(header, data));

  const auto file = SafetensorsFile::open(path("h.safetensors"));
  EXPECT_EQ(file.names(), (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.data_size(), 22u);
  EXPECT_EQ(file.info("b").begin, 16u);
  EXPECT_EQ(file.info("b").end, 22u);
  EXPECT_TRUE(torch::equal(file.tensor("a"), torch::tensor({1.5f, -2.0f, 3.25f, 1e-3f}).view({2, 2})));
  EXPECT_TRUE(torch::equal(file.tensor("b"), torch::tensor({-7, 0, 32000}, torch::kShort)));
  EXPECT_TRUE(torch::equal(file.view("a"), file.tensor("a")));
}

TEST_F(SafetensorsTest, WriterLayoutMatchesTheFormat) {
  const auto z = torch::randn({3});
  const auto a = torch::randn({2, 1}).to(torch::kHalf);
  const auto m = torch::tensor({int64_t{5}, int64_t{-6}});
  const auto b = torch::randn({1});
  const auto flag = torch::tensor({true, false, true});
  remat::io::save_safetensors(path("l.safetensors"),
                              {{"z", z}, {"flag", flag}, {"a", a}, {"m", m}, {"b", b}},
                              {{"k", "v"}});

  const std::string bytes = read_bytes(path("l.safetensors"));
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(n % 8, 0u) << "header must be padded to a multiple of 8";
  ASSERT_LE(8 + n, bytes.size());
  const std::string header = bytes.substr(8, n);
  const auto json_end = header.find_last_of('}');
  ASSERT_NE(json_end, std::string::npos);
  EXPECT_EQ(header.substr(json_end + 1), std::string(n - json_end - 1, ' '))
      << "padding must be spaces";

  const auto json = nlohmann::ordered_json::parse(header);
  std::vector<std::string> keys;
  for (const auto& item : json.items()) keys.push_back(item.key());
  // __metadata__ first, then widest dtype first (I64, F32, F16, BOOL), by name within a dtype.
  EXPECT_EQ(keys, (std::vector<std::string>{"__metadata__", "m", "b", "z", "a", "flag"}));
  EXPECT_EQ(json["__metadata__"].dump(), R"({"k":"v"})");

  const std::map<std::string, at::Tensor> by_name = {
      {"m", m}, {"b", b}, {"z", z}, {"a", a}, {"flag", flag}};
  const std::map<std::string, std::string> dtypes = {
      {"m", "I64"}, {"b", "F32"}, {"z", "F32"}, {"a", "F16"}, {"flag", "BOOL"}};
  uint64_t expected_offset = 0;
  const std::string data = bytes.substr(8 + n);
  for (size_t i = 1; i < keys.size(); ++i) {
    const auto& key = keys[i];
    const auto& entry = json[key];
    const auto& t = by_name.at(key);
    EXPECT_EQ(entry["dtype"], dtypes.at(key)) << key;
    EXPECT_EQ(entry["shape"].get<std::vector<int64_t>>(), t.sizes().vec()) << key;
    const auto begin = entry["data_offsets"][0].get<uint64_t>();
    const auto end = entry["data_offsets"][1].get<uint64_t>();
    EXPECT_EQ(begin, expected_offset) << key << ": tensors must be packed without gaps";
    EXPECT_EQ(begin % t.element_size(), 0u) << key << " is misaligned";
    EXPECT_EQ(data.substr(begin, end - begin), tensor_bytes(t)) << key;
    expected_offset = end;
  }
  EXPECT_EQ(data.size(), expected_offset) << "no trailing bytes after the last tensor";

  // Input order does not change the bytes.
  remat::io::save_safetensors(path("l2.safetensors"),
                              {{"b", b}, {"a", a}, {"m", m}, {"z", z}, {"flag", flag}},
                              {{"k", "v"}});
  EXPECT_EQ(read_bytes(path("l2.safetensors")), bytes);
}

TEST_F(SafetensorsTest, ConvertingReadEqualsTensorTo) {
  const auto f32 = torch::randn({6, 5}) * 100;
  const auto f16 = torch::randn({8}).to(torch::kHalf);
  const auto bf16 = torch::randn({8}).to(torch::kBFloat16);
  const auto f64 = torch::randn({4}, torch::kDouble);
  const auto i32 = torch::randint(-1000, 1000, {4}, torch::kInt);
  remat::io::save_safetensors(path("c.safetensors"),
                              {{"f32", f32}, {"f16", f16}, {"bf16", bf16}, {"f64", f64}, {"i32", i32}});
  const auto file = SafetensorsFile::open(path("c.safetensors"));
  const std::map<std::string, at::Tensor> originals = {
      {"f32", f32}, {"f16", f16}, {"bf16", bf16}, {"f64", f64}, {"i32", i32}};
  for (const auto& [name, original] : originals) {
    for (auto target : {torch::kFloat, torch::kHalf, torch::kBFloat16, torch::kDouble}) {
      SCOPED_TRACE(name + " -> " + std::string(c10::toString(target)));
      const auto got = file.tensor(name, target);
      EXPECT_EQ(got.scalar_type(), target);
      EXPECT_TRUE(torch::equal(got, original.to(target)));
    }
  }
}

TEST_F(SafetensorsTest, ViewIsZeroCopyAndKeepsTheMappingAlive) {
  const auto original = torch::randn({16, 16});
  remat::io::save_safetensors(path("v.safetensors"), {{"w", original}});
  at::Tensor view;
  {
    const auto file = SafetensorsFile::open(path("v.safetensors"));
    view = file.view("w");
    // Two views share memory (no copy); a copying read does not.
    EXPECT_EQ(file.view("w").data_ptr(), view.data_ptr());
    EXPECT_NE(file.tensor("w").data_ptr(), view.data_ptr());
  }
  // The SafetensorsFile is gone and the file is deleted; the mapping lives on in the view.
  fs::remove(path("v.safetensors"));
  EXPECT_TRUE(torch::equal(view, original));
  EXPECT_EQ(view.sum().item<float>(), original.sum().item<float>());
}

TEST_F(SafetensorsTest, ViewAndModuleLoadDoNotCopyTheFile) {
  // Measured with the tracking CPU allocator installed by the test main: a view allocates no
  // tensor memory, a copying read allocates the tensor once, and loading a module goes straight
  // from the mapping into the parameters.
  ASSERT_TRUE(remat::memory::cpu_tracking_installed());
  torch::nn::Linear layer(1024, 1024);  // 4 MiB weight
  remat::io::save_module(path("big.safetensors"), *layer);
  const auto file = SafetensorsFile::open(path("big.safetensors"));
  const int64_t weight_bytes = 1024 * 1024 * 4;
  {
    remat::memory::PeakScope scope;
    const auto view = file.view("weight");
    EXPECT_LT(scope.peak_delta(), 64 * 1024);
  }
  {
    remat::memory::PeakScope scope;
    const auto copy = file.tensor("weight");
    EXPECT_GE(scope.peak_delta(), weight_bytes);
    EXPECT_LT(scope.peak_delta(), weight_bytes + 64 * 1024);
  }
  torch::nn::Linear target(1024, 1024);
  {
    remat::memory::PeakScope scope;
    EXPECT_TRUE(remat::io::load_state_dict_into(*target, file).ok());
    EXPECT_LT(scope.peak_delta(), 64 * 1024);
  }
  EXPECT_TRUE(torch::equal(target->weight, layer->weight));
}

TEST_F(SafetensorsTest, WritingIntoAViewLeavesTheFileUnchanged) {
  const auto original = torch::randn({4});
  remat::io::save_safetensors(path("w.safetensors"), {{"w", original}});
  const auto before = read_bytes(path("w.safetensors"));
  {
    auto view = SafetensorsFile::open(path("w.safetensors")).view("w");
    view.add_(1.0);
    EXPECT_TRUE(torch::equal(view, original + 1.0));
  }
  EXPECT_EQ(read_bytes(path("w.safetensors")), before);
}

TEST_F(SafetensorsTest, MisalignedTensorIsReadCorrectly) {
  // A file from a writer that does not align: F32 data at byte offset 1.
  const float values[2] = {0.5f, -4.0f};
  std::string data("\x07", 1);
  data.append(reinterpret_cast<const char*>(values), sizeof(values));
  write_bytes(path("m.safetensors"),
              raw_file(R"({"u":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                       R"("f":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}})",
                       data));
  const auto file = SafetensorsFile::open(path("m.safetensors"));
  EXPECT_TRUE(torch::equal(file.view("f"), torch::tensor({0.5f, -4.0f})));
  EXPECT_EQ(file.view("u").item<uint8_t>(), 7);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(file.view("f").data_ptr()) % 4, 0u);
}

TEST_F(SafetensorsTest, CorruptFilesGiveClearErrors) {
  const std::string four_floats(16, '\0');
  const auto check = [&](const std::string& name, const std::string& bytes,
                         std::initializer_list<std::string> needles) {
    SCOPED_TRACE(name);
    const auto p = path(name);
    write_bytes(p, bytes);
    std::vector<std::string> all(needles);
    all.push_back(p);
    expect_error([&] { SafetensorsFile::open(p); }, all);
  };
  check("empty", "", {"truncated", "0 bytes"});
  check("short", std::string(5, '\0'), {"truncated", "5 bytes"});
  check("long_header", u64_le(1000) + "{}", {"header length 1000", "past the end of the file"});
  check("not_json", raw_file("{not json", ""), {"not valid JSON"});
  check("not_object", raw_file("[1,2]", ""), {"must be a JSON object", "array"});
  check("entry_not_object", raw_file(R"({"w":3})", ""), {"tensor 'w'", "must be an object"});
  check("missing_offsets", raw_file(R"({"w":{"dtype":"F32","shape":[4]}})", four_floats),
        {"tensor 'w'", "missing the field \"data_offsets\""});
  check("missing_dtype", raw_file(R"({"w":{"shape":[4],"data_offsets":[0,16]}})", four_floats),
        {"tensor 'w'", "missing the field \"dtype\""});
  check("past_buffer",
        raw_file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", four_floats),
        {"tensor 'w'", "[8,24]", "past the end of the data buffer (16 bytes)"});
  check("size_mismatch",
        raw_file(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", four_floats),
        {"tensor 'w'", "span 12 bytes", "needs 16 bytes"});
  check("begin_after_end",
        raw_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", four_floats),
        {"tensor 'w'", "begin 8 > end 4"});
  check("unknown_dtype",
        raw_file(R"({"w":{"dtype":"F7","shape":[4],"data_offsets":[0,16]}})", four_floats),
        {"tensor 'w'", "dtype \"F7\"", "BOOL, U8, I8, I16, F16, BF16, I32, F32, F64, I64"});
  check("negative_shape",
        raw_file(R"({"w":{"dtype":"F32","shape":[-2,2],"data_offsets":[0,16]}})", four_floats),
        {"tensor 'w'", ">= 0, got -2"});
  check("negative_offset",
        raw_file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[-1,16]}})", four_floats),
        {"tensor 'w'", "data_offsets must be [begin, end]"});
  check("bad_metadata", raw_file(R"({"__metadata__":{"k":1}})", ""),
        {"__metadata__ value of 'k' must be a string"});

  expect_error([&] { SafetensorsFile::open(path("does_not_exist.safetensors")); },
               {path("does_not_exist.safetensors"), "No such file or directory"});
  expect_error([&] { SafetensorsFile::open(dir_.str()); }, {"not a regular file"});

  remat::io::save_safetensors(path("ok.safetensors"), {{"w", torch::ones({1})}});
  expect_error([&] { SafetensorsFile::open(path("ok.safetensors")).info("nope"); },
               {"no tensor named 'nope'", path("ok.safetensors")});
}

// Note [Exact data section]: each of these files opened before (the first read every float one
// byte early, so `remat forward` wrote all-NaN output with exit 0).
TEST_F(SafetensorsTest, HeaderMustDescribeExactlyTheDataSection) {
  const auto check = [](const std::string& file, std::initializer_list<std::string> needles) {
    SCOPED_TRACE(file);
    std::vector<std::string> all(needles);
    all.push_back(file);
    expect_error([&] { SafetensorsFile::open(regression(file)); }, all);
  };
  check("safetensors_header_one_byte_short.safetensors",
        {"the tensors cover 8 bytes but the data section has 9 bytes", "the header length is wrong"});
  check("safetensors_trailing_bytes.safetensors", {"the tensors cover 8 bytes but the data section has 12 bytes"});
  check("safetensors_overlapping_offsets.safetensors", {"tensor 'b'", "[4,12]", "covered up to byte 8", "overlap"});
  check("safetensors_aliased_offsets.safetensors", {"[0,8]", "covered up to byte 8", "overlap"});
  check("safetensors_gap_before_tensor.safetensors", {"tensor 'w'", "[4,8]", "covered up to byte 0", "gap"});

  // Empty tensors at a boundary tile like any other; a file without tensors has no data section.
  const std::string eight(8, '\0');
  write_bytes(path("empty_ok.safetensors"),
              raw_file(R"({"e":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},)"
                       R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                       eight));
  EXPECT_EQ(SafetensorsFile::open(path("empty_ok.safetensors")).names().size(), 2u);
  write_bytes(path("no_tensors.safetensors"), raw_file("{}", "x"));
  expect_error([&] { SafetensorsFile::open(path("no_tensors.safetensors")); },
               {"the tensors cover 0 bytes but the data section has 1 bytes"});
}

// Note [Bounded JSON]: 100k levels in __metadata__ or in a shape once overflowed the stack (the
// error message dumped the value recursively); now the depth is refused before parsing, and
// values that parse are quoted as bounded excerpts.
TEST_F(SafetensorsTest, DeeplyNestedHeaderIsRefusedBeforeParsing) {
  const auto nested = [](size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  write_bytes(path("deep_meta.safetensors"), raw_file(R"({"__metadata__":{"k":)" + nested(100000) + "}}", ""));
  expect_error([&] { SafetensorsFile::open(path("deep_meta.safetensors")); },
               {"header nests arrays and objects deeper than 64 levels"});
  write_bytes(path("deep_shape.safetensors"),
              raw_file(R"({"w":{"dtype":"F32","shape":)" + nested(100000) + R"(,"data_offsets":[0,0]}})", ""));
  expect_error([&] { SafetensorsFile::open(path("deep_shape.safetensors")); }, {"deeper than 64 levels"});
  write_bytes(path("meta_60.safetensors"), raw_file(R"({"__metadata__":{"k":)" + nested(60) + "}}", ""));
  expect_error([&] { SafetensorsFile::open(path("meta_60.safetensors")); },
               {"__metadata__ value of 'k' must be a string, got [[[[[...]]]]]"});
}

TEST_F(SafetensorsTest, FifoIsRefusedWithoutBlocking) {
  // open(2) of a FIFO without a writer blocked forever; `remat forward --weights FIFO` hung.
  ASSERT_EQ(::mkfifo(path("pipe.safetensors").c_str(), 0600), 0);
  expect_error([&] { SafetensorsFile::open(path("pipe.safetensors")); }, {"not a regular file"});
}

TEST_F(SafetensorsTest, FailedSaveLeavesTheOldFileAndNoTemporary) {
  const auto p = path("ckpt.safetensors");
  remat::io::save_safetensors(p, {{"w", torch::randn({3})}});
  const auto before = read_bytes(p);

  // Rejected before any file is created.
  expect_error([&] { remat::io::save_safetensors(p, {{"w", torch::randn({2}, torch::kComplexFloat)}}); },
               {p, "tensor 'w'", "ComplexFloat", "supported dtypes"});
  expect_error([&] { remat::io::save_safetensors(p, {{"a", torch::ones({1})}, {"a", torch::ones({1})}}); },
               {"'a' appears twice"});
  expect_error([&] { remat::io::save_safetensors(p, {{"__metadata__", torch::ones({1})}}); },
               {"__metadata__"});
  // Fails in the middle of writing: the I64 tensor is written first, then copying the meta
  // tensor (which has no data) to CPU throws.
  EXPECT_ANY_THROW(remat::io::save_safetensors(
      p, {{"first", torch::ones({64}, torch::kLong)},
          {"meta", torch::empty({4}, torch::TensorOptions().device(torch::kMeta))}}));
  EXPECT_EQ(read_bytes(p), before);
  EXPECT_EQ(dir_entries(), std::vector<std::string>{"ckpt.safetensors"});

  // The directory cannot hold a temporary file.
  expect_error([&] { remat::io::save_safetensors(path("missing_dir/x.safetensors"), {{"w", torch::ones({1})}}); },
               {"cannot create a temporary file", "No such file or directory"});
  expect_error([&] { remat::io::save_safetensors(path("ckpt.safetensors/x.safetensors"), {{"w", torch::ones({1})}}); },
               {"cannot create a temporary file", "Not a directory"});
  EXPECT_EQ(read_bytes(p), before);
  EXPECT_EQ(dir_entries(), std::vector<std::string>{"ckpt.safetensors"});

  // A successful save replaces the file and leaves nothing else.
  const auto replacement = torch::randn({5});
  remat::io::save_safetensors(p, {{"w", replacement}});
  EXPECT_TRUE(torch::equal(SafetensorsFile::open(p).tensor("w"), replacement));
  EXPECT_EQ(dir_entries(), std::vector<std::string>{"ckpt.safetensors"});
}

// fc.weight (4, 3), fc.bias (4), scale (2) buffer, head.weight (2, 4).
struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc = register_module("fc", torch::nn::Linear(3, 4));
    head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(4, 2).bias(false)));
    scale = register_buffer("scale", torch::ones({2}));
  }
  torch::nn::Linear fc{nullptr}, head{nullptr};
  at::Tensor scale;
};
TORCH_MODULE(Net);

std::map<std::string, at::Tensor> snapshot(const torch::nn::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [k, v] : remat::io::module_state(m)) out[k] = v.clone();
  return out;
}

TEST_F(SafetensorsTest, LoadsAModuleConvertingDtypes) {
  Net source;
  remat::io::save_module(path("net.safetensors"), *source);
  // Rewrite every tensor as BF16/F64 to check conversion to the parameters' F32.
  const auto file = SafetensorsFile::open(path("net.safetensors"));
  std::vector<remat::io::NamedTensor> mixed;
  for (const auto& name : file.names()) {
    mixed.emplace_back(name, file.tensor(name, name == "fc.weight" ? torch::kBFloat16 : torch::kDouble));
  }
  remat::io::save_safetensors(path("mixed.safetensors"), mixed);

  Net target;
  const auto report = remat::io::load_state_dict_into(*target, path("mixed.safetensors"));
  EXPECT_TRUE(report.ok());
  EXPECT_EQ(report.loaded, (std::vector<std::string>{"fc.bias", "fc.weight", "head.weight", "scale"}));
  for (const auto& [name, tensor] : mixed) {
    const auto state = snapshot(*target);
    EXPECT_EQ(state.at(name).scalar_type(), torch::kFloat) << name;
    EXPECT_TRUE(torch::equal(state.at(name), tensor.to(torch::kFloat))) << name;
  }
  EXPECT_TRUE(target->fc->weight.requires_grad());
}

TEST_F(SafetensorsTest, StrictLoadListsEveryProblemAndChangesNothing) {
  remat::io::save_safetensors(path("bad.safetensors"),
                              {{"fc.weight", torch::randn({3, 4})},  // transposed shape
                               {"head.weight", torch::randn({2, 4})},
                               {"extra.one", torch::randn({1})},
                               {"extra.two", torch::randn({1})}});
  Net net;
  const auto before = snapshot(*net);
  expect_error([&] { remat::io::load_state_dict_into(*net, path("bad.safetensors")); },
               {path("bad.safetensors"), "2 missing, 2 unexpected, 1 shape-mismatched",
                "missing key (in the module, not in the file): fc.bias",
                "missing key (in the module, not in the file): scale",
                "unexpected key (in the file, not in the module): extra.one",
                "unexpected key (in the file, not in the module): extra.two",
                "shape mismatch for fc.weight: file [3, 4], module [4, 3]"});
  for (const auto& [name, tensor] : snapshot(*net)) {
    EXPECT_TRUE(torch::equal(tensor, before.at(name))) << name << " changed by a failed load";
  }

  // Non-strict: the matching key is loaded, the problems are reported.
  LoadOptions lenient;
  lenient.strict = false;
  const auto report = remat::io::load_state_dict_into(*net, path("bad.safetensors"), lenient);
  EXPECT_FALSE(report.ok());
  EXPECT_EQ(report.loaded, std::vector<std::string>{"head.weight"});
  EXPECT_EQ(report.missing, (std::vector<std::string>{"fc.bias", "scale"}));
  EXPECT_EQ(report.unexpected, (std::vector<std::string>{"extra.one", "extra.two"}));
  ASSERT_EQ(report.mismatched.size(), 1u);
  EXPECT_EQ(report.mismatched[0].key, "fc.weight");
  EXPECT_EQ(report.mismatched[0].file_shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(report.mismatched[0].module_shape, (std::vector<int64_t>{4, 3}));
  EXPECT_TRUE(torch::equal(net->head->weight,
                           SafetensorsFile::open(path("bad.safetensors")).tensor("head.weight")));
  EXPECT_TRUE(torch::equal(net->fc->weight, before.at("fc.weight")));
}

TEST_F(SafetensorsTest, PrefixesFiltersAndShards) {
  Net source;
  std::vector<remat::io::NamedTensor> prefixed;
  for (const auto& [name, t] : remat::io::module_state(*source)) prefixed.emplace_back("transformer." + name, t);
  prefixed.emplace_back("vae.decoder.weight", torch::randn({2}));
  remat::io::save_safetensors(path("pipe.safetensors"), prefixed);

  // Without the filter the VAE key is unexpected (it lacks the prefix).
  LoadOptions strip;
  strip.strip_prefix = "transformer.";
  Net a;
  expect_error([&] { remat::io::load_state_dict_into(*a, path("pipe.safetensors"), strip); },
               {"unexpected key (in the file, not in the module): vae.decoder.weight"});
  strip.key_filter = [](const std::string& key) { return key.rfind("vae.", 0) != 0; };
  const auto report = remat::io::load_state_dict_into(*a, path("pipe.safetensors"), strip);
  EXPECT_TRUE(report.ok());
  EXPECT_EQ(report.skipped, std::vector<std::string>{"vae.decoder.weight"});
  EXPECT_TRUE(torch::equal(a->fc->weight, source->fc->weight));
  EXPECT_TRUE(torch::equal(a->scale, source->scale));

  // add_prefix: a file holding only the Linear's own keys loads into "fc.".
  remat::io::save_safetensors(path("fc.safetensors"),
                              {{"weight", torch::randn({4, 3})}, {"bias", torch::randn({4})}});
  LoadOptions add;
  add.add_prefix = "fc.";
  add.strict = false;
  Net b;
  const auto added = remat::io::load_state_dict_into(*b, path("fc.safetensors"), add);
  EXPECT_EQ(added.loaded, (std::vector<std::string>{"fc.bias", "fc.weight"}));
  EXPECT_EQ(added.missing, (std::vector<std::string>{"head.weight", "scale"}));
  EXPECT_TRUE(torch::equal(b->fc->bias, SafetensorsFile::open(path("fc.safetensors")).tensor("bias")));

  // Shards: two files together give every key; the same key in two files is an error.
  auto state = remat::io::module_state(*source);
  remat::io::save_safetensors(path("s1.safetensors"), {state[0], state[1]});
  remat::io::save_safetensors(path("s2.safetensors"), {state[2], state[3]});
  Net c;
  const std::vector<SafetensorsFile> shards = {SafetensorsFile::open(path("s1.safetensors")),
                                               SafetensorsFile::open(path("s2.safetensors"))};
  EXPECT_TRUE(remat::io::load_state_dict_into(*c, shards).ok());
  EXPECT_TRUE(torch::equal(c->head->weight, source->head->weight));
  expect_error([&] {
    remat::io::load_state_dict_into(*c, {shards[0], SafetensorsFile::open(path("s1.safetensors"))});
  }, {"provided by both"});
}

}  // namespace safetensors_test
}  // namespace
