// A learner rank on its GPU (include/ddiloco/unit_backend.hpp): GptCuda for the step,
// NCCL inside the unit, HostStaging for the leader's fragment exchange with the syncer.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "ddiloco/error.hpp"
#include "ddiloco/gpu/check.hpp"
#include "ddiloco/gpu/cudnn_attention.hpp"
#include "ddiloco/gpu/gpt_cuda.hpp"
#include "ddiloco/gpu/host_staging.hpp"
#include "ddiloco/gpu/nccl.hpp"
#include "ddiloco/unit_backend.hpp"
#include "ddiloco/mpi.hpp"
#include "ddiloco/zero.hpp"

namespace ddiloco::gpu {

namespace {

// Pinned host buffer (cudaHostAlloc) of n elements of T: the copy engine reads it directly,
// so the H2D copy of a batch is asynchronous for real.
template <typename T>
class Pinned {
 public:
  explicit Pinned(size_t n) {
    DDILOCO_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&ptr_), n * sizeof(T),
                                     cudaHostAllocDefault));
  }
  ~Pinned() { cudaFreeHost(ptr_); }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
};

template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) {
    DDILOCO_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), n * sizeof(T)));
  }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
};

AttentionKind attention_of(const Config& config) {
  return parse_attention_kind(resolve_attention(config));
}

// units.zero = 1 on R > 1 ranks: this rank's AdamW shard is zero_shard's (the host optimizer's,
// which checkpoints gather), and the buffers are padded to R pieces of the largest shard.
OptimizerShard optimizer_shard(const Config& config, int rank, int ranks) {
  if (config.units.zero != 1 || ranks <= 1) return {};
  const size_t n = ParameterLayout::gpt2(config.model).size();
  const StateShard mine = zero_shard(n, rank, ranks);
  return {mine.lo, mine.size(), zero_shard(n, 0, ranks).size() * static_cast<size_t>(ranks)};
}

class CudaUnit final : public UnitBackend {
 public:
  CudaUnit(const Config& config, MPI_Comm unit_comm, MPI_Comm device_comm,
           std::span<const float> initial)
      : config_(config),
        unit_comm_(unit_comm),
        rank_(mpi::rank(unit_comm)),
        ranks_(mpi::size(unit_comm)),
        // Sets the current device: everything below allocates on it.
        choice_(select_device(device_comm)),
        model_(config.model,
               AdamWConfig{config.train.beta1, config.train.beta2, config.train.eps,
                           config.train.weight_decay},
               attention_of(config), optimizer_shard(config, rank_, ranks_)),
        sharded_(config.units.zero == 1 && ranks_ > 1),
        tokens_(batch_elems() * 2),
        d_tokens_(batch_elems() * 2) {
    if (initial.size() != model_.num_parameters())
      fail("GPU unit: {} initial parameters for a model of {}", initial.size(),
           model_.num_parameters());
    model_.set_parameters(initial);
    if (ranks_ > 1) nccl_ = std::make_unique<NcclComm>(unit_comm);
  }

  GpuStepResult step(const int32_t* inputs, const int32_t* targets, double lr) override {
    const int B = config_.train.batch_size, T = config_.model.seq_len;
    const size_t N = batch_elems();
    cudaStream_t s = stream();
    // The previous step ended with a host wait on this stream (the loss read), so the pinned
    // batch buffer is no longer being copied from.
    std::memcpy(tokens_.get(), inputs, N * sizeof(int32_t));
    std::memcpy(tokens_.get() + N, targets, N * sizeof(int32_t));
    DDILOCO_CUDA_CHECK(cudaMemcpyAsync(d_tokens_.get(), tokens_.get(), 2 * N * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, s));
    model_.forward_device(d_tokens_.get(), d_tokens_.get() + N, B, T, /*for_backward=*/true);
    model_.zero_grad();
    model_.backward();
    if (sharded_) {
      sharded_update(lr);
    } else if (nccl_) {
      // Mean gradient and mean loss over the unit in one NCCL group, on the communicator's
      // stream; the compute stream waits for it on the GPU before clipping reads the norm.
      const DeviceBuffer buffers[2] = {{model_.gradients_device(), model_.num_parameters()},
                                       {model_.loss_device(), 1}};
      nccl_->allreduce(std::span<const DeviceBuffer>(buffers), DType::f32, ReduceOp::avg, s);
      nccl_->join(s);
    }
    if (!sharded_) {
      model_.clip_grad_norm(static_cast<float>(config_.train.grad_clip));
      model_.step(lr);
    }
    float loss = 0, norm = 0;
    model_.read_loss_and_grad_norm(loss, norm);  // the step's one host wait
    if (nccl_) nccl_->check_async();
    return {loss, norm};
  }

