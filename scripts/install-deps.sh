#!/usr/bin/env bash
# Installs the Debian packages remat needs, only those missing. Safe to run repeatedly.
set -euo pipefail

packages=(
  build-essential cmake ninja-build
  ccache                  # compiler cache: the builds (LibTorch 1.13, PyTorch 2.x, fuzz) and CI's clone share it
  libtorch-dev            # LibTorch 1.13 (CPU)
  libgloo-dev             # Gloo's headers: c10d's ProcessGroupGloo (multi-process training) includes them
  libopenblas0-pthread    # optimised BLAS: without it fp32 matmuls run ~50x slower
  libgtest-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libtomlplusplus-dev     # toml++: config.toml
  libsentencepiece-dev    # T5's tokenizer (tokenizer_2/spiece.model)
  libstb-dev              # stb_image: reading pictures (PNG, BMP, GIF, ...) and writing PNG
  libjpeg-dev             # libjpeg-turbo: reading JPEG pictures (PIL's decoder)
  libwebp-dev             # libwebp: reading WebP pictures (and writing them in the tests)
  libexif-dev             # libexif: the EXIF orientation of pictures
  libpng-dev              # libpng: writing sampled pictures as PNG with text chunks
  libicu-dev              # CLIP's tokenizer: Unicode classes, NFC, lower case
  libcpp-httplib-dev pkg-config  # cpp-httplib: the HTTP server of `remat ui` (its flags from cpp-httplib.pc)
  python3-torch           # PyTorch eager, for the comparison benchmark in bench/
  python3-jsonschema      # the options schema check (tests/schema): an independent Draft 2020-12 validator
  python3-venv            # the PyTorch 2.x build's virtual environment (scripts/install-pytorch.sh)
  clang libclang-rt-dev   # libFuzzer and clang's sanitizer runtimes, for `make fuzz`
  chromium python3-websocket  # the real-browser test of `remat ui` (tests/ui/browser): headless, over DevTools
  fonts-ipafont-gothic fonts-lohit-deva  # CJK and Devanagari glyphs: the UI's translated help, readable in screenshots
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]} > 0)); then
  echo "Installing missing packages: ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
