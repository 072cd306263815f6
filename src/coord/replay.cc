#include "autopar/coord/replay.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "autopar/common/errors.h"
#include "autopar/coord/convert.h"
#include "autopar/search/rng.h"

namespace autopar::coord {
namespace {

constexpr const char* kFlag = "--replay-table";
constexpr const char* kRequired[] = {"tp",
                                     "pp",
                                     "dp",
                                     "cp",
                                     "up",
                                     "ep",
                                     "vpp",
                                     "mbs",
                                     "sp",
                                     "recompute",
                                     "dist_opt",
                                     "step_time_s",
                                     "peak_memory_gib",
                                     "status"};

std::vector<std::string> SplitCsv(const std::string& line) {
  std::vector<std::string> out;
  std::string cell;
  std::istringstream in(line);
  while (std::getline(in, cell, ',')) {
    const size_t b = cell.find_first_not_of(" \t\r");
    const size_t e = cell.find_last_not_of(" \t\r");
    out.push_back(b == std::string::npos ? "" : cell.substr(b, e - b + 1));
  }
  if (!line.empty() && line.back() == ',') out.emplace_back();
  return out;
}

class RowReader {
 public:
  RowReader(const std::string& source, int64_t line)
      : where_(source + ":" + std::to_string(line)) {}

  [[noreturn]] void Fail(const std::string& column, const std::string& message) const {
    throw InputError(kFlag, where_ + ": column " + column + ": " + message);
  }
  int32_t Int(const std::string& column, const std::string& text) const {
    char* end = nullptr;
    const long v = std::strtol(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || v < 0 || v > (1 << 30)) {
      Fail(column, "expected a non-negative integer, got '" + text + "'");
    }
    return static_cast<int32_t>(v);
  }
  bool Bool(const std::string& column, const std::string& text) const {
    if (text == "on" || text == "true" || text == "1") return true;
    if (text == "off" || text == "false" || text == "0") return false;
    Fail(column, "allowed: on, off (or true, false, 1, 0); got '" + text + "'");
  }
  Recompute RecomputeValue(const std::string& text) const {
    if (text == "none") return Recompute::kNone;
    if (text == "selective") return Recompute::kSelective;
    if (text == "full") return Recompute::kFull;
    Fail("recompute", "allowed: none, selective, full; got '" + text + "'");
  }
  // Empty → the all-to-all dispatcher; SPEC's dispatcher values.
  bool FlexDispatcher(const std::string& text) const {
    if (text.empty() || text == "alltoall") return false;
    if (text == "flex") return true;
    Fail("dispatcher", "allowed: alltoall, flex (empty: alltoall); got '" + text + "'");
  }
  // Empty → the ring's p2p; SPEC's cp_comm values.
  bool CpAllgather(const std::string& text) const {
    if (text.empty() || text == "p2p") return false;
    if (text == "allgather") return true;
    Fail("cp_comm", "allowed: p2p, allgather (empty: p2p); got '" + text + "'");
  }
  // Empty → selective recompute's default (core_attn alone); otherwise SPEC's recompute_modules,
  // which only selective recompute takes.
  uint8_t RecomputeModules(Recompute recompute, const std::string& text) const {
    if (text.empty()) return 0;
    try {
      return ParseSpec(std::string("recompute=") + ToString(recompute) +
                       ",recompute_modules=" + text)
          .recompute_modules;
    } catch (const InputError& e) {
      Fail("recompute_modules", e.what());
    }
  }
  // Empty → NaN (not measured); otherwise a finite number.
  double Number(const std::string& column, const std::string& text) const {
    if (text.empty()) return std::nan("");
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (*end != '\0' || !std::isfinite(v)) {
      Fail(column, "expected a finite number (or nothing where not measured), got '" + text + "'");
    }
    return v;
  }
  // Empty → NaN; otherwise a measurement in [lo, hi] (backend.h: what the search takes).
  double Measurement(const std::string& column, const std::string& text, double lo,
                     double hi) const {
    const double v = Number(column, text);
    if (!std::isnan(v) && !(v >= lo && v <= hi)) {
      char bounds[64];
      std::snprintf(bounds, sizeof bounds, "%g to %g", lo, hi);
      Fail(column,
           "a measurement must be from " + std::string(bounds) + " (or empty), got '" + text + "'");
    }
    return v;
  }

