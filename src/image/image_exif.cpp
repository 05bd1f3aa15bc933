// EXIF orientation: the tag read with Debian's libexif, and the transform that shows the picture
// upright, the same as PIL's ImageOps.exif_transpose (which SimpleTuner applies to every image).
#include <memory>
#include <string>

#include <libexif/exif-data.h>

#include "image_formats.h"

namespace remat::image::detail {

int exif_orientation(const std::string& exif) {
  if (exif.empty()) return 1;
  // libexif expects the "Exif\0\0" prefix of a JPEG APP1 segment; PNG's eXIf and WebP's EXIF
  // chunks hold the TIFF data alone (though some writers add the prefix there too).
  static const std::string prefix("Exif\0\0", 6);
  const std::string block = exif.compare(0, 6, prefix) == 0 ? exif : prefix + exif;
  std::unique_ptr<ExifData, void (*)(ExifData*)> data(exif_data_new(), &exif_data_unref);
  if (!data) return 1;
  // Read the block as it is: no tags added or "fixed" to follow the specification.
  exif_data_unset_option(data.get(), EXIF_DATA_OPTION_FOLLOW_SPECIFICATION);
  exif_data_set_option(data.get(), EXIF_DATA_OPTION_IGNORE_UNKNOWN_TAGS);
  exif_data_load_data(data.get(), reinterpret_cast<const unsigned char*>(block.data()),
                      static_cast<unsigned int>(block.size()));
  // IFD0 describes the main picture (IFD1, the thumbnail, may carry its own orientation).
  ExifEntry* entry = exif_content_get_entry(data->ifd[EXIF_IFD_0], EXIF_TAG_ORIENTATION);
  if (entry == nullptr || entry->format != EXIF_FORMAT_SHORT || entry->components < 1 || entry->size < 2) return 1;
  const int orientation = exif_get_short(entry->data, exif_data_get_byte_order(data.get()));
  // Values outside 1-8 mean nothing; PIL's exif_transpose leaves such a picture as stored too.
  return orientation >= 1 && orientation <= 8 ? orientation : 1;
}

at::Tensor apply_exif_orientation(const at::Tensor& picture, int orientation) {
  // picture is [rows, columns, channels]; transpose(0, 1) mirrors it across the main diagonal.
  switch (orientation) {
    case 2: return picture.flip({1}).contiguous();                   // FLIP_LEFT_RIGHT
    case 3: return picture.flip({0, 1}).contiguous();                // ROTATE_180
    case 4: return picture.flip({0}).contiguous();                   // FLIP_TOP_BOTTOM
    case 5: return picture.transpose(0, 1).contiguous();             // TRANSPOSE
    case 6: return picture.transpose(0, 1).flip({1}).contiguous();   // ROTATE_270 (90 clockwise)
    case 7: return picture.transpose(0, 1).flip({0, 1}).contiguous();// TRANSVERSE
    case 8: return picture.transpose(0, 1).flip({0}).contiguous();   // ROTATE_90 (90 anticlockwise)
    default: return picture;
  }
}

}  // namespace remat::image::detail
