// The form of a job's id (torchrun's rendezvous id): checked wherever one comes from (a
// flag, MINIGRAD_RUN_ID, a launcher's job id), before it names the store's keys.
// Plain C++ with no tensor in sight, so that the launcher links it without libminigrad.
#pragma once

#include <string>

namespace mg::parallel {

// A run id is 1 to 128 characters from [A-Za-z0-9._:-] (a UUID, "job-42", a host:port).
// Otherwise an mg::Error naming `origin` (e.g. "MINIGRAD_RUN_ID").
void check_run_id(const std::string& run_id, const std::string& origin);

}  // namespace mg::parallel