  // ZeRO-1 (zero.hpp's four steps on the GPU, every collective on the NCCL stream, ordered
  // against the compute stream by events, with no host wait):
  //   1. the mean gradient reduce-scattered into this rank's piece, the mean loss all-reduced;
  //   2. the global norm from every rank's shard partials (summed as float64), so clipping is
  //      exact and every rank gets the same coefficient;
  //   3. AdamW on this rank's shard;
  //   4. the updated pieces all-gathered, and the bf16 copy refreshed from them.
  void sharded_update(double lr) {
    cudaStream_t s = stream();
    const size_t piece = model_.shard().padded / static_cast<size_t>(ranks_);
    nccl_->reduce_scatter(model_.gradients_device(), piece, DType::f32, ReduceOp::avg, s);
    nccl_->allreduce(model_.loss_device(), 1, DType::f32, ReduceOp::avg, s);
    nccl_->join(s);
    model_.shard_grad_sum_squares();
    nccl_->allreduce(model_.norm_partials_device(), model_.norm_partials(), DType::f64, ReduceOp::sum, s);
    nccl_->join(s);
    model_.clip_from_partials(static_cast<float>(config_.train.grad_clip));
    model_.step(lr);
    nccl_->all_gather(model_.parameters_device(), piece, DType::f32, s);
    nccl_->join(s);
    model_.refresh_bf16();
  }

  double validation_loss(const ValidationSet& val, int batch) override {
    // The CPU validation_loss's split and sums (trainer.cpp), with the GPU's forward pass.
    const int T = val.seq_len();
    if (T > config_.model.seq_len)
      fail("validation sequences have {} tokens, more than model.seq_len = {}", T,
           config_.model.seq_len);
    std::vector<int32_t> in(static_cast<size_t>(batch) * T), tgt(static_cast<size_t>(batch) * T);
    double sums[2] = {0, 0};  // loss sum, token count
    std::vector<int64_t> mine;
    for (int64_t i = rank_; i < val.sequences(); i += ranks_) mine.push_back(i);
    for (size_t start = 0; start < mine.size(); start += static_cast<size_t>(batch)) {
      const int b = static_cast<int>(std::min<size_t>(batch, mine.size() - start));
      for (int j = 0; j < b; ++j) {
        const int32_t* seq = val.sequence(mine[start + j]);
        std::copy(seq, seq + T, in.begin() + static_cast<long>(j) * T);
        std::copy(seq + 1, seq + T + 1, tgt.begin() + static_cast<long>(j) * T);
      }
      const double mean = model_.forward(in.data(), tgt.data(), b, T, /*for_backward=*/false);
      sums[0] += mean * b * T;
      sums[1] += static_cast<double>(b) * T;
    }
    if (ranks_ > 1) mpi::allreduce_sum(std::span<double>(sums, 2), unit_comm_);
    return sums[0] / sums[1];
  }

  void download_parameters(std::span<float> host, size_t offset) override {
    model_.get_parameters(host, offset);
  }
  void upload_parameters(std::span<const float> host, size_t offset) override {
    model_.set_parameters(host, offset);
  }
  int64_t download_optimizer(std::span<float> m, std::span<float> v) override {
    model_.get_optimizer_state(m, v);
    return model_.step_count();
  }
  void upload_optimizer(std::span<const float> m, std::span<const float> v,
                        int64_t step) override {
    model_.set_optimizer_state(m, v, step);
  }

  void attach_fragments(const protocol::FragmentPlan& plan, bool leader) override {
    if (!ranges_.empty()) fail("GPU unit: fragments attached twice");
    ranges_ = HostStaging::ranges(plan, model_.layout());
    const size_t P = ranges_.size();
    if (leader)
      staging_ = std::make_unique<HostStaging>(model_.parameters_device(),
                                               model_.num_parameters(), ranges_);
    snap_busy_.assign(P, false);
    snap_started_.assign(P, false);
    staged_.assign(P, false);
  }

  void start_snapshot(int p) override {
    HostStaging& st = staging("start_snapshot");
    if (snap_busy_.at(p)) wait_snapshot(p);  // the previous one: long landed, normally
    st.start_snapshot(p, stream());
    snap_busy_[p] = true;
    snap_started_[p] = true;
  }

  bool snapshot_ready(int p) override {
    HostStaging& st = staging("snapshot_ready");
    if (!snap_started_.at(p)) fail("GPU unit: no snapshot of fragment {} was started", p);
    if (snap_busy_[p] && st.snapshot_ready(p)) snap_busy_[p] = false;
    return !snap_busy_[p];
  }

  void wait_snapshot(int p) override {
    mpi::Backoff backoff(200);
    while (!snapshot_ready(p)) backoff.idle();
  }

  std::span<const float> snapshot(int p) override { return staging("snapshot").snapshot(p); }

  void stage_merge(int p, std::span<const float> merged) override {
    HostStaging& st = staging("stage_merge");
    if (staged_.at(p)) {
      // Superseded before it was applied: the pinned buffer may be rewritten only once the
      // copy out of it has landed (a PCIe copy started at least a step ago: no real wait).
      wait_upload(p);
      st.wait_upload(p, stream());
      st.finish_upload(p, stream());
      staged_[p] = false;
    }
    const std::span<float> dst = st.merged_host(p);
    if (merged.size() != dst.size())
      fail("GPU unit: merged fragment {} has {} values, expected {}", p, merged.size(),
           dst.size());
    std::copy(merged.begin(), merged.end(), dst.begin());
    st.start_upload(p);
    staged_[p] = true;
  }

