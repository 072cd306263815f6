// The cuDNN fused-attention graphs: see cudnn_sdpa_graph.h.
#include "src/device/cuda/cudnn_sdpa_graph.h"

#if defined(AUTOPAR_HAVE_CUDNN) && AUTOPAR_HAVE_CUDNN

namespace autopar::device::sdpa {

StatusOr<Descriptor> MakeDescriptor(cudnnBackendDescriptorType_t type) {
  Raw raw = nullptr;
  AUTOPAR_CHECK_CUDNN(cudnnBackendCreateDescriptor(type, &raw));
  return Descriptor(raw);
}

namespace {

constexpr cudnnDataType_t kF32 = CUDNN_DATA_FLOAT;

cudnnDataType_t IoType(DType dtype) {
  return dtype == DType::kF16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
}

// Collects tensors and operations, then finalizes them into a plan.
class GraphBuilder {
 public:
  StatusOr<Raw> MakeTensor(std::int64_t uid, cudnnDataType_t type, const SdpaLayout& layout,
                           bool is_virtual, bool by_value = false) {
    AUTOPAR_ASSIGN_OR_RETURN(Descriptor t, MakeDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR));
    const std::int64_t alignment = static_cast<std::int64_t>(kSdpaAlignmentBytes);
    AUTOPAR_CUDNN_SET(t.get(), CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    AUTOPAR_CUDNN_SET(t.get(), CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4,
                      layout.dims.data());
    AUTOPAR_CUDNN_SET(t.get(), CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4,
                      layout.strides.data());
    AUTOPAR_CUDNN_SET(t.get(), CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    AUTOPAR_CUDNN_SET(t.get(), CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    AUTOPAR_CUDNN_SET(t.get(), CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value) {
      AUTOPAR_CUDNN_SET(t.get(), CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    }
    AUTOPAR_CHECK_CUDNN(cudnnBackendFinalize(t.get()));
    return Keep(std::move(t));
  }
  StatusOr<Raw> Virtual(cudnnDataType_t type, const SdpaLayout& layout) {
    return MakeTensor(next_virtual_++, type, layout, /*is_virtual=*/true);
  }
  // A host scalar passed with each execution.
  StatusOr<Raw> Scalar(std::int64_t uid) {
    return MakeTensor(uid, kF32, SdpaScalarLayout(), /*is_virtual=*/false, /*by_value=*/true);
  }

  // c = a b over the last two dims, batched over the first two (a's heads may be a multiple of
  // b's: GQA), accumulating in f32.
  Status Matmul(Raw a, Raw b, Raw c) {
    AUTOPAR_ASSIGN_OR_RETURN(Descriptor mm, MakeDescriptor(CUDNN_BACKEND_MATMUL_DESCRIPTOR));
    AUTOPAR_CUDNN_SET(mm.get(), CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &kF32);
    AUTOPAR_CHECK_CUDNN(cudnnBackendFinalize(mm.get()));
    const Raw mm_raw = Keep(std::move(mm));
    AUTOPAR_ASSIGN_OR_RETURN(Descriptor op,
                             MakeDescriptor(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR));
    AUTOPAR_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                      &a);
    AUTOPAR_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                      &b);
    AUTOPAR_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                      &c);
    AUTOPAR_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                      &mm_raw);
    return AddOperation(std::move(op));
  }

