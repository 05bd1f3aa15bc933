// Safetensors dtypes and the memory-mapped reader. The writer is in safetensors_save.cpp and the
// module loading in state_dict.cpp.
#include "remat/io/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "remat/util/error.h"
#include "remat/util/bounded_json.h"
#include "mapped_file.h"
#include "safetensors_impl.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "remat::io reads and writes safetensors data in host byte order, which must be little-endian"
#endif

namespace remat::io {

namespace detail {

namespace {

struct DtypeEntry {
  const char* name;
  at::ScalarType type;
};

// Listed in the reference writer's dtype order (its Dtype enum, narrowest first); the writer
// sorts by the reverse of this order.
constexpr DtypeEntry kDtypes[] = {
    {"BOOL", at::kBool}, {"U8", at::kByte},     {"I8", at::kChar},   {"I16", at::kShort},
    {"F16", at::kHalf},  {"BF16", at::kBFloat16}, {"I32", at::kInt}, {"F32", at::kFloat},
    {"F64", at::kDouble}, {"I64", at::kLong},
};

}  // namespace

std::optional<at::ScalarType> find_dtype(const std::string& name) {
  for (const auto& entry : kDtypes) {
    if (name == entry.name) return entry.type;
  }
  return std::nullopt;
}

std::optional<std::string> find_dtype_name(at::ScalarType type) {
  for (const auto& entry : kDtypes) {
    if (type == entry.type) return std::string(entry.name);
  }
  return std::nullopt;
}

int dtype_rank(at::ScalarType type) {
  int rank = 0;
  for (const auto& entry : kDtypes) {
    if (type == entry.type) return rank;
    ++rank;
  }
  TORCH_INTERNAL_ASSERT(false, "dtype_rank called with unsupported dtype ", type);
  return -1;
}

std::string supported_dtype_list() {
  std::string out;
  for (const auto& name : supported_dtype_names()) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

}  // namespace detail

const std::vector<std::string>& supported_dtype_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& entry : detail::kDtypes) out.emplace_back(entry.name);
    return out;
  }();
  return names;
}

std::string dtype_name(at::ScalarType dtype) {
  auto name = detail::find_dtype_name(dtype);
  TORCH_CHECK_VALUE(name.has_value(), "[safetensors] dtype must be one of ",
                    detail::supported_dtype_list(), " (as LibTorch types), got ", dtype);
  return *name;
}

at::ScalarType dtype_from_name(const std::string& name) {
  auto type = detail::find_dtype(name);
  TORCH_CHECK_VALUE(type.has_value(), "[safetensors] dtype must be one of ",
                    detail::supported_dtype_list(), ", got '", name, "'");
  return *type;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

namespace {

using Json = nlohmann::ordered_json;

// Reads the 8-byte little-endian header length independently of the host's alignment rules.
uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Parses one tensor entry of the header, checking everything the reader later relies on.
TensorInfo parse_entry(const std::string& path, const std::string& name, const Json& entry,
                       uint64_t data_size) {
  const auto where = "[safetensors] '" + path + "': tensor '" + util::text_excerpt(name) + "'";
  TORCH_CHECK(entry.is_object(), where, " must be an object with dtype, shape and data_offsets, got ",
              util::json_excerpt(entry));
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    TORCH_CHECK(entry.contains(field), where, " is missing the field \"", field, "\" (entry: ",
                util::json_excerpt(entry), ")");
  }
  TensorInfo info{};
  const auto& dtype = entry.at("dtype");
  TORCH_CHECK(dtype.is_string(), where, ": dtype must be a string, got ", util::json_excerpt(dtype));
  auto type = detail::find_dtype(dtype.get<std::string>());
  TORCH_CHECK(type.has_value(), where, " has unknown or unsupported dtype ", util::json_excerpt(dtype),
              "; supported dtypes: ", detail::supported_dtype_list());
  info.dtype = *type;

  const auto& shape = entry.at("shape");
  TORCH_CHECK(shape.is_array(), where, ": shape must be an array of integers, got ", util::json_excerpt(shape));
  uint64_t numel = 1;
  bool overflow = false;
  for (const auto& dim : shape) {
    TORCH_CHECK(dim.is_number_integer(), where, ": shape must be an array of integers, got ",
                util::json_excerpt(shape));
    // nlohmann stores non-negative integers as unsigned, negative ones as signed.
    TORCH_CHECK(dim.is_number_unsigned(), where, ": shape dimensions must be >= 0, got ",
                util::json_excerpt(dim), " in shape ", util::json_excerpt(shape));
    const auto d = dim.get<uint64_t>();
    TORCH_CHECK(d <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), where,
                ": shape dimension ", util::json_excerpt(dim), " is too large");
    info.shape.push_back(static_cast<int64_t>(d));
    overflow = overflow || __builtin_mul_overflow(numel, d, &numel);
  }

  const auto& offsets = entry.at("data_offsets");
  TORCH_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                  offsets[1].is_number_unsigned(),
              where, ": data_offsets must be [begin, end] with integers >= 0, got ", util::json_excerpt(offsets));
  info.begin = offsets[0].get<uint64_t>();
  info.end = offsets[1].get<uint64_t>();
  TORCH_CHECK(info.begin <= info.end, where, ": data_offsets ", util::json_excerpt(offsets), " have begin ",
              info.begin, " > end ", info.end);
  TORCH_CHECK(info.end <= data_size, where, ": data_offsets ", util::json_excerpt(offsets),
              " run past the end of the data buffer (", data_size, " bytes)");
  uint64_t expected = 0;
  overflow = overflow || __builtin_mul_overflow(numel, static_cast<uint64_t>(c10::elementSize(info.dtype)),
                                                &expected);
  TORCH_CHECK(!overflow && expected == info.end - info.begin, where, ": data_offsets ",
              util::json_excerpt(offsets), " span ", info.end - info.begin, " bytes, but shape ", util::json_excerpt(shape),
              " of ", dtype.get<std::string>(), " needs ",
              overflow ? std::string("more than 2^64") : std::to_string(expected), " bytes");
  return info;
}

