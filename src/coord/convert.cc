#include "autopar/coord/convert.h"

namespace autopar::coord {

pb::ParallelConfig ToProto(const ParallelConfig& c) {
  pb::ParallelConfig p;
  p.set_tp(c.tp);
  p.set_pp(c.pp);
  p.set_dp(c.dp);
  p.set_cp(c.cp);
  p.set_up(c.up);
  p.set_ep(c.ep);
  p.set_etp(c.etp);
  p.set_pp_first(c.pp_first);
  p.set_pp_last(c.pp_last);
  p.set_split_embedding(c.split_embedding);
  p.set_split_loss(c.split_loss);
  p.set_flex_dispatcher(c.flex_dispatcher);
  p.set_cp_allgather(c.cp_allgather);
  p.set_fp8_param_gather(c.fp8_param_gather);
  p.set_vpp(c.vpp);
  p.set_mbs(c.mbs);
  p.set_sp(c.sp);
  p.set_recompute(c.recompute == Recompute::kNone        ? pb::RECOMPUTE_NONE
                  : c.recompute == Recompute::kSelective ? pb::RECOMPUTE_SELECTIVE
                                                         : pb::RECOMPUTE_FULL);
  p.set_recompute_layers(c.recompute_layers);
  p.set_recompute_modules(c.recompute_modules);
  p.set_dist_opt(c.dist_opt);
  p.set_overlap_grad_reduce(c.overlap_grad_reduce);
  p.set_overlap_param_gather(c.overlap_param_gather);
  p.set_grad_reduce_dtype(c.grad_reduce_dtype == GradReduceDtype::kBF16 ? pb::GRAD_REDUCE_BF16
                                                                        : pb::GRAD_REDUCE_FP32);
  return p;
}

ParallelConfig FromProto(const pb::ParallelConfig& p) {
  ParallelConfig c;
  c.tp = p.tp();
  c.pp = p.pp();
  c.dp = p.dp();
  c.cp = p.cp();
  c.up = p.up();
  c.ep = p.ep();
  c.etp = p.etp() == c.tp ? 0 : p.etp();  // the canonical form
  c.pp_first = p.pp_first();
  c.pp_last = p.pp_last();
  c.split_embedding = p.split_embedding();
  c.split_loss = p.split_loss();
  c.flex_dispatcher = p.flex_dispatcher();
  c.cp_allgather = p.cp_allgather();
  c.fp8_param_gather = p.fp8_param_gather();
  c.vpp = p.vpp();
  c.mbs = p.mbs();
  c.sp = p.sp();
  c.recompute = p.recompute() == pb::RECOMPUTE_SELECTIVE ? Recompute::kSelective
                : p.recompute() == pb::RECOMPUTE_FULL    ? Recompute::kFull
                                                         : Recompute::kNone;
  c.recompute_layers = p.recompute_layers();
  // The canonical form: core_attn alone is 0, and only selective recompute has modules.
  c.recompute_modules = static_cast<uint8_t>(p.recompute_modules() & kRecomputeModulesAll);
  if (c.recompute != Recompute::kSelective || c.recompute_modules == kRecomputeCoreAttn) {
    c.recompute_modules = 0;
  }
  c.dist_opt = p.dist_opt();
  if (p.has_overlap_grad_reduce()) c.overlap_grad_reduce = p.overlap_grad_reduce();
  c.overlap_param_gather =
      p.has_overlap_param_gather() ? p.overlap_param_gather() : OverlapParamGatherAllowed(c);
  c.grad_reduce_dtype = p.grad_reduce_dtype() == pb::GRAD_REDUCE_BF16 ? GradReduceDtype::kBF16
                                                                      : GradReduceDtype::kFP32;
  return c;
}

pb::TrialStatus ToProto(search::Outcome o) {
  switch (o) {
    case search::Outcome::kOk:
      return pb::OK;
    case search::Outcome::kOom:
      return pb::OOM;
    case search::Outcome::kTimeout:
      return pb::TIMEOUT;
    case search::Outcome::kCommError:
      return pb::COMM_ERROR;
    case search::Outcome::kDeviceError:
      return pb::DEVICE_ERROR;
    case search::Outcome::kNonfinite:
      return pb::NONFINITE;
    case search::Outcome::kWorkerLost:
      return pb::WORKER_LOST;
    case search::Outcome::kInvalid:
      return pb::INVALID;
  }
  return pb::INVALID;
}

search::Outcome FromProto(pb::TrialStatus s) {
  switch (s) {
    case pb::OK:
      return search::Outcome::kOk;
    case pb::OOM:
      return search::Outcome::kOom;
    case pb::TIMEOUT:
      return search::Outcome::kTimeout;
    case pb::COMM_ERROR:
      return search::Outcome::kCommError;
    case pb::DEVICE_ERROR:
      return search::Outcome::kDeviceError;
    case pb::NONFINITE:
      return search::Outcome::kNonfinite;
    case pb::WORKER_LOST:
      return search::Outcome::kWorkerLost;
    default:
      return search::Outcome::kInvalid;
  }
}

const char* StatusName(pb::TrialStatus s) { return search::ToString(FromProto(s)); }

}  // namespace autopar::coord
