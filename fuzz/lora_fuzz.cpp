// Fuzz target: LoRA files people share (diffusers/PEFT, kohya in its spellings, BFL control,
// XLabs), read and merged into a flux-tiny model as `remat sample --lora` does. Any input must
// either merge or be refused with a c10::Error naming the problem (a key no format knows, factors
// that fit no layer of the model).
#include <cstddef>
#include <cstdint>

#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include "fuzz_input_file.h"
#include "remat/models/flux.h"
#include "remat/models/lora_formats.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // One model for every input: merging only adds to its weights, and a refused merge changes nothing.
  static remat::models::Flux model(remat::models::FluxConfig::preset("flux-tiny"));
  const std::string path = remat::fuzz::write_input(data, size, "lora.safetensors");
  try {
    const remat::models::LoraFile lora = remat::models::read_lora_file(path);
    remat::models::merge_lora(*model, lora, 0.5);
  } catch (const c10::Error&) {
    // A refusal with a message is the expected outcome for malformed input.
  }
  return 0;
}