// Note [Exact data section]
// The header must describe the data section exactly, as the reference reader requires
// (safetensors' validate(): sorted by offset, each tensor starting where the previous ends, the
// last ending at the end of the buffer). Each entry alone can look fine while the file is wrong:
// a header length one byte short shifts every tensor by a byte (all-NaN floats), appended bytes
// hide a truncated or concatenated file, and overlapping or aliased ranges make two tensors share
// bytes. So, after every entry passed parse_entry (in bounds, size = dtype x shape, checked for
// overflow), the ranges sorted by (begin, end) must tile [0, data_size) with no gap and no overlap.
void check_data_layout(const std::string& path, const std::vector<std::string>& names,
                       const std::vector<TensorInfo>& infos, uint64_t data_size) {
  std::vector<size_t> order(infos.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::make_pair(infos[a].begin, infos[a].end) < std::make_pair(infos[b].begin, infos[b].end);
  });
  uint64_t covered = 0;  // the data section [0, covered) is described so far
  const std::string* previous = nullptr;
  for (size_t i : order) {
    const TensorInfo& info = infos[i];
    TORCH_CHECK(info.begin == covered, "[safetensors] '", path, "': tensor '", util::text_excerpt(names[i]),
                "' has data_offsets [", info.begin, ",", info.end, "], but the data section is covered up to byte ",
                covered, previous ? " (by tensor '" + util::text_excerpt(*previous) + "')" : std::string(),
                info.begin < covered ? ": the ranges overlap" : ": there is a gap of unused bytes",
                "; tensors must tile the data section exactly");
    covered = info.end;
    previous = &names[i];
  }
  TORCH_CHECK(covered == data_size, "[safetensors] '", path, "': the tensors cover ", covered,
              " bytes but the data section has ", data_size, " bytes (", data_size - covered,
              " bytes more): the header length is wrong, or bytes were appended to the file");
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile file;
  file.path_ = path;
  file.mapping_ = detail::MappedFile::open(path);
  const uint64_t size = file.mapping_->size();
  TORCH_CHECK(size >= 8, "[safetensors] '", path, "' is truncated: it has ", size,
              " bytes, but a safetensors file starts with an 8-byte header length");
  const uint8_t* base = file.mapping_->data();
  const uint64_t header_len = read_u64_le(base);
  TORCH_CHECK(header_len <= size - 8, "[safetensors] '", path, "': header length ", header_len,
              " runs past the end of the file (", size, " bytes, so at most ", size - 8,
              "); the file is truncated or not a safetensors file");
  file.data_begin_ = base + 8 + header_len;
  file.data_size_ = size - 8 - header_len;

  const std::string_view text(reinterpret_cast<const char*>(base + 8), header_len);
  // Note [Bounded JSON]: size and depth are checked before the parser sees the text.
  util::check_json_text(text, util::kMaxSafetensorsHeaderBytes, "[safetensors] '" + path + "': header");
  Json header;
  try {
    header = Json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK(false, "[safetensors] '", path, "': header (", header_len,
                " bytes) is not valid JSON: ", util::json_error_excerpt(e));
  }
  TORCH_CHECK(header.is_object(), "[safetensors] '", path,
              "': header must be a JSON object of tensor entries, got a JSON ", header.type_name());

  for (const auto& item : header.items()) {
    const std::string& key = item.key();
    const Json& value = item.value();
    if (key == "__metadata__") {
      TORCH_CHECK(value.is_object(), "[safetensors] '", path,
                  "': __metadata__ must be an object of string values, got ", util::json_excerpt(value));
      for (const auto& meta : value.items()) {
        TORCH_CHECK(meta.value().is_string(), "[safetensors] '", path, "': __metadata__ value of '",
                    util::text_excerpt(meta.key()), "' must be a string, got ", util::json_excerpt(meta.value()));
        file.metadata_[meta.key()] = meta.value().get<std::string>();
      }
      continue;
    }
    file.index_[key] = file.infos_.size();
    file.infos_.push_back(parse_entry(path, key, value, file.data_size_));
    file.names_.push_back(key);
  }
  check_data_layout(path, file.names_, file.infos_, file.data_size_);
  return file;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = index_.find(name);
  TORCH_CHECK(it != index_.end(), "[safetensors] '", path_, "' has no tensor named '", name,
              "' (", names_.size(), " tensors in the file)");
  return infos_[it->second];
}

