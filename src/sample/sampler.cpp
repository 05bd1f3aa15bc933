// Implementation of remat/sample/sampler.h: being written (issue 13).
#include "remat/sample/sampler.h"