  void apply_merge(int p) override {
    cudaStream_t s = stream();
    if (ranges_.empty()) fail("GPU unit: apply_merge before attach_fragments");
    if (staging_) {
      if (!staged_.at(p)) fail("GPU unit: no merged fragment {} staged to apply", p);
      // Normally landed long ago; waiting here (not only on the GPU) is what lets the next
      // stage_merge rewrite the pinned buffer safely.
      wait_upload(p);
      staging_->apply(p, s);
      staged_[p] = false;
    }
    if (nccl_) {
      std::vector<DeviceBuffer> buffers;
      for (const HostStaging::Range& r : ranges_.at(p))
        buffers.push_back({model_.parameters_device() + r.offset, r.numel});
      nccl_->broadcast(std::span<const DeviceBuffer>(buffers), DType::f32, /*root=*/0, s);
      nccl_->join(s);
    }
    model_.refresh_bf16();  // the forward pass reads the bf16 copy
  }

  void download_fragment(int p, std::span<float> packed) override {
    size_t off = 0;
    for (const HostStaging::Range& r : fragment_ranges(p, packed.size())) {
      model_.get_parameters(packed.subspan(off, r.numel), r.offset);
      off += r.numel;
    }
  }

  void upload_fragment(int p, std::span<const float> packed) override {
    size_t off = 0;
    for (const HostStaging::Range& r : fragment_ranges(p, packed.size())) {
      model_.set_parameters(packed.subspan(off, r.numel), r.offset);
      off += r.numel;
    }
  }

  std::string describe() const override {
    cudaDeviceProp prop{};
    DDILOCO_CUDA_CHECK(cudaGetDeviceProperties(&prop, choice_.device));
    return fmt::format("cuda:{} ({}), attention {}, {} rank(s) in the unit{}", choice_.device,
                       prop.name, attention_description(), ranks_,
                       choice_.shared ? ", GPU shared with other learner ranks" : "");
  }

 private:
  // The path the model runs, what chose it, and for cudnn the library's version: "cublas
  // (run.gpu_attention: auto)", "cudnn (cuDNN 9.19.0 fused SDPA)".
  std::string attention_description() const {
    const std::string kind = attention_kind_name(model_.attention());
    if (config_.run.gpu_attention == "auto") return kind + " (run.gpu_attention: auto)";
    if (model_.attention() != AttentionKind::cudnn) return kind;
    const long v = unit_backend_cudnn_version();
    return fmt::format("{} (cuDNN {}.{}.{} fused SDPA)", kind, v / 10000, v / 100 % 100, v % 100);
  }
  size_t batch_elems() const {
    return static_cast<size_t>(config_.train.batch_size) * config_.model.seq_len;
  }
  cudaStream_t stream() const { return static_cast<cudaStream_t>(model_.stream()); }
  HostStaging& staging(const char* what) {
    if (!staging_) fail("GPU unit: {} on a rank without fragment staging (not the leader)", what);
    return *staging_;
  }
  void wait_upload(int p) {
    mpi::Backoff backoff(200);
    while (!staging_->upload_ready(p)) backoff.idle();
  }
  const std::vector<HostStaging::Range>& fragment_ranges(int p, size_t numel) const {
    if (p < 0 || static_cast<size_t>(p) >= ranges_.size())
      fail("GPU unit: no fragment {} (attach_fragments first)", p);
    size_t total = 0;
    for (const HostStaging::Range& r : ranges_[p]) total += r.numel;
    if (total != numel) fail("GPU unit: fragment {} has {} values, got {}", p, total, numel);
    return ranges_[p];
  }

  Config config_;
  MPI_Comm unit_comm_;
  int rank_, ranks_;
  DeviceChoice choice_;
  GptCuda model_;
  const bool sharded_;  // units.zero = 1 on more than one rank (sharded_update)
  Pinned<int32_t> tokens_;        // (2, B, T): inputs then targets
  DeviceArray<int32_t> d_tokens_;
  std::unique_ptr<NcclComm> nccl_;        // unit with > 1 rank
  HostStaging::FragmentRanges ranges_;    // every rank, after attach_fragments
  std::unique_ptr<HostStaging> staging_;  // leader, after attach_fragments
  std::vector<bool> snap_busy_, snap_started_, staged_;
};

std::unique_ptr<UnitBackend> make_cuda_unit(const Config& config, MPI_Comm unit_comm,
                                            MPI_Comm device_comm,
                                            std::span<const float> initial) {
  return std::make_unique<CudaUnit>(config, unit_comm, device_comm, initial);
}

}  // namespace

void install_cuda_unit_backend() {
#if DDILOCO_HAVE_CUDNN
  register_unit_backend(&make_cuda_unit, cudnn_runtime_version());
#else
  register_unit_backend(&make_cuda_unit);
#endif
}

}  // namespace ddiloco::gpu