at::Tensor SafetensorsFile::view(const std::string& name) const {
  const auto& meta = info(name);
  const uint8_t* ptr = data_begin_ + meta.begin;
  const auto element = static_cast<uintptr_t>(c10::elementSize(meta.dtype));
  if (meta.nbytes() == 0 || reinterpret_cast<uintptr_t>(ptr) % element != 0) {
    return tensor(name);
  }
  // The deleter owns a reference to the mapping, so the view outlives this object.
  auto keep_alive = mapping_;
  return at::from_blob(const_cast<uint8_t*>(ptr), meta.shape,
                       [keep_alive](void*) mutable { keep_alive.reset(); },
                       at::TensorOptions().dtype(meta.dtype).device(at::kCPU));
}

at::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const auto& meta = info(name);
  auto out = at::empty(meta.shape, at::TensorOptions().dtype(meta.dtype).device(at::kCPU));
  if (meta.nbytes() > 0) std::memcpy(out.data_ptr(), data_begin_ + meta.begin, meta.nbytes());
  return out;
}

at::Tensor SafetensorsFile::tensor(const std::string& name, at::ScalarType target) const {
  const auto& meta = info(name);
  if (meta.dtype == target) return tensor(name);
  // A conversion always allocates, so it reads straight from the mapping (view() itself falls
  // back to an aligned copy when the bytes are misaligned).
  return view(name).to(target);
}

}  // namespace remat::io

namespace remat::io {

void require_finite(const at::Tensor& tensor, const std::string& component, const std::string& file,
                    const std::string& name) {
  if (!tensor.defined() || !at::isFloatingType(tensor.scalar_type()) || tensor.numel() == 0) return;
  // The sum is finite only when every element is (NaN and inf propagate; inf - inf is NaN), and
  // it allocates nothing of the tensor's size: loading stays zero-copy. Only a sum that is not
  // finite (a bad value, or finite values whose sum overflows) pays for the exact element check.
  if (std::isfinite(tensor.sum().item<double>())) return;
  if (at::isfinite(tensor).all().item<bool>()) return;
  const at::Tensor bad = at::logical_not(at::isfinite(tensor)).flatten();
  const int64_t count = bad.sum().item<int64_t>();
  const int64_t first = bad.nonzero().flatten()[0].item<int64_t>();
  throw_value_error("[" + component + "] '" + file + "': tensor '" + name + "' holds " + std::to_string(count) +
                    " non-finite value(s) (NaN or inf), the first at flat index " + std::to_string(first) +
                    "; a NaN turns everything computed from it NaN: use a finite file");
}

}  // namespace remat::io
