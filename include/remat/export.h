#pragma once

/// Marks a symbol as part of remat's public ABI. The library is built with hidden visibility, so
/// only symbols carrying REMAT_API are exported from a shared build.
#if defined(_WIN32)
#define REMAT_API
#else
#define REMAT_API __attribute__((visibility("default")))
#endif
