// cuDNN's fused flash attention through the backend graph API (ddiloco/gpu/cudnn_attention.hpp).
//
// The graphs are the ones the cuDNN frontend (cudnn-frontend 1.x,
// include/cudnn_frontend/node/scaled_dot_product_flash_attention.h) builds for
// sdpa(causal, attn_scale, generate_stats) and sdpa_backward(causal, attn_scale, deterministic)
// with bf16 I/O and fp32 intermediates, written out node by node: cuDNN recognises the fused
// flash attention patterns by their operation graphs (cuDNN Developer Guide, Graph API,
// "Specialized Runtime Fusion Engines"), so the node order, the data types of the virtual
// tensors and the strides follow the frontend's lowering for cuDNN 9.x below 9.21 (where
// softmax and the causal mask are still pointwise/reduction composites). The views come
// from sdpa_shape.hpp.
#include "ddiloco/gpu/cudnn_attention.hpp"

#include <cudnn.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ddiloco/error.hpp"
#include "ddiloco/gpu/check.hpp"
#include "ddiloco/sdpa_shape.hpp"

namespace ddiloco::gpu {

namespace {

[[noreturn]] void throw_cudnn_error(cudnnStatus_t status, const std::string& what,
                                    const char* file, int line) {
  char detail[1024] = "";
  cudnnGetLastErrorString(detail, sizeof detail);
  fail("cuDNN error {} in {} at {}:{}{}{}", cudnnGetErrorString(status), what, file, line,
       detail[0] != '\0' ? ": " : "", detail);
}

#define DDILOCO_CUDNN_CHECK(call)                                                    \
  do {                                                                               \
    const cudnnStatus_t ddiloco_status_ = (call);                                    \
    if (ddiloco_status_ != CUDNN_STATUS_SUCCESS)                                     \
      throw_cudnn_error(ddiloco_status_, #call, __FILE__, __LINE__);                 \
  } while (0)

// Owner of one backend descriptor (cudnnBackendCreateDescriptor / DestroyDescriptor).
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type) {
    DDILOCO_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_));
  }
  ~Descriptor() {
    if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
  }
  Descriptor(Descriptor&& other) noexcept : d_(std::exchange(other.d_, nullptr)) {}
  Descriptor& operator=(Descriptor&& other) noexcept {
    std::swap(d_, other.d_);
    return *this;
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }

  Descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                  int64_t count, const void* values) {
    const cudnnStatus_t st = cudnnBackendSetAttribute(d_, name, type, count, values);
    if (st != CUDNN_STATUS_SUCCESS)
      throw_cudnn_error(st, fmt::format("cudnnBackendSetAttribute({})", static_cast<int>(name)),
                        __FILE__, __LINE__);
    return *this;
  }
  Descriptor& set(cudnnBackendAttributeName_t name, const Descriptor& value) {
    const cudnnBackendDescriptor_t raw = value.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw);
  }
  Descriptor& finalize() {
    DDILOCO_CUDNN_CHECK(cudnnBackendFinalize(d_));
    return *this;
  }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// A finalized execution plan and what executing it needs besides the caller's pointers.
struct Plan {
  Descriptor plan{CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR};
  std::vector<int64_t> io_uids;   // tensors in memory, in the order execute() takes pointers
  std::vector<int64_t> scalar_uids;
  std::vector<float> scalar_values;  // by-value tensors: their host values, bound at execute
  int64_t workspace = 0;             // the engine's own workspace, bytes
};

// The tensors and operations of one operation graph. Tensors are named by their unique id,
// which is their index + 1; ops reference them by id.
class GraphBuilder {
 public:
  // A tensor in memory (bound through the variant pack), 16-byte aligned.
  int64_t tensor(const SdpaTensor& t, cudnnDataType_t type) {
    return add_tensor({t.dims.begin(), t.dims.end()}, {t.strides.begin(), t.strides.end()}, type,
                      false, false);
  }
  // A tensor the fused kernel never writes to memory.
  int64_t virt(const SdpaTensor& t, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    return add_tensor({t.dims.begin(), t.dims.end()}, {t.strides.begin(), t.strides.end()}, type,
                      true, false);
  }
  // An fp32 scalar passed by value at execution: 4-D like llm.c's attention scale, or 1-D
  // like the constants the frontend adds itself (the graphs stay the ones known to fuse).
  int64_t scalar(float value, int rank = 1) {
    const std::vector<int64_t> ones(static_cast<size_t>(rank), 1);
    const int64_t uid = add_tensor(ones, ones, CUDNN_DATA_FLOAT, false, true);
    scalars_.emplace_back(uid, value);
    return uid;
  }

