// Emulated WAN links: the token bucket and the delay line (include/ddiloco/wan.hpp).
#include "ddiloco/wan.hpp"

#include <algorithm>
#include <cstring>
#include <thread>

#include "ddiloco/config.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/mpi.hpp"
#include "ddiloco/wire_format.hpp"

namespace ddiloco::wan {

TokenBucket::TokenBucket(double rate_bytes_per_s, double burst_bytes)
    : rate_(rate_bytes_per_s), burst_(std::max(0.0, burst_bytes)), level_(burst_) {}

double TokenBucket::send(double bytes, double now_s, double rate_factor) {
  if (rate_ <= 0) return now_s;
  const double rate = rate_ * std::clamp(rate_factor, 1e-9, 1.0);
  // Tokens accrued since the last message (at the rate now: a degradation that began in
  // between counts from its start only approximately, which the chaos model allows).
  level_ = std::min(burst_, level_ + (now_s - at_) * rate);
  at_ = std::max(at_, now_s);
  level_ -= bytes;
  return level_ >= 0 ? now_s : now_s + (-level_) / rate;
}

LinkDirection::LinkDirection(const LinkSpec& spec, uint64_t seed)
    : spec_(spec), bucket_(spec.bandwidth_bytes_per_s, spec.burst_bytes), rng_(seed) {}

Transfer LinkDirection::transfer(uint64_t bytes, double start_s, double not_before_s, double rate_factor) {
  bytes_ += bytes;
  ++messages_;
  const double left = std::max(bucket_.send(static_cast<double>(bytes), start_s, rate_factor), not_before_s);
  double delay = spec_.latency_s;
  if (spec_.jitter_s > 0) delay += std::uniform_real_distribution<double>(0.0, spec_.jitter_s)(rng_);
  // A link is a pipe: jitter delays a message, it does not let it overtake an earlier one.
  last_arrival_ = std::max(last_arrival_, left + delay);
  return {left, last_arrival_};
}

WanRing::WanRing(MPI_Comm leaders, const Config& config)
    : comm_(leaders),
      rank_(mpi::rank(leaders)),
      size_(mpi::size(leaders)),
      link_(link_spec(config, rank_), static_cast<uint64_t>(config.run.seed) * 1000 + rank_),
      codec_(wire_codec(config)),
      t0_(std::chrono::steady_clock::now()) {
  if (codec_.format != wire::Format::fp32 && codec_.format != wire::Format::bf16)
    fail("wan.format: ddp all-reduces gradients in fp32 or bf16, got {}", config.wan.format);
}

double WanRing::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

void WanRing::allreduce_sum(std::span<float> data, bool raw) {
  const int M = size_;
  if (M == 1) return;
  const wire::Codec codec = raw ? wire::Codec{} : codec_;  // (the default: fp32)
  const wire::Format format = codec.format;
  const size_t n = data.size();
  auto chunk = [&](int c) {  // chunk c of M, as even as can be
    const int k = ((c % M) + M) % M;
    const size_t lo = n * static_cast<size_t>(k) / M, hi = n * static_cast<size_t>(k + 1) / M;
    return data.subspan(lo, hi - lo);
  };
  const int right = (rank_ + 1) % M, left = (rank_ + M - 1) % M;
  // One ring step: send `out` (encoded) to the right, receive the left's into recv_, and sleep
  // until it would have arrived over the sender's up link and our down link. Each message
  // leads with how long after its send its last byte reaches the WAN (the sender's up link
  // and latency), so that no clock is shared between ranks.
  auto step = [&](std::span<const std::byte> out, size_t in_bytes) {
    const double start = now();
    const Transfer up = link_.up.transfer(out.size(), start, start, rate_factor_());
    const double ready_in = up.arrive_s - start;
    send_.resize(sizeof(double) + out.size());
    std::memcpy(send_.data(), &ready_in, sizeof(double));
    std::memcpy(send_.data() + sizeof(double), out.data(), out.size());
    recv_.resize(sizeof(double) + in_bytes);
    MPI_Request requests[2];
    mpi::check(MPI_Irecv(recv_.data(), static_cast<int>(recv_.size()), MPI_BYTE, left, 7, comm_, &requests[0]),
               "Irecv(ring)");
    mpi::check(MPI_Isend(send_.data(), static_cast<int>(send_.size()), MPI_BYTE, right, 7, comm_, &requests[1]),
               "Isend(ring)");
    mpi::wait(requests[0]);
    const double received = now();
    double their_ready_in = 0;
    std::memcpy(&their_ready_in, recv_.data(), sizeof(double));
    const Transfer down = link_.down.transfer(in_bytes, received, received + their_ready_in, rate_factor_());
    std::this_thread::sleep_for(std::chrono::duration<double>(std::max(0.0, down.arrive_s - now())));
    mpi::wait(requests[1]);
    wait_s_ += now() - start;
    return std::span<const std::byte>(recv_.data() + sizeof(double), in_bytes);
  };
  // fp32 goes as it is (non-finite values included, which the codecs refuse).
  auto encode = [&](std::span<const float> x, std::vector<std::byte>& out) {
    if (format == wire::Format::fp32) {
      const auto b = std::as_bytes(x);
      out.assign(b.begin(), b.end());
    } else {
      out = wire::encode(codec, x);
    }
  };
  auto decode = [&](std::span<const std::byte> in, std::span<float> x) {
    if (format == wire::Format::fp32)
      std::memcpy(x.data(), in.data(), in.size());
    else
      wire::decode(codec, in, x);
  };
  std::vector<std::byte> encoded;
  // Reduce-scatter: after M−1 steps this leader holds the full sum of chunk rank+1.
  for (int s = 0; s < M - 1; ++s) {
    const std::span<float> out = chunk(rank_ - s), in = chunk(rank_ - s - 1);
    encode(out, encoded);
    const auto got = step(encoded, wire::encoded_bytes(codec, in.size()));
    decoded_.resize(in.size());
    decode(got, decoded_);
    for (size_t i = 0; i < in.size(); ++i) in[i] += decoded_[i];
  }
  // The owner rounds its sum as the others will receive it: every leader ends identical.
  std::span<float> mine = chunk(rank_ + 1);
  encode(mine, encoded);
  decode(encoded, mine);
  // All-gather: forward the owner's bytes as they are.
  for (int s = 0; s < M - 1; ++s) {
    const std::span<float> in = chunk(rank_ - s);
    const auto got = step(encoded, wire::encoded_bytes(codec, in.size()));
    encoded.assign(got.begin(), got.end());
    decode(encoded, in);
  }
}

LinkCounters LinkCounters::of(int unit, const Link& link) {
  return {unit, link.up.bytes(), link.down.bytes(), link.up.messages(), link.down.messages()};
}

LinkCounters& LinkCounters::operator+=(const LinkCounters& o) {
  up_bytes += o.up_bytes;
  down_bytes += o.down_bytes;
  up_messages += o.up_messages;
  down_messages += o.down_messages;
  return *this;
}

std::vector<LinkCounters> gather_link_counters(const LinkCounters& mine, MPI_Comm comm) {
  const int64_t words[5] = {mine.unit, static_cast<int64_t>(mine.up_bytes), static_cast<int64_t>(mine.down_bytes),
                            static_cast<int64_t>(mine.up_messages), static_cast<int64_t>(mine.down_messages)};
  const bool root = mpi::rank(comm) == 0;
  std::vector<int64_t> all(root ? 5 * static_cast<size_t>(mpi::size(comm)) : 0);
  mpi::check(MPI_Gather(words, 5, MPI_INT64_T, all.data(), 5, MPI_INT64_T, 0, comm), "Gather(link counters)");
  std::vector<LinkCounters> out;
  for (size_t i = 0; i + 4 < all.size(); i += 5)
    if (all[i] >= 0)
      out.push_back({all[i], static_cast<uint64_t>(all[i + 1]), static_cast<uint64_t>(all[i + 2]),
                     static_cast<uint64_t>(all[i + 3]), static_cast<uint64_t>(all[i + 4])});
  return out;
}

LinkSpec link_spec(const Config& config, int unit) {
  const WanConfig& w = config.wan;
  LinkSpec s;
  s.bandwidth_bytes_per_s = w.bandwidth_of(unit) * 1e6 / 8;
  s.latency_s = w.latency_of(unit) * 1e-3;
  s.jitter_s = w.jitter_ms * 1e-3;
  s.burst_bytes = w.burst_kb * 1024;
  return s;
}

bool emulated(const Config& config) { return config.wan.emulated(config.units.count); }

wire::Codec wire_codec(const Config& config) {
  const WanConfig& w = config.wan;
  return {wire::parse_format(w.format), static_cast<size_t>(w.block), static_cast<size_t>(w.chunk),
          static_cast<size_t>(w.topk), w.value_bits};
}

}  // namespace ddiloco::wan
