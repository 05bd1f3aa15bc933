// Implementation of remat/sample/png_file.h: being written (issue 13).
#include "remat/sample/png_file.h"