  void matmul(int64_t a, int64_t b, int64_t c) {
    Descriptor desc(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    desc.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp).finalize();
    Descriptor op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_MATMUL_ADESC, at(a))
        .set(CUDNN_ATTR_OPERATION_MATMUL_BDESC, at(b))
        .set(CUDNN_ATTR_OPERATION_MATMUL_CDESC, at(c))
        .set(CUDNN_ATTR_OPERATION_MATMUL_DESC, desc)
        .finalize();
    ops_.push_back(std::move(op));
  }

  // y = mode(x[, b[, t]]); math in `math`; axis for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, int64_t x, int64_t y, int64_t b = 0, int64_t t = 0,
                 cudnnDataType_t math = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    Descriptor desc(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    desc.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
        .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math);
    if (mode == CUDNN_POINTWISE_GEN_INDEX)
      desc.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    desc.finalize();
    Descriptor op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, desc)
        .set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, at(x))
        .set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, at(y));
    if (b != 0) op.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, at(b));
    if (t != 0) op.set(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, at(t));
    const float one = 1.0f;
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one)
        .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one)
        .finalize();
    ops_.push_back(std::move(op));
  }

  // y = mode(x, b) into a new virtual tensor shaped like `shape`; returns its id.
  int64_t apply(cudnnPointwiseMode_t mode, int64_t x, int64_t b, const SdpaTensor& shape,
                cudnnDataType_t out = CUDNN_DATA_FLOAT) {
    const int64_t y = virt(shape, out);
    pointwise(mode, x, y, b);
    return y;
  }

  // y = reduction of x over the axes where y has extent 1.
  void reduce(cudnnReduceTensorOp_t mode, int64_t x, int64_t y) {
    Descriptor desc(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    desc.set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp)
        .set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode)
        .finalize();
    Descriptor op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_REDUCTION_DESC, desc)
        .set(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, at(x))
        .set(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, at(y))
        .finalize();
    ops_.push_back(std::move(op));
  }

  // y = x read through y's dimensions and strides (a transpose or a type change).
  void reshape(int64_t x, int64_t y) {
    Descriptor op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, at(x))
        .set(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, at(y))
        .finalize();
    ops_.push_back(std::move(op));
  }

  // The finalized operation graph, then the first engine configuration from cuDNN's
  // heuristics (mode A, as llm.c asks for; then the fallback list) whose plan finalizes.
  Plan build(cudnnHandle_t handle, std::vector<int64_t> io_uids) const;

 private:
  int64_t add_tensor(const std::vector<int64_t>& dims, const std::vector<int64_t>& strides,
                     cudnnDataType_t type, bool is_virtual, bool by_value) {
    const int64_t uid = static_cast<int64_t>(tensors_.size()) + 1;
    const int64_t alignment = 16, rank = static_cast<int64_t>(dims.size());
    Descriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type)
        .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, rank, dims.data())
        .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, rank, strides.data())
        .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid)
        .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment)
        .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual)
        .set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value)
        .finalize();
    tensors_.push_back(std::move(t));
    return uid;
  }
  const Descriptor& at(int64_t uid) const { return tensors_.at(static_cast<size_t>(uid - 1)); }

  std::vector<Descriptor> tensors_, ops_;
  std::vector<std::pair<int64_t, float>> scalars_;
};

// The engine configurations cuDNN's heuristics in `mode` propose for `graph`, best first;
// none when that mode has nothing for it.
std::vector<Descriptor> engine_configs(const Descriptor& graph, cudnnBackendHeurMode_t mode) {
  Descriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)
      .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (cudnnBackendFinalize(heur.get()) != CUDNN_STATUS_SUCCESS) return {};
  int64_t count = 0;
  DDILOCO_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
  std::vector<Descriptor> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  int64_t got = 0;
  DDILOCO_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                               raw.data()));
  configs.erase(configs.begin() + std::min(got, count), configs.end());
  return configs;
}