 private:
  std::string where_;
};

// The header line: each column's index by its name, every required one present, none twice.
std::unordered_map<std::string, size_t> ReadHeader(const std::vector<std::string>& cells,
                                                   const std::string& source, int64_t line_no) {
  std::unordered_map<std::string, size_t> column;
  for (size_t i = 0; i < cells.size(); ++i) {
    if (!column.emplace(cells[i], i).second && !cells[i].empty()) {
      throw InputError(kFlag, source + ":" + std::to_string(line_no) + ": the header names '" +
                                  cells[i] + "' twice (columns " +
                                  std::to_string(column[cells[i]] + 1) + " and " +
                                  std::to_string(i + 1) + ")");
    }
  }
  for (const char* name : kRequired) {
    if (!column.count(name)) {
      throw InputError(kFlag, source + ":" + std::to_string(line_no) + ": the header has no '" +
                                  name +
                                  "' column; required: tp,pp,dp,cp,up,ep,vpp,mbs,sp,"
                                  "recompute,dist_opt,step_time_s,peak_memory_gib,status");
    }
  }
  return column;
}

}  // namespace

ReplayTable::ReplayTable(std::vector<ReplayRow> rows) : rows_(std::move(rows)) {
  for (size_t i = 0; i < rows_.size(); ++i) {
    const std::string spec = ToSpec(rows_[i].config);
    if (!index_.emplace(spec, i).second) {
      throw InputError(kFlag, "line " + std::to_string(rows_[i].line) + ": " + spec +
                                  " appears twice (first on line " +
                                  std::to_string(rows_[index_[spec]].line) + ")");
    }
  }
}

ReplayTable ReplayTable::Parse(const std::string& text, const std::string& source) {
  std::istringstream in(text);
  std::string line;
  int64_t line_no = 0;
  std::unordered_map<std::string, size_t> column;
  size_t header_cells = 0;
  std::vector<ReplayRow> rows;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos || line[0] == '#') continue;
    const std::vector<std::string> cells = SplitCsv(line);
    if (column.empty()) {
      column = ReadHeader(cells, source, line_no);
      header_cells = cells.size();
      continue;
    }
    const RowReader r(source, line_no);
    if (cells.size() < header_cells) {  // every column's index is below header_cells
      r.Fail("*", "expected " + std::to_string(header_cells) + " cells, got " +
                      std::to_string(cells.size()));
    }
    auto cell = [&](const char* name) -> const std::string& { return cells[column.at(name)]; };
    ReplayRow row;
    row.line = line_no;
    ParallelConfig& c = row.config;
    c.tp = r.Int("tp", cell("tp"));
    c.pp = r.Int("pp", cell("pp"));
    c.dp = r.Int("dp", cell("dp"));
    c.cp = r.Int("cp", cell("cp"));
    c.up = r.Int("up", cell("up"));
    c.ep = r.Int("ep", cell("ep"));
    c.vpp = r.Int("vpp", cell("vpp"));
    c.mbs = r.Int("mbs", cell("mbs"));
    c.sp = r.Bool("sp", cell("sp"));
    c.dist_opt = r.Bool("dist_opt", cell("dist_opt"));
    // A table has no overlap or reduction-dtype columns: its rows run Megatron's defaults.
    c.overlap_param_gather = OverlapParamGatherAllowed(c);
    c.recompute = r.RecomputeValue(cell("recompute"));
    if (column.count("recompute_layers")) {
      c.recompute_layers = r.Int("recompute_layers", cell("recompute_layers"));
    }
    if (column.count("etp")) {  // absent: the experts follow tp
      const int32_t etp = r.Int("etp", cell("etp"));
      c.etp = etp == c.tp ? 0 : etp;
    }
    if (column.count("pp_first")) c.pp_first = r.Int("pp_first", cell("pp_first"));  // absent:
    if (column.count("pp_last")) c.pp_last = r.Int("pp_last", cell("pp_last"));      // even
    if (column.count("split_embedding")) {  // absent: not counted
      c.split_embedding = r.Bool("split_embedding", cell("split_embedding"));
    }
    if (column.count("split_loss")) c.split_loss = r.Bool("split_loss", cell("split_loss"));
    if (column.count("recompute_modules")) {
      c.recompute_modules = r.RecomputeModules(c.recompute, cell("recompute_modules"));
    }
    if (column.count("dispatcher")) c.flex_dispatcher = r.FlexDispatcher(cell("dispatcher"));
    if (column.count("cp_comm")) c.cp_allgather = r.CpAllgather(cell("cp_comm"));
    if (column.count("fp8_param_gather")) {  // empty: off
      const std::string& v = cell("fp8_param_gather");
      c.fp8_param_gather = !v.empty() && r.Bool("fp8_param_gather", v);
    }

