// Implementation of remat/sample/scheduler.h: being written (issue 13).
#include "remat/sample/scheduler.h"