  // y = mode(x[, b][, t]); `axis` only for GEN_INDEX. BINARY_SELECT is y = t ? x : b.
  Status Pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t math, Raw x, Raw b, Raw t, Raw y,
                   std::int64_t axis = -1) {
    AUTOPAR_ASSIGN_OR_RETURN(Descriptor pw, MakeDescriptor(CUDNN_BACKEND_POINTWISE_DESCRIPTOR));
    AUTOPAR_CUDNN_SET(pw.get(), CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    AUTOPAR_CUDNN_SET(pw.get(), CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math);
    if (axis >= 0) {
      AUTOPAR_CUDNN_SET(pw.get(), CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    }
    AUTOPAR_CHECK_CUDNN(cudnnBackendFinalize(pw.get()));
    const Raw pw_raw = Keep(std::move(pw));
    AUTOPAR_ASSIGN_OR_RETURN(Descriptor op,
                             MakeDescriptor(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR));
    AUTOPAR_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
                      CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw_raw);
    AUTOPAR_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                      1, &x);
    if (b != nullptr) {
      AUTOPAR_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
                        CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    }
    if (t != nullptr) {
      AUTOPAR_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_TDESC,
                        CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
    }
    AUTOPAR_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                      1, &y);
    const float one = 1.0f;
    AUTOPAR_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
    AUTOPAR_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    return AddOperation(std::move(op));
  }
  Status Unary(cudnnPointwiseMode_t mode, Raw x, Raw y) {
    return Pointwise(mode, kF32, x, nullptr, nullptr, y);
  }
  Status Binary(cudnnPointwiseMode_t mode, Raw x, Raw b, Raw y) {
    return Pointwise(mode, kF32, x, b, nullptr, y);
  }

  // y = op over the dims where y is 1 (or, for GQA's head groups, smaller than x), in f32.
  Status Reduce(cudnnReduceTensorOp_t reduce, Raw x, Raw y) {
    AUTOPAR_ASSIGN_OR_RETURN(Descriptor r, MakeDescriptor(CUDNN_BACKEND_REDUCTION_DESCRIPTOR));
    AUTOPAR_CUDNN_SET(r.get(), CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1,
                      &reduce);
    AUTOPAR_CUDNN_SET(r.get(), CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &kF32);
    AUTOPAR_CHECK_CUDNN(cudnnBackendFinalize(r.get()));
    const Raw r_raw = Keep(std::move(r));
    AUTOPAR_ASSIGN_OR_RETURN(Descriptor op,
                             MakeDescriptor(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR));
    AUTOPAR_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                      1, &x);
    AUTOPAR_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                      1, &y);
    AUTOPAR_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                      1, &r_raw);
    return AddOperation(std::move(op));
  }

  // y is x under other dims and strides (a transposed view).
  Status Reshape(Raw x, Raw y) {
    AUTOPAR_ASSIGN_OR_RETURN(Descriptor op,
                             MakeDescriptor(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR));
    AUTOPAR_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                      1, &x);
    AUTOPAR_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                      1, &y);
    return AddOperation(std::move(op));
  }

  // Finalizes the graph and the first engine configuration heuristic mode A ranks that cuDNN
  // accepts as a plan (cudnn-frontend's HEURISTICS_CHOICE policy). Any refusal is an error here;
  // the caller turns it into a decline.
  Status Build(cudnnHandle_t handle, Plan* out) {
    AUTOPAR_ASSIGN_OR_RETURN(Descriptor graph,
                             MakeDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR));
    AUTOPAR_CUDNN_SET(graph.get(), CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                      static_cast<std::int64_t>(ops_.size()), ops_.data());
    AUTOPAR_CUDNN_SET(graph.get(), CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    AUTOPAR_CHECK_CUDNN(cudnnBackendFinalize(graph.get()));
    const Raw graph_raw = Keep(std::move(graph));

    AUTOPAR_ASSIGN_OR_RETURN(Descriptor heur, MakeDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR));
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    AUTOPAR_CUDNN_SET(heur.get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                      CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph_raw);
    AUTOPAR_CUDNN_SET(heur.get(), CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    AUTOPAR_CHECK_CUDNN(cudnnBackendFinalize(heur.get()));
    std::int64_t available = 0;
    AUTOPAR_CHECK_CUDNN(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &available,
                                                 nullptr));
    if (available <= 0) {
      return Status::Error(Outcome::kInvalid, "cuDNN heuristics found no engine for the graph",
                           __FILE__, __LINE__);
    }
    std::vector<Raw> configs;
    for (std::int64_t i = 0; i < available; ++i) {
      AUTOPAR_ASSIGN_OR_RETURN(Descriptor config,
                               MakeDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
      configs.push_back(Keep(std::move(config)));
    }
    std::int64_t returned = 0;
    AUTOPAR_CHECK_CUDNN(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, available,
                                                 &returned, configs.data()));
    Keep(std::move(heur));

    Status first_refusal;
    for (std::int64_t i = 0; i < returned && i < available; ++i) {
      AUTOPAR_ASSIGN_OR_RETURN(Descriptor plan,
                               MakeDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR));
      AUTOPAR_CUDNN_SET(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1,
                        &handle);
      AUTOPAR_CUDNN_SET(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                        CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &configs[static_cast<std::size_t>(i)]);
      const cudnnStatus_t rc = cudnnBackendFinalize(plan.get());
      if (rc != CUDNN_STATUS_SUCCESS) {  // this engine cannot run the graph: try the next one
        if (first_refusal.ok()) {
          first_refusal =
              CudnnError(rc, "cudnnBackendFinalize(execution plan)", __FILE__, __LINE__);
        }
        if (CudnnOutcome(rc) == Outcome::kOom) return first_refusal;
        continue;
      }
      std::int64_t workspace = 0, count = 0;
      AUTOPAR_CHECK_CUDNN(cudnnBackendGetAttribute(plan.get(),
                                                   CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                   CUDNN_TYPE_INT64, 1, &count, &workspace));
      out->workspace_bytes = workspace;
      out->plan = Keep(std::move(plan));
      out->parts = std::move(owned_);
      return OkStatus();
    }
    if (first_refusal.ok()) {
      first_refusal = Status::Error(Outcome::kInvalid, "cuDNN heuristics returned no engine",
                                    __FILE__, __LINE__);
    }
    return first_refusal;
  }

 private:
  Raw Keep(Descriptor d) {
    owned_.push_back(std::move(d));
    return owned_.back().get();
  }
  Status AddOperation(Descriptor op) {
    AUTOPAR_CHECK_CUDNN(cudnnBackendFinalize(op.get()));
    ops_.push_back(Keep(std::move(op)));
    return OkStatus();
  }

  std::vector<Descriptor> owned_;
  std::vector<Raw> ops_;
  std::int64_t next_virtual_ = kFirstVirtual;
};

