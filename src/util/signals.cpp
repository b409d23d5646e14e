#include "ddiloco/signals.hpp"

#include <csignal>

namespace ddiloco {

namespace {
volatile std::sig_atomic_t g_signal = 0;
extern "C" void record_signal(int signal) {
  if (g_signal == 0) g_signal = signal;
}
}  // namespace

void install_stop_signals() {
  struct sigaction action {};
  action.sa_handler = record_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGUSR1, &action, nullptr);  // Slurm's warning before pre-emption (--signal)
}

int stop_signal() { return g_signal; }

}  // namespace ddiloco
