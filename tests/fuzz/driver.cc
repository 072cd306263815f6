// The deterministic mutation driver of tests/fuzz (docs/testing.md §3): a main for a fuzz target
// where clang's libFuzzer is not linked (a gcc build, or AUTOPAR_LIBFUZZER=OFF).
//
// It takes the subset of libFuzzer's command line the project uses, so CTest and
// scripts/sanitize.sh run either kind of binary the same way:
//
//   fuzz_<target> [-runs=N] [-seed=S] [-max_total_time=T] [-max_len=L] CORPUS_DIR_OR_FILE...
//
// Every seed file is run once as it is; then N inputs (all of them when T is 0, else until T
// seconds have passed) are made from the seeds by 1–4 mutations each: bit flips, bytes set to
// boundary values, bytes inserted, erased or duplicated, a digit run replaced by a large number,
// a splice with another seed. Input i is a pure function of (S, i) and the seeds, so a failure
// reruns with the same flags. A crash, a sanitizer report or an exception leaving the target
// ends the process abnormally; the last input is written to ./crash-fuzz-input first.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

// SplitMix64 (Steele, Lea & Flood 2014): one stream per input index.
struct SplitMix {
  uint64_t state;
  uint64_t Next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  size_t Below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(Next() % n); }
};

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void Mutate(std::string& s, const std::vector<std::string>& seeds, SplitMix& rng, size_t max_len) {
  static const char* const kNumbers[] = {
      "0",  "-1",  "2147483648",          "4294967297",           "1e308",
      "-0", "nan", "9223372036854775807", "18446744073709551616", "1099511627776"};
  switch (rng.Below(7)) {
    case 0:  // flip a bit
      if (!s.empty()) s[rng.Below(s.size())] ^= static_cast<char>(1u << rng.Below(8));
      break;
    case 1: {  // a boundary byte
      static const char kBytes[] = {'\0', '\n', '\r', ',', ':', '"', '\\', '{',    '}',
                                    '[',  ']',  '-',  ' ', '$', '#', '\'', '\x7f', '\xff'};
      if (!s.empty()) s[rng.Below(s.size())] = kBytes[rng.Below(sizeof kBytes)];
      break;
    }
    case 2: {  // insert random bytes
      const size_t at = rng.Below(s.size() + 1), n = 1 + rng.Below(8);
      std::string bytes;
      for (size_t i = 0; i < n; ++i) bytes += static_cast<char>(rng.Next());
      s.insert(at, bytes);
      break;
    }
    case 3:  // erase a range
      if (!s.empty()) {
        const size_t at = rng.Below(s.size());
        s.erase(at, 1 + rng.Below(std::min<size_t>(s.size() - at, 64)));
      }
      break;
    case 4:  // duplicate a range
      if (!s.empty()) {
        const size_t at = rng.Below(s.size());
        const size_t n = 1 + rng.Below(std::min<size_t>(s.size() - at, 256));
        s.insert(rng.Below(s.size() + 1), s.substr(at, n));
      }
      break;
    case 5: {  // a digit run → a large or special number
      const size_t at = s.find_first_of("0123456789", rng.Below(s.size() + 1));
      const std::string number = kNumbers[rng.Below(std::size(kNumbers))];
      if (at == std::string::npos) {
        s.insert(rng.Below(s.size() + 1), number);
      } else {
        const size_t end = s.find_first_not_of("0123456789.", at);
        s.replace(at, (end == std::string::npos ? s.size() : end) - at, number);
      }
      break;
    }
    default: {  // splice with another seed
      const std::string& other = seeds[rng.Below(seeds.size())];
      const size_t cut = rng.Below(s.size() + 1), from = rng.Below(other.size() + 1);
      s = s.substr(0, cut) + other.substr(from);
      break;
    }
  }
  if (s.size() > max_len) s.resize(max_len);
}

std::string Input(const std::vector<std::string>& seeds, uint64_t seed, uint64_t index,
                  size_t max_len) {
  SplitMix rng{seed * 0x100000001b3ULL ^ index};
  std::string s = seeds[rng.Below(seeds.size())];
  for (size_t m = 0, n = 1 + rng.Below(4); m < n; ++m) Mutate(s, seeds, rng, max_len);
  return s;
}

// The input being run, for the report of a crash.
std::string* g_current = nullptr;

void SaveCurrent() {
  if (g_current == nullptr) return;
  std::ofstream("crash-fuzz-input", std::ios::binary) << *g_current;
  std::fprintf(stderr, "fuzz driver: the failing input is in ./crash-fuzz-input\n");
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t runs = 1000, seed = 1;
  double max_total_time_s = 0;
  size_t max_len = 4096;
  std::vector<std::filesystem::path> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      const std::string prefix = std::string("-") + name + "=";
      return arg.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    if (const char* runs_value = value("runs")) {
      runs = std::strtoull(runs_value, nullptr, 10);
    } else if (const char* seed_value = value("seed")) {
      seed = std::strtoull(seed_value, nullptr, 10);
    } else if (const char* time_value = value("max_total_time")) {
      max_total_time_s = std::strtod(time_value, nullptr);
      runs = UINT64_MAX;
    } else if (const char* len_value = value("max_len")) {
      max_len = std::strtoull(len_value, nullptr, 10);
    } else if (!arg.empty() && arg[0] == '-') {
      std::fprintf(stderr, "fuzz driver: ignoring %s\n", arg.c_str());
    } else {
      paths.emplace_back(arg);
    }
  }
  std::vector<std::string> seeds;
  for (const auto& path : paths) {
    if (std::filesystem::is_directory(path)) {
      std::vector<std::filesystem::path> files;
      for (const auto& entry : std::filesystem::directory_iterator(path)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
      std::sort(files.begin(), files.end());  // directory order is not deterministic
      for (const auto& f : files) seeds.push_back(ReadFile(f));
    } else if (std::filesystem::is_regular_file(path)) {
      seeds.push_back(ReadFile(path));
    }
  }
  if (seeds.empty()) seeds.emplace_back();
  std::atexit(SaveCurrent);  // sanitizer reports end in exit()
  std::set_terminate([] {    // an exception leaving the target
    SaveCurrent();
    try {
      if (const std::exception_ptr e = std::current_exception()) std::rethrow_exception(e);
      std::fprintf(stderr, "fuzz driver: std::terminate\n");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fuzz driver: an exception left the target: %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "fuzz driver: an exception left the target\n");
    }
    std::abort();
  });

  const auto start = std::chrono::steady_clock::now();
  auto elapsed_s = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::string current;
  g_current = &current;
  uint64_t done = 0;
  for (const std::string& s : seeds) {
    current = s;
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(current.data()), current.size());
    ++done;
  }
  for (uint64_t i = 0; i < runs; ++i) {
    if (max_total_time_s > 0 && (i % 64) == 0 && elapsed_s() >= max_total_time_s) break;
    current = Input(seeds, seed, i, max_len);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(current.data()), current.size());
    ++done;
  }
  g_current = nullptr;
  // libFuzzer's closing line, which scripts/sanitize.sh reads for both kinds of binary.
  std::printf("Done %llu runs in %.0f second(s)\n", static_cast<unsigned long long>(done),
              elapsed_s());
  return 0;
}