// scores where key j <= query i, -inf elsewhere (cudnn-frontend's top-left causal mask: right
// bound 0, no left bound).
StatusOr<Raw> CausalMask(GraphBuilder& g, Raw scores, const SdpaLayout& layout) {
  AUTOPAR_ASSIGN_OR_RETURN(const Raw neg_inf, g.Scalar(kUidNegInf));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw row, g.Virtual(CUDNN_DATA_INT32, layout));
  AUTOPAR_RETURN_IF_ERROR(
      g.Pointwise(CUDNN_POINTWISE_GEN_INDEX, kF32, scores, nullptr, nullptr, row, /*axis=*/2));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw col, g.Virtual(CUDNN_DATA_INT32, layout));
  AUTOPAR_RETURN_IF_ERROR(
      g.Pointwise(CUDNN_POINTWISE_GEN_INDEX, kF32, scores, nullptr, nullptr, col, /*axis=*/3));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw visible, g.Virtual(CUDNN_DATA_BOOLEAN, layout));
  AUTOPAR_RETURN_IF_ERROR(
      g.Pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, nullptr, visible));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw masked, g.Virtual(kF32, layout));
  AUTOPAR_RETURN_IF_ERROR(
      g.Pointwise(CUDNN_POINTWISE_BINARY_SELECT, kF32, scores, neg_inf, visible, masked));
  return masked;
}