// The first configuration whose plan finalizes (an engine may refuse the graph on this GPU);
// false with the last refusal in `why` when none does.
bool finalize_plan(cudnnHandle_t handle, const Descriptor& graph, Plan& out, std::string& why) {
  for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    for (const Descriptor& config : engine_configs(graph, mode)) {
      Descriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      // Required before cuDNN 9.8, deprecated after; harmless to set.
      plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
          .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
      const cudnnStatus_t st = cudnnBackendFinalize(plan.get());
      if (st == CUDNN_STATUS_SUCCESS) {
        out.plan = std::move(plan);
        return true;
      }
      char detail[1024] = "";
      cudnnGetLastErrorString(detail, sizeof detail);
      why = fmt::format("{} {}", cudnnGetErrorString(st), detail);
    }
  }
  return false;
}

Plan GraphBuilder::build(cudnnHandle_t handle, std::vector<int64_t> io_uids) const {
  std::vector<cudnnBackendDescriptor_t> ops;
  for (const Descriptor& op : ops_) ops.push_back(op.get());
  Descriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
            static_cast<int64_t>(ops.size()), ops.data())
      .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
      .finalize();
  Plan p;
  std::string why = "the heuristics returned no engine configuration";
  if (!finalize_plan(handle, graph, p, why))
    fail("cuDNN attention: no engine runs this graph on this GPU ({})", why);
  int64_t got = 0;
  DDILOCO_CUDNN_CHECK(cudnnBackendGetAttribute(p.plan.get(),
                                               CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                               CUDNN_TYPE_INT64, 1, &got, &p.workspace));
  p.io_uids = std::move(io_uids);
  for (const auto& [uid, value] : scalars_) {
    p.scalar_uids.push_back(uid);
    p.scalar_values.push_back(value);
  }
  return p;
}

// Keeps S[i][j] where query row i ≥ key column j and puts −∞ elsewhere: the top-left causal
// mask as the frontend's diagonal band mask lowers it (right bound 0). Before cuDNN 9.10 the
// frontend masks with the lowest finite float instead of −∞, which those versions prefer.
int64_t causal_mask(GraphBuilder& g, int64_t s, const SdpaTensor& shape) {
  const int64_t row = g.virt(shape, CUDNN_DATA_INT32), col = g.virt(shape, CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s, row, 0, 0, CUDNN_DATA_FLOAT, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s, col, 0, 0, CUDNN_DATA_FLOAT, 3);
  const int64_t keep = g.virt(shape, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, keep, col, 0, CUDNN_DATA_BOOLEAN);
  const int64_t neg_inf = g.scalar(cudnn_runtime_version() < 91000
                                       ? std::numeric_limits<float>::lowest()
                                       : -std::numeric_limits<float>::infinity());
  const int64_t out = g.virt(shape);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, out, neg_inf, keep);
  return out;
}

