// `remat make-demo-images`: writes a small picture dataset with captions (coloured shapes), the
// input of the main job's real path: `remat train` caches it and trains on it.
#include <iostream>
#include <map>

#include "command.h"
#include "parse_args.h"
#include "remat/data/demo_images.h"

namespace remat::cli {
namespace {

int run_make_demo_images(const std::vector<std::string>& args) {
  CLI::App app{"Write a small picture dataset with captions: coloured shapes (circle, square, triangle; red, "
               "green, blue, yellow) on a white or black background, square, landscape (3:2) and portrait "
               "(2:3), as IMAGE.png with its caption in IMAGE.txt (caption_strategy textfile).",
               "remat make-demo-images"};
  std::string output;
  data::DemoImagesOptions options;
  int64_t seed = 0;
  app.add_option("--output", output, "Directory to create (must be empty if it exists)")->required();
  app.add_option("--count", options.count,
                 "Number of pictures (72: every shape, colour and background in every aspect ratio)")
      ->check(CLI::Range(int64_t{1}, int64_t{100000}))
      ->capture_default_str();
  app.add_option("--size", options.size,
                 "Side of the square pictures in pixels (landscape: size*3/2 x size, portrait: size x size*3/2)")
      ->check(CLI::Range(int64_t{16}, int64_t{4096}))
      ->capture_default_str();
  add_registry_option(app, "seed", seed);
  if (auto code = parse_or_exit(app, args)) return *code;
  options.seed = static_cast<uint64_t>(seed);
  const auto images = data::write_demo_images(output, options);
  std::map<std::pair<int64_t, int64_t>, int64_t> sizes;
  for (const auto& image : images) ++sizes[{image.width, image.height}];
  std::cout << "wrote " << images.size() << " pictures with captions to " << output << " (";
  bool first = true;
  for (const auto& [size, count] : sizes) {
    std::cout << (first ? "" : ", ") << count << " of " << size.first << "x" << size.second;
    first = false;
  }
  std::cout << ")\n";
  return 0;
}

REMAT_COMMAND("make-demo-images", "write a small picture dataset with captions (coloured shapes)",
              run_make_demo_images);

}  // namespace
}  // namespace remat::cli