    const auto status = search::ParseOutcome(cell("status"));
    if (!status) {
      r.Fail("status",
             "allowed: ok, oom, timeout, comm_error, device_error, nonfinite, "
             "worker_lost, invalid; got '" +
                 cell("status") + "'");
    }
    row.status = *status;
    row.step_time_s =
        r.Measurement("step_time_s", cell("step_time_s"), kMinStepTimeS, kMaxStepTimeS);
    row.peak_memory_gib = r.Measurement("peak_memory_gib", cell("peak_memory_gib"),
                                        kMinPeakMemoryGib, kMaxPeakMemoryGib);
    if (column.count("noise_sd")) {
      const double sd = r.Number("noise_sd", cell("noise_sd"));
      if (!std::isnan(sd) && !(sd >= 0 && sd < 1)) {
        r.Fail("noise_sd", "must be in [0, 1) or empty, got '" + cell("noise_sd") + "'");
      }
      row.noise_sd = std::isnan(sd) ? 0 : sd;
    }
    if (row.status == search::Outcome::kOk && !(row.step_time_s > 0)) {
      r.Fail("step_time_s",
             "an ok row needs a positive step time, got '" + cell("step_time_s") + "'");
    }
    if (!std::isnan(row.peak_memory_gib) && !(row.peak_memory_gib > 0)) {
      r.Fail("peak_memory_gib", "must be positive or empty, got '" + cell("peak_memory_gib") + "'");
    }
    rows.push_back(row);
  }
  if (column.empty()) throw InputError(kFlag, source + ": no header line");
  if (rows.empty()) throw InputError(kFlag, source + ": no rows");
  return ReplayTable(std::move(rows));
}

std::vector<ParallelConfig> ReplayTable::configs() const {
  std::vector<ParallelConfig> out;
  out.reserve(rows_.size());
  for (const ReplayRow& r : rows_) out.push_back(r.config);
  return out;
}

const ReplayRow* ReplayTable::Find(const std::string& spec) const {
  const auto it = index_.find(spec);
  return it == index_.end() ? nullptr : &rows_[it->second];
}

const ReplayRow* ReplayTable::Best() const {
  const ReplayRow* best = nullptr;
  for (const ReplayRow& r : rows_) {
    if (r.status == search::Outcome::kOk && (!best || r.step_time_s < best->step_time_s)) best = &r;
  }
  return best;
}