// Forward: S = scale·Q·Kᵀ, causal mask, softmax with its statistics (max m, Σ exp, lse =
// m + log Σ), O = P·V with P in bf16 (the second matmul's A operand must be the I/O type).
// Pointers in io order: q, kᵀ, v (all in qkv), o, stats.
Plan build_forward(cudnnHandle_t handle, const SdpaLayout& l) {
  GraphBuilder g;
  const int64_t q = g.tensor(l.q, CUDNN_DATA_BFLOAT16), kt = g.tensor(l.k_t, CUDNN_DATA_BFLOAT16),
                v = g.tensor(l.v, CUDNN_DATA_BFLOAT16), o = g.tensor(l.o, CUDNN_DATA_BFLOAT16),
                stats = g.tensor(l.stats, CUDNN_DATA_FLOAT);
  const int64_t scale = g.scalar(l.scale, 4);
  const int64_t s = g.virt(l.scores);
  g.matmul(q, kt, s);
  const int64_t masked = causal_mask(g, g.apply(CUDNN_POINTWISE_MUL, s, scale, l.scores), l.scores);
  const int64_t m = g.virt(l.rows), sum = g.virt(l.rows);
  g.reduce(CUDNN_REDUCE_TENSOR_MAX, masked, m);
  const int64_t e = g.virt(l.scores);
  g.pointwise(CUDNN_POINTWISE_EXP, g.apply(CUDNN_POINTWISE_SUB, masked, m, l.scores), e);
  g.reduce(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  const int64_t log_sum = g.virt(l.rows);
  g.pointwise(CUDNN_POINTWISE_LOG, sum, log_sum);
  g.pointwise(CUDNN_POINTWISE_ADD, m, stats, log_sum);
  const int64_t p = g.apply(CUDNN_POINTWISE_DIV, e, sum, l.scores, CUDNN_DATA_BFLOAT16);
  g.matmul(p, v, o);
  return g.build(handle, {q, kt, v, o, stats});
}

// Backward, deterministic (dQ straight from dS·K, no fp32 atomics buffer), as llm.c asks:
// D = Σ_d dO⊙O into the workspace, P = exp(scale·Q·Kᵀ − lse) masked, dV = Pᵀ·dO,
// dS = P ⊙ (dO·Vᵀ − D)·scale, dK = dSᵀ·Q, dQ = dS·K.
// Pointers in io order: q, kᵀ, vᵀ (in qkv), o, do, stats, dq, dk, dv (in dqkv), D (workspace).
Plan build_backward(cudnnHandle_t handle, const SdpaLayout& l) {
  GraphBuilder g;
  const cudnnDataType_t io = CUDNN_DATA_BFLOAT16;
  const int64_t q = g.tensor(l.q, io), kt = g.tensor(l.k_t, io), vt = g.tensor(l.v_t, io),
                o = g.tensor(l.o, io), d_o = g.tensor(l.o, io),
                stats = g.tensor(l.stats, CUDNN_DATA_FLOAT), dq = g.tensor(l.q, io),
                dk = g.tensor(l.k, io), dv = g.tensor(l.v, io),
                d_sum = g.tensor(l.rows, CUDNN_DATA_FLOAT);
  const int64_t scale = g.scalar(l.scale, 4), one = g.scalar(1.0f);
  const int64_t row_dot = g.virt(l.rows);
  g.reduce(CUDNN_REDUCE_TENSOR_ADD, g.apply(CUDNN_POINTWISE_MUL, d_o, o, l.do_o), row_dot);
  g.pointwise(CUDNN_POINTWISE_MUL, row_dot, d_sum, one);

  const int64_t s = g.virt(l.scores);
  g.matmul(q, kt, s);
  const int64_t scaled = g.apply(CUDNN_POINTWISE_MUL, s, scale, l.scores);
  const int64_t shifted = g.apply(CUDNN_POINTWISE_SUB, scaled, stats, l.scores);
  const int64_t p = g.virt(l.scores);
  g.pointwise(CUDNN_POINTWISE_EXP, causal_mask(g, shifted, l.scores), p);
  const int64_t p_t = g.virt(l.scores_t, io);
  g.reshape(p, p_t);
  g.matmul(p_t, d_o, dv);

  const int64_t dp = g.virt(l.scores);
  g.matmul(d_o, vt, dp);
  const int64_t ds = g.apply(CUDNN_POINTWISE_MUL, g.apply(CUDNN_POINTWISE_SUB, dp, d_sum, l.scores),
                             p, l.scores);
  const int64_t ds_scaled = g.apply(CUDNN_POINTWISE_MUL, ds, scale, l.scores);
  const int64_t ds_t = g.virt(l.scores_t, io);
  g.reshape(ds_scaled, ds_t);
  g.matmul(ds_t, q, dk);
  const int64_t k = g.virt(l.k);
  g.reshape(kt, k);
  g.matmul(ds_scaled, k, dq);
  return g.build(handle, {q, kt, vt, o, d_o, stats, dq, dk, dv, d_sum});
}

void require_aligned(const void* p, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
    fail("cuDNN attention: {} must be 16-byte aligned, got {}", what, p);
}

// Element (0,0,0,0) of view `t` in buffer `base`: descriptors carry no offset, so the
// variant pack points at each view's first element (K and V start C and 2C into qkv's rows).
template <typename T>
void* first(const T* base, const SdpaTensor& t) {
  return const_cast<T*>(base) + t.offset;
}

}  // namespace

long cudnn_runtime_version() { return static_cast<long>(cudnnGetVersion()); }

struct CudnnAttention::Impl {
  cudaStream_t stream;
  cudnnHandle_t handle = nullptr;
  long version = cudnn_runtime_version();
  // (B, T, C, NH, backward). Unbounded: a model runs a handful of shapes (training batch,
  // validation batch), each plan a few descriptors.
  std::map<std::tuple<int, int, int, int, bool>, Plan> plans;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;