// O = softmax(scale Q K^T [masked]) V; stats = max + log(sum exp(. - max)) per row.
Status BuildForward(const SdpaKey& k, GraphBuilder& g) {
  const cudnnDataType_t io = IoType(k.dtype);
  const SdpaLayout scores = SdpaScoreLayout(k), rows = SdpaRowStatsLayout(k);
  AUTOPAR_ASSIGN_OR_RETURN(const Raw q, g.MakeTensor(kUidQ, io, SdpaQLayout(k), false));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw kt,
                           g.MakeTensor(kUidK, io, SdpaTransposed(SdpaKvLayout(k)), false));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw v, g.MakeTensor(kUidV, io, SdpaKvLayout(k), false));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw o, g.MakeTensor(kUidO, io, SdpaOLayout(k), false));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw stats, g.MakeTensor(kUidStats, kF32, rows, false));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw scale, g.Scalar(kUidScale));

  AUTOPAR_ASSIGN_OR_RETURN(const Raw s, g.Virtual(kF32, scores));
  AUTOPAR_RETURN_IF_ERROR(g.Matmul(q, kt, s));
  AUTOPAR_ASSIGN_OR_RETURN(Raw logits, g.Virtual(kF32, scores));
  AUTOPAR_RETURN_IF_ERROR(g.Binary(CUDNN_POINTWISE_MUL, s, scale, logits));
  if (k.mask == SdpaMask::kCausalTopLeft) {
    AUTOPAR_ASSIGN_OR_RETURN(logits, CausalMask(g, logits, scores));
  }
  AUTOPAR_ASSIGN_OR_RETURN(const Raw max, g.Virtual(kF32, rows));
  AUTOPAR_RETURN_IF_ERROR(g.Reduce(CUDNN_REDUCE_TENSOR_MAX, logits, max));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw centered, g.Virtual(kF32, scores));
  AUTOPAR_RETURN_IF_ERROR(g.Binary(CUDNN_POINTWISE_SUB, logits, max, centered));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw e, g.Virtual(kF32, scores));
  AUTOPAR_RETURN_IF_ERROR(g.Unary(CUDNN_POINTWISE_EXP, centered, e));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw sum, g.Virtual(kF32, rows));
  AUTOPAR_RETURN_IF_ERROR(g.Reduce(CUDNN_REDUCE_TENSOR_ADD, e, sum));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw log_sum, g.Virtual(kF32, rows));
  AUTOPAR_RETURN_IF_ERROR(g.Unary(CUDNN_POINTWISE_LOG, sum, log_sum));
  AUTOPAR_RETURN_IF_ERROR(g.Binary(CUDNN_POINTWISE_ADD, max, log_sum, stats));
  // P in the input type: the second product is a bf16/f16 tensor-core GEMM.
  AUTOPAR_ASSIGN_OR_RETURN(const Raw p, g.Virtual(io, scores));
  AUTOPAR_RETURN_IF_ERROR(g.Binary(CUDNN_POINTWISE_DIV, e, sum, p));
  return g.Matmul(p, v, o);
}

// dV = P^T dO, dS = P (dO V^T - rowsum(dO O)) scale, dK = dS^T Q, dQ = dS K, with P = exp(scale
// Q K^T [masked] - stats) recomputed; GQA's per-query-head dK, dV are summed over each group.
// A key/value-side gradient, out = scores^T rhs (dV = P^T dO, dK = dS^T Q): the scores
// [b, h_q, s_q, s_kv] are reshaped to their transpose; with GQA the product is formed per query
// head and then summed over each kv head's group of query heads, as cudnn-frontend does.
Status KvGrad(GraphBuilder& g, const SdpaKey& k, cudnnDataType_t io, Raw scores, Raw rhs,
              Raw out) {
  AUTOPAR_ASSIGN_OR_RETURN(const Raw transposed, g.Virtual(io, SdpaScoreTransposedLayout(k)));
  AUTOPAR_RETURN_IF_ERROR(g.Reshape(scores, transposed));
  if (k.heads_q == k.heads_kv) return g.Matmul(transposed, rhs, out);
  AUTOPAR_ASSIGN_OR_RETURN(const Raw per_query_head, g.Virtual(io, SdpaFullHeadKvGradLayout(k)));
  AUTOPAR_RETURN_IF_ERROR(g.Matmul(transposed, rhs, per_query_head));
  return g.Reduce(CUDNN_REDUCE_TENSOR_ADD, per_query_head, out);
}

