// Filled in by the data layer commits of issue 12.
#include "remat/data/image_dataset.h"
