// bench_data_parallel's command line (both roles read the same options).
#include <functional>
#include <sstream>

#include <c10/util/Exception.h>

#include "data_parallel.h"
#include "remat/util/error.h"

namespace remat::bench {
namespace {

int64_t parse_integer(const std::string& name, const std::string& text, int64_t min) {
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || value < min) {
    throw_value_error("[bench] --" + name + " must be an integer >= " + std::to_string(min) + ", got '" + text + "'");
  }
  return value;
}

void check_one_of(const std::string& name, const std::string& value, const std::vector<std::string>& valid) {
  for (const auto& v : valid) {
    if (v == value) return;
  }
  std::string list;
  for (const auto& v : valid) list += (list.empty() ? "" : ", ") + v;
  throw_value_error("[bench] --" + name + " must be one of " + list + ", got '" + value + "'");
}

}  // namespace

DataParallelOptions parse_data_parallel_options(int argc, char** argv) {
  DataParallelOptions o;
  using Setter = std::function<void(const std::string&)>;
  const auto text = [](std::string& field) -> Setter { return [&field](const std::string& v) { field = v; }; };
  const auto integer = [](const std::string& name, int64_t& field, int64_t min) -> Setter {
    return [name, &field, min](const std::string& v) { field = parse_integer(name, v, min); };
  };
  const std::map<std::string, Setter> setters = {
      {"device", text(o.device)},
      {"backend", text(o.backend)},
      {"preset", text(o.preset)},
      {"config", text(o.config)},
      {"dtype", text(o.dtype)},
      {"modes", text(o.modes)},
      {"checkpoint", text(o.checkpoint)},
      {"lora_rank", integer("lora_rank", o.lora_rank, 1)},
      {"batch", integer("batch", o.batch, 1)},
      {"image_tokens", integer("image_tokens", o.image_tokens, 1)},
      {"text_tokens", integer("text_tokens", o.text_tokens, 1)},
      {"steps", integer("steps", o.steps, 1)},
      {"warmup", integer("warmup", o.warmup, 0)},
      {"processes", integer("processes", o.processes, 2)},
      {"cores", integer("cores", o.cores, 0)},
      {"seed", integer("seed", o.seed, 0)},
      {"timeout", integer("timeout", o.timeout, 1)},
      {"json", text(o.json)},
      {"result_dir", text(o.result_dir)},
      {"threads", integer("threads", o.threads, 1)},
      {"full", [&o](const std::string& v) { o.full = v == "1"; }},
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto it = arg.rfind("--", 0) == 0 ? setters.find(arg.substr(2)) : setters.end();
    if (it == setters.end()) {
      std::string valid;
      for (const auto& [name, setter] : setters) valid += (valid.empty() ? "--" : ", --") + name;
      throw_value_error("[bench] unknown option '" + arg + "'; valid: " + valid);
    }
    TORCH_CHECK_VALUE(i + 1 < argc, "[bench] ", arg, " needs a value");
    it->second(argv[++i]);
  }
  check_one_of("device", o.device, {"cpu", "cuda"});
  check_one_of("backend", o.backend, {"auto", "gloo", "nccl"});
  check_one_of("dtype", o.dtype, {"float32", "bfloat16"});
  std::stringstream modes(o.modes);
  for (std::string mode; std::getline(modes, mode, ',');) check_one_of("modes", mode, {"lora", "full"});
  if (o.checkpoint != "off") parse_integer("checkpoint", o.checkpoint, 1);
  return o;
}

std::map<std::string, std::string> worker_arguments(const DataParallelOptions& o) {
  return {{"device", o.device},
          {"backend", o.backend},
          {"preset", o.preset},
          {"config", o.config},
          {"dtype", o.dtype},
          {"checkpoint", o.checkpoint},
          {"lora_rank", std::to_string(o.lora_rank)},
          {"batch", std::to_string(o.batch)},
          {"image_tokens", std::to_string(o.image_tokens)},
          {"text_tokens", std::to_string(o.text_tokens)},
          {"steps", std::to_string(o.steps)},
          {"warmup", std::to_string(o.warmup)},
          {"seed", std::to_string(o.seed)},
          {"result_dir", o.result_dir},
          {"threads", std::to_string(o.threads)},
          {"full", o.full ? "1" : "0"}};
}

}  // namespace remat::bench
