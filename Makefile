# Entry points for a fresh machine. Each target installs missing packages, configures and builds.
#   make demo   the main job on its built-in default: a short LoRA training run of the small Flux
#               preset on generated demo data, with segmented checkpointing (configs/demo-flux-lora.json)
#   make test   the test suite (CTest)
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")

.PHONY: deps configure build demo test bench clean

deps:
	@scripts/install-deps.sh

configure: deps
	@test -f $(BUILD_DIR)/CMakeCache.txt || cmake -S . -B $(BUILD_DIR) $(GENERATOR) -DCMAKE_BUILD_TYPE=Release

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

REMAT := $(BUILD_DIR)/apps/remat/remat

demo: build
	@test -d out/demo-data || $(REMAT) make-demo-data --output out/demo-data
	$(REMAT) train --config configs/demo-flux-lora.json

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS) --timeout 600

bench: deps
	cmake -S . -B $(BUILD_DIR) $(GENERATOR) -DCMAKE_BUILD_TYPE=Release -DREMAT_BUILD_BENCHMARKS=ON
	cmake --build $(BUILD_DIR) -j $(JOBS)
	$(BUILD_DIR)/bench/checkpoint_overhead

clean:
	rm -rf $(BUILD_DIR) out
