// Fuzz target: the configuration loader (load_config_text, include/ddiloco/config.hpp): the
// YAML of a config file or of a checkpoint's effective configuration, parsed and validated.
//
// Feeds: the input as YAML text (source "fuzz config"), no --set overrides.
// Checks: no crash or sanitizer report, no hang (libFuzzer's -timeout); the only exception is
// ddiloco::Error (a YAML syntax error included: the loader reports it as one); an accepted
// config's to_yaml is accepted again (what a checkpoint stores must load on resume).
// Not skipped: validation looks up, and reads, a chaos.schedule_file the input names (the
// lookup's errors are the loader's to report: a name over 255 bytes once threw
// std::filesystem::filesystem_error); no other filesystem work is done (data.* globs are not
// expanded here).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ddiloco/config.hpp"
#include "ddiloco/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  ddiloco::Config config;
  try {
    config = ddiloco::load_config_text(text, "fuzz config");
  } catch (const ddiloco::Error&) {
    return 0;
  }
  try {
    ddiloco::load_config_text(ddiloco::to_yaml(config), "fuzz config (to_yaml)");
  } catch (const ddiloco::Error& e) {
    std::fprintf(stderr, "fuzz_config: an accepted config's to_yaml is refused: %s\n", e.what());
    std::abort();
  }
  return 0;
}
