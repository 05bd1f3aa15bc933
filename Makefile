# Entry points for a fresh machine. Each target installs missing packages, configures and builds.
#   make demo   the main job on its built-in default: pictures with captions and a tiny Flux pipeline
#               folder are generated (once), cached (VAE latents, text embeddings) and a LoRA of the
#               small Flux preset is trained on them with segmented checkpointing
#               (configs/demo-flux-lora.json)
#   make test   the test suite (CTest)
#
# Two builds of the same sources (docs/BUILDING.md):
#   TORCH=debian   (default) Debian's LibTorch 1.13, CPU, in build/
#   TORCH=pytorch  the LibTorch inside a pip PyTorch 2.x with CUDA, in build-pytorch/: PyTorch
#                  $(PYTORCH_VERSION) is installed in build-pytorch/venv, or PYTORCH_PYTHON=<python> names
#                  an interpreter whose torch to build against (the PyTorch you already have)
TORCH ?= debian
PYTORCH_VERSION ?= 2.11.0
ifeq ($(TORCH),debian)
  BUILD_DIR ?= build
else ifeq ($(TORCH),pytorch)
  BUILD_DIR ?= build-pytorch
  PYTORCH_PYTHON ?= $(BUILD_DIR)/venv/bin/python
else
  $(error TORCH=$(TORCH) is not a build: use TORCH=debian (Debian's LibTorch 1.13, CPU) or TORCH=pytorch (a pip PyTorch 2.x with CUDA))
endif
JOBS ?= $(shell nproc)
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")

.PHONY: deps configure build demo test bench sanitize fuzz clean

deps:
	@scripts/install-deps.sh
ifeq ($(TORCH),pytorch)
ifeq ($(PYTORCH_PYTHON),$(BUILD_DIR)/venv/bin/python)
	@scripts/install-pytorch.sh $(BUILD_DIR)/venv $(PYTORCH_VERSION)
endif
endif

# The PyTorch build finds LibTorch where the interpreter's torch keeps its CMake package; its
# Python tests run with that interpreter too.
ifeq ($(TORCH),pytorch)
TORCH_CMAKE_ARGS = -DCMAKE_PREFIX_PATH="$$($(PYTORCH_PYTHON) -c 'import torch;print(torch.utils.cmake_prefix_path)')" \
  -DREMAT_PYTHON_TORCH="$$($(PYTORCH_PYTHON) -c 'import sys;print(sys.executable)')"
endif

configure: deps
	@test -f $(BUILD_DIR)/CMakeCache.txt || cmake -S . -B $(BUILD_DIR) $(GENERATOR) -DCMAKE_BUILD_TYPE=Release $(TORCH_CMAKE_ARGS)

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

REMAT := $(BUILD_DIR)/apps/remat/remat

# Each generated folder is written under a temporary name and renamed when complete, so an
# interrupted `make demo` regenerates it instead of training on half a dataset.
demo: build
	@test -d out/demo-images || { rm -rf out/demo-images.partial && \
	  $(REMAT) make-demo-images --output out/demo-images.partial && mv out/demo-images.partial out/demo-images; }
	@test -d out/demo-pipeline || { rm -rf out/demo-pipeline.partial && \
	  $(REMAT) make-demo-pipeline --output out/demo-pipeline.partial --transformer_preset flux-small --dtype fp32 && \
	  mv out/demo-pipeline.partial out/demo-pipeline; }
	$(REMAT) train --config configs/demo-flux-lora.json

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS) --timeout 600

bench: deps
	cmake -S . -B $(BUILD_DIR) $(GENERATOR) -DCMAKE_BUILD_TYPE=Release -DREMAT_BUILD_BENCHMARKS=ON $(TORCH_CMAKE_ARGS)
	cmake --build $(BUILD_DIR) -j $(JOBS)
	$(BUILD_DIR)/bench/checkpoint_overhead

# The test suite built with AddressSanitizer + UndefinedBehaviorSanitizer (remat's code; LibTorch
# is prebuilt). Leak checking is off: LibTorch keeps allocations alive until exit by design.
SANITIZE_DIR ?= build-sanitize
sanitize: deps
	@test -f $(SANITIZE_DIR)/CMakeCache.txt || cmake -S . -B $(SANITIZE_DIR) $(GENERATOR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DREMAT_SANITIZE=ON
	cmake --build $(SANITIZE_DIR) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir $(SANITIZE_DIR) --output-on-failure -j $(JOBS) --timeout 1200 $(SANITIZE_CTEST_ARGS)

# libFuzzer targets (clang), each run for FUZZ_SECONDS from its seed corpus, then the regressions
# replayed. docs/FUZZING.md says how to fuzz for hours.
FUZZ_DIR ?= build-fuzz
FUZZ_SECONDS ?= 10
fuzz: deps
	@test -f $(FUZZ_DIR)/CMakeCache.txt || cmake -S . -B $(FUZZ_DIR) $(GENERATOR) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DREMAT_FUZZ=ON -DREMAT_BUILD_TESTS=OFF -DREMAT_BUILD_APPS=OFF
	cmake -S . -B $(FUZZ_DIR) -DREMAT_FUZZ_SECONDS=$(FUZZ_SECONDS) > /dev/null
	cmake --build $(FUZZ_DIR) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=0 ctest --test-dir $(FUZZ_DIR) --output-on-failure -j $(JOBS) -L fuzz

clean:
	rm -rf build build-pytorch $(SANITIZE_DIR) $(FUZZ_DIR) out