Status BuildBackward(const SdpaKey& k, GraphBuilder& g) {
  const cudnnDataType_t io = IoType(k.dtype);
  const SdpaLayout scores = SdpaScoreLayout(k), rows = SdpaRowStatsLayout(k);
  const SdpaLayout kv = SdpaKvLayout(k);
  AUTOPAR_ASSIGN_OR_RETURN(const Raw q, g.MakeTensor(kUidQ, io, SdpaQLayout(k), false));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw kt, g.MakeTensor(kUidK, io, SdpaTransposed(kv), false));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw vt, g.MakeTensor(kUidV, io, SdpaTransposed(kv), false));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw o, g.MakeTensor(kUidO, io, SdpaOLayout(k), false));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw d_o, g.MakeTensor(kUidDo, io, SdpaOLayout(k), false));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw stats, g.MakeTensor(kUidStats, kF32, rows, false));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw dq, g.MakeTensor(kUidDq, io, SdpaQLayout(k), false));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw dk, g.MakeTensor(kUidDk, io, kv, false));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw dv, g.MakeTensor(kUidDv, io, kv, false));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw softmax_sum, g.MakeTensor(kUidSoftmaxSum, kF32, rows, false));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw dq_accum,
                           g.MakeTensor(kUidDqAccum, kF32, SdpaDqAccumLayout(k), false));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw scale, g.Scalar(kUidScale));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw one, g.Scalar(kUidOne));

  // softmax_sum = rowsum(dO * O) (times the dropout scale, 1 here, as the frontend writes it).
  AUTOPAR_ASSIGN_OR_RETURN(const Raw do_o, g.Virtual(kF32, SdpaDqAccumLayout(k)));
  AUTOPAR_RETURN_IF_ERROR(g.Binary(CUDNN_POINTWISE_MUL, d_o, o, do_o));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw row_sum, g.Virtual(kF32, rows));
  AUTOPAR_RETURN_IF_ERROR(g.Reduce(CUDNN_REDUCE_TENSOR_ADD, do_o, row_sum));
  AUTOPAR_RETURN_IF_ERROR(g.Binary(CUDNN_POINTWISE_MUL, row_sum, one, softmax_sum));

  // P = exp(scale Q K^T - stats), masked.
  AUTOPAR_ASSIGN_OR_RETURN(const Raw s, g.Virtual(kF32, scores));
  AUTOPAR_RETURN_IF_ERROR(g.Matmul(q, kt, s));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw scaled, g.Virtual(kF32, scores));
  AUTOPAR_RETURN_IF_ERROR(g.Binary(CUDNN_POINTWISE_MUL, s, scale, scaled));
  AUTOPAR_ASSIGN_OR_RETURN(Raw shifted, g.Virtual(kF32, scores));
  AUTOPAR_RETURN_IF_ERROR(g.Binary(CUDNN_POINTWISE_SUB, scaled, stats, shifted));
  if (k.mask == SdpaMask::kCausalTopLeft) {
    AUTOPAR_ASSIGN_OR_RETURN(shifted, CausalMask(g, shifted, scores));
  }
  AUTOPAR_ASSIGN_OR_RETURN(const Raw p, g.Virtual(kF32, scores));
  AUTOPAR_RETURN_IF_ERROR(g.Unary(CUDNN_POINTWISE_EXP, shifted, p));

  // dV = P^T dO.
  AUTOPAR_RETURN_IF_ERROR(KvGrad(g, k, io, p, d_o, dv));

  // dS = P (dO V^T - softmax_sum) scale.
  AUTOPAR_ASSIGN_OR_RETURN(const Raw dp, g.Virtual(kF32, scores));
  AUTOPAR_RETURN_IF_ERROR(g.Matmul(d_o, vt, dp));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw dp_centered, g.Virtual(kF32, scores));
  AUTOPAR_RETURN_IF_ERROR(g.Binary(CUDNN_POINTWISE_SUB, dp, softmax_sum, dp_centered));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw ds_unscaled, g.Virtual(kF32, scores));
  AUTOPAR_RETURN_IF_ERROR(g.Binary(CUDNN_POINTWISE_MUL, dp_centered, p, ds_unscaled));
  AUTOPAR_ASSIGN_OR_RETURN(const Raw ds, g.Virtual(kF32, scores));
  AUTOPAR_RETURN_IF_ERROR(g.Binary(CUDNN_POINTWISE_MUL, ds_unscaled, scale, ds));

  // dK = dS^T Q.
  AUTOPAR_RETURN_IF_ERROR(KvGrad(g, k, io, ds, q, dk));

  // dQ = dS K, accumulated in f32 and then converted into dq.
  AUTOPAR_ASSIGN_OR_RETURN(const Raw k_rows, g.Virtual(io, kv));
  AUTOPAR_RETURN_IF_ERROR(g.Reshape(kt, k_rows));
  AUTOPAR_RETURN_IF_ERROR(g.Matmul(ds, k_rows, dq_accum));
  return g.Unary(CUDNN_POINTWISE_IDENTITY, dq_accum, dq);
}

}  // namespace

Status BuildPlan(cudnnHandle_t handle, const SdpaKey& key, Plan* plan) {
  GraphBuilder graph;
  AUTOPAR_RETURN_IF_ERROR(key.direction == SdpaDirection::kForward ? BuildForward(key, graph)
                                                                   : BuildBackward(key, graph));
  return graph.Build(handle, plan);
}

}  // namespace autopar::device::sdpa

#endif  // AUTOPAR_HAVE_CUDNN
