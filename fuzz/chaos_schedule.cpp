// Fuzz target: the fault-schedule loader (chaos::Schedule::load / parse,
// include/ddiloco/chaos.hpp): the YAML named by chaos.schedule_file.
//
// Feeds: the input as YAML text, for a job of 4 units of 2 ranks each.
// Checks: no crash or sanitizer report; the only exception is ddiloco::Error; an accepted
// schedule's to_yaml() reads back to the same schedule (its documented contract).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ddiloco/chaos.hpp"
#include "ddiloco/error.hpp"

using ddiloco::chaos::Schedule;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::vector<int> unit_ranks = {2, 2, 2, 2};
  Schedule schedule;
  try {
    schedule = Schedule::parse(text, "fuzz schedule", 4, unit_ranks);
  } catch (const ddiloco::Error&) {
    return 0;
  }
  try {
    if (Schedule::parse(schedule.to_yaml(), "fuzz schedule (to_yaml)", 4, unit_ranks) != schedule) {
      std::fprintf(stderr, "fuzz_chaos_schedule: to_yaml does not read back the same schedule\n");
      std::abort();
    }
  } catch (const ddiloco::Error& e) {
    std::fprintf(stderr, "fuzz_chaos_schedule: an accepted schedule's to_yaml is refused: %s\n",
                 e.what());
    std::abort();
  }
  return 0;
}
