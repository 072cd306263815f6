// ParallelConfig: one point of the search space (DESIGN §3), and its canonical text form.
//
// The text form is `tp=8,pp=4,dp=2,cp=1,up=1,ep=1,vpp=1,mbs=1,sp=on,recompute=selective,dist_opt=on`.
// Print → parse is the identity; omitted keys take defaults, and an omitted `dp` is derived from the
// world size by Complete().
#pragma once

#include <cstdint>
#include <string>

namespace autopar {

enum class Recompute : uint8_t { kNone, kSelective, kFull };
const char* ToString(Recompute r);

struct ParallelConfig {
  int32_t tp = 1;   // tensor parallel
  int32_t pp = 1;   // pipeline parallel
  int32_t dp = 0;   // data parallel; 0 = derive from the world size
  int32_t cp = 1;   // context parallel (ring attention)
  int32_t up = 1;   // Ulysses sequence parallel (all-to-all over heads)
  int32_t ep = 1;   // expert parallel (a divisor of dp·cp)
  int32_t vpp = 1;  // virtual pipeline stages (model chunks) per pipeline rank
  int32_t mbs = 1;  // micro-batch size
  bool sp = false;  // Megatron sequence parallelism (needs tp > 1)
  Recompute recompute = Recompute::kNone;
  // With full recompute: layers per pipeline stage that are recomputed (Megatron
  // `--recompute-method block --recompute-num-layers N`); 0 = every layer.
  int32_t recompute_layers = 0;
  bool dist_opt = false;  // distributed optimizer (ZeRO-1 over dp·cp)

  // GPUs one model replica's activations are split over (the tp·cp·up·pp block).
  int64_t model_parallel_size() const { return int64_t{tp} * cp * up * pp; }
  int64_t world_size() const { return model_parallel_size() * dp; }

  friend bool operator==(const ParallelConfig&, const ParallelConfig&) = default;
};

// Canonical text. Every key is printed; `recompute_layers` only when it is non-zero.
std::string ToSpec(const ParallelConfig& c);

// Parses SPEC text. Throws InputError("--config", ...) naming the key and the allowed values.
ParallelConfig ParseSpec(const std::string& text);

// Fills a derived dp (dp == 0) from the world size. Throws InputError("--config") when the product
// of the given degrees does not divide the world size or does not equal it.
ParallelConfig Complete(ParallelConfig c, int64_t world_size);

}  // namespace autopar
