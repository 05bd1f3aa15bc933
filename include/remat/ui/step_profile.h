#pragma once
/// \file
/// The child side of `POST /api/plan` (docs/UI.md, "The planner's figures"): `remat ui
/// --profile-step`, which the server runs as a child process of its own binary with a memory
/// limit and a timeout (people never need it). One training step is profiled on the CPU in that
/// process, so a profile too large for the machine ends the child, never the server.

#include <iosfwd>

#include "remat/export.h"

namespace remat::ui {

/// Reads {"config": {...}} (a config as POST /api/plan takes it) from `in`, profiles one
/// training step of it (remat::train::profile_step at the config's model, batch and tokens) and
/// writes one line of JSON to `out`: {"step_model": {...}}, or {"error": "[ui] ...",
/// "out_of_memory": true|false}. Returns the exit code: 0, or 1 after an error.
REMAT_API int run_step_profile_child(std::istream& in, std::ostream& out);

}  // namespace remat::ui