  explicit Impl(cudaStream_t s) : stream(s) {
    DDILOCO_CUDNN_CHECK(cudnnCreate(&handle));
    DDILOCO_CUDNN_CHECK(cudnnSetStream(handle, stream));
  }
  ~Impl() {
    plans.clear();  // plans before the handle they were built with
    if (workspace != nullptr) cudaFree(workspace);
    if (handle != nullptr) cudnnDestroy(handle);
  }

  Plan& plan(const SdpaLayout& l, bool backward) {
    check_sdpa(l, SdpaDtype::bfloat16, backward, version);
    const auto key = std::make_tuple(l.B, l.T, l.C, l.NH, backward);
    auto it = plans.find(key);
    if (it == plans.end()) {
      Plan built = backward ? build_backward(handle, l) : build_forward(handle, l);
      it = plans.emplace(key, std::move(built)).first;
    }
    return it->second;
  }

  // At least `bytes` of workspace; a smaller one is freed once the work queued on it is done.
  char* reserve(size_t bytes) {
    if (bytes > workspace_bytes) {
      DDILOCO_CUDA_CHECK(cudaStreamSynchronize(stream));
      if (workspace != nullptr) DDILOCO_CUDA_CHECK(cudaFree(workspace));
      workspace = nullptr;
      workspace_bytes = 0;
      DDILOCO_CUDA_CHECK(cudaMalloc(&workspace, bytes));
      workspace_bytes = bytes;
    }
    return static_cast<char*>(workspace);
  }

  void execute(Plan& p, const std::vector<void*>& io, void* engine_workspace) {
    std::vector<int64_t> uids = p.io_uids;
    std::vector<void*> pointers = io;
    for (size_t i = 0; i < p.scalar_uids.size(); ++i) {
      uids.push_back(p.scalar_uids[i]);
      pointers.push_back(&p.scalar_values[i]);
    }
    Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
             static_cast<int64_t>(uids.size()), uids.data())
        .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
             static_cast<int64_t>(pointers.size()), pointers.data())
        .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &engine_workspace)
        .finalize();
    DDILOCO_CUDNN_CHECK(cudnnBackendExecute(handle, p.plan.get(), pack.get()));
  }
};

CudnnAttention::CudnnAttention(cudaStream_t stream) : impl_(std::make_unique<Impl>(stream)) {}
CudnnAttention::~CudnnAttention() = default;

void CudnnAttention::forward(__nv_bfloat16* out, float* stats, const __nv_bfloat16* qkv, int B,
                             int T, int C, int NH) {
  require_aligned(out, "out");
  require_aligned(stats, "stats");
  require_aligned(qkv, "qkv");
  const SdpaLayout l = sdpa_layout(B, T, C, NH);
  Plan& p = impl_->plan(l, false);
  char* ws = impl_->reserve(static_cast<size_t>(p.workspace));
  impl_->execute(p, {first(qkv, l.q), first(qkv, l.k_t), first(qkv, l.v), out, stats}, ws);
}

void CudnnAttention::backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dout,
                              const __nv_bfloat16* qkv, const __nv_bfloat16* out,
                              const float* stats, int B, int T, int C, int NH) {
  require_aligned(dqkv, "dqkv");
  require_aligned(dout, "dout");
  require_aligned(qkv, "qkv");
  require_aligned(out, "out");
  require_aligned(stats, "stats");
  const SdpaLayout l = sdpa_layout(B, T, C, NH);
  Plan& p = impl_->plan(l, true);
  char* ws = impl_->reserve(static_cast<size_t>(l.engine_workspace_offset + p.workspace));
  impl_->execute(p,
                 {first(qkv, l.q), first(qkv, l.k_t), first(qkv, l.v_t), first(out, l.o),
                  first(dout, l.o), first(stats, l.stats), first(dqkv, l.q), first(dqkv, l.k),
                  first(dqkv, l.v), ws},
                 ws + l.engine_workspace_offset);
}

size_t CudnnAttention::plans() const { return impl_->plans.size(); }
size_t CudnnAttention::workspace_bytes() const { return impl_->workspace_bytes; }

}  // namespace ddiloco::gpu
