// The device core's table as seen from the distributed extension.
#pragma once

#include "../runtime/core_api.h"

namespace npusim::dist {

// Set once from Python (npusim.distributed) before any backend is created.
void set_core_api(const CoreApi* api);
const CoreApi& core();

}  // namespace npusim::dist
