// Conversions between the core's types and the protocol's messages.
#pragma once

#include "autopar/search/state.h"
#include "autopar/space/config.h"
#include "proto/autopar.pb.h"

namespace autopar::coord {

pb::ParallelConfig ToProto(const ParallelConfig& c);
ParallelConfig FromProto(const pb::ParallelConfig& c);

pb::TrialStatus ToProto(search::Outcome o);
// STATUS_UNSPECIFIED (a message from a broken worker) reads as kInvalid.
search::Outcome FromProto(pb::TrialStatus s);
// ok, oom, timeout, ... (the names of search::ToString(Outcome)).
const char* StatusName(pb::TrialStatus s);

}  // namespace autopar::coord