std::string ReplayTable::ToCsv() const {
  // The noise column only where it says something, so a noise-free table reads as it always did.
  // So are the etp column, only where some row's experts do not follow tp, the pp_first and
  // pp_last columns, only where some row's pipeline stages are uneven, the split_embedding and
  // split_loss columns, only where some row counts the embedding or the loss in its split, the
  // recompute_modules column, only where some row's selective recompute reruns more than
  // core_attn, the dispatcher column, only where some row dispatches by flex, the cp_comm
  // column, only where some row gathers K and V, and the fp8_param_gather column, only where some
  // row keeps FP8 parameters.
  bool noisy = false, etp = false, uneven = false, counted = false, modules = false, flex = false,
       allgather = false, fp8_params = false;
  for (const ReplayRow& r : rows_) {
    noisy = noisy || r.noise_sd > 0;
    etp = etp || r.config.etp != 0;
    uneven = uneven || UnevenStages(r.config);
    counted = counted || r.config.split_embedding || r.config.split_loss;
    modules = modules || r.config.recompute_modules != 0;
    flex = flex || r.config.flex_dispatcher;
    allgather = allgather || r.config.cp_allgather;
    fp8_params = fp8_params || r.config.fp8_param_gather;
  }
  std::string out =
      "tp,pp,dp,cp,up,ep,vpp,mbs,sp,recompute,recompute_layers,dist_opt,step_time_s,"
      "peak_memory_gib,status";
  out += etp ? ",etp" : "";
  out += uneven ? ",pp_first,pp_last" : "";
  out += counted ? ",split_embedding,split_loss" : "";
  out += modules ? ",recompute_modules" : "";
  out += flex ? ",dispatcher" : "";
  out += allgather ? ",cp_comm" : "";
  out += fp8_params ? ",fp8_param_gather" : "";
  out += noisy ? ",noise_sd\n" : "\n";
  char line[256];
  auto number = [](double v) {
    char buf[32];
    if (std::isnan(v)) return std::string();
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return std::string(buf);
  };
  for (const ReplayRow& r : rows_) {
    const ParallelConfig& c = r.config;
    std::snprintf(line, sizeof line, "%d,%d,%d,%d,%d,%d,%d,%d,%s,%s,%d,%s,%s,%s,%s\n", c.tp, c.pp,
                  c.dp, c.cp, c.up, c.ep, c.vpp, c.mbs, c.sp ? "on" : "off", ToString(c.recompute),
                  c.recompute_layers, c.dist_opt ? "on" : "off", number(r.step_time_s).c_str(),
                  number(r.peak_memory_gib).c_str(), search::ToString(r.status));
    out += line;
    if (etp) {
      out.back() = ',';
      out += std::to_string(c.expert_tp()) + "\n";
    }
    if (uneven) {
      out.back() = ',';
      out += std::to_string(c.pp_first) + "," + std::to_string(c.pp_last) + "\n";
    }
    if (counted) {
      out.back() = ',';
      out += std::string(c.split_embedding ? "on" : "off") + "," + (c.split_loss ? "on" : "off") +
             "\n";
    }
    if (modules) {
      out.back() = ',';
      out += RecomputeModulesText(c.recompute_modules) + "\n";
    }
    if (flex) {
      out.back() = ',';
      out += std::string(c.flex_dispatcher ? "flex" : "alltoall") + "\n";
    }
    if (allgather) {
      out.back() = ',';
      out += std::string(c.cp_allgather ? "allgather" : "p2p") + "\n";
    }
    if (fp8_params) {
      out.back() = ',';
      out += std::string(c.fp8_param_gather ? "on" : "off") + "\n";
    }
    if (noisy) {
      out.back() = ',';
      out += number(r.noise_sd) + "\n";
    }
  }
  return out;
}

void ReplayTable::Validate(const SearchSpace& space, const std::string& source) const {
  const int64_t world = space.cluster().world_size();
  for (const ReplayRow& r : rows_) {
    std::string reason;
    if (r.config.world_size() != world) {
      reason = "tp·cp·up·pp·dp = " + std::to_string(r.config.world_size()) +
               " but the cluster has " + std::to_string(world) + " GPUs";
    } else {
      reason = space.Check(r.config);
    }
    if (!reason.empty()) {
      throw InputError(
          kFlag, source + ":" + std::to_string(r.line) + ": " + ToSpec(r.config) + ": " + reason);
    }
  }
}

pb::TrialResult ReplayBackend::Run(const pb::TrialRequest& request) {
  pb::TrialResult out;
  out.set_trial_index(request.trial_index());
  out.set_attempt(request.attempt());
  out.set_spec(request.spec());
  out.set_failed_rank(-1);
  const ReplayRow* row = table_.Find(request.spec());
  if (row == nullptr) {
    out.set_status(pb::INVALID);
    out.set_message("not in the replay table");
    return out;
  }
  out.set_status(ToProto(row->status));
  if (row->status == search::Outcome::kOk) {
    double step_time_s = row->step_time_s;
    if (row->noise_sd > 0) {
      search::Hasher key;
      key.Add(request.spec().data(), request.spec().size());
      key.Add(static_cast<uint64_t>(request.trial_index()));  // a repeat draws afresh
      key.Add(static_cast<uint64_t>(request.attempt()));
      search::Rng rng(noise_seed_, static_cast<int64_t>(key.value()), search::Purpose::kSynthetic);
      step_time_s *= std::exp(row->noise_sd * rng.Normal());
    }
    out.set_step_time_s(step_time_s);
  }
  if (!std::isnan(row->peak_memory_gib)) out.set_peak_memory_gib(row->peak_memory_gib);
  if (row->status != search::Outcome::kOk) out.set_failed_rank(0);
  return out;
}

}  // namespace autopar::coord
