#include "autopar/cli/megatron_command.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>

namespace autopar::cli {

// launcher/megatron_flags.txt's text, generated into the build (src/cli/CMakeLists.txt).
extern const char kMegatronFlagsText[];

namespace {

enum class Arity { kSwitch, kOne, kList };

struct Item {
  std::string name;  // "" for a word no flag takes
  std::vector<std::string> values;
  std::vector<std::string> words;
};

// launcher/megatron_flags.txt's kinds: the rule set autopar-train reads too.
enum class Kind { kReplaced, kWhenGiven, kConditional, kRead, kTrial, kData };

struct Atom {
  std::string name;  // a flag of the new configuration, or "virtual"
  char op = 0;       // 0: the value is above 0; '>' or '=': compared with `value`
  long value = 0;
};

struct Need {
  std::vector<Atom> any;  // the need holds when one of them does
  std::string reason;
};

struct Rule {
  Arity arity = Arity::kList;
  Kind kind = Kind::kRead;
  std::vector<Need> needs;
};

using Rules = std::map<std::string, Rule>;

bool ParseAtom(const std::string& text, Atom* atom) {
  const size_t op = text.find_first_of(">=");
  atom->name = text.substr(0, op);
  if (atom->name.empty()) return false;
  if (op == std::string::npos) return true;
  atom->op = text[op];
  const std::string number = text.substr(op + 1);
  char* end = nullptr;
  atom->value = std::strtol(number.c_str(), &end, 10);
  return !number.empty() && *end == '\0';
}

// The table's lines (format in its header); "" on success, else the first bad line and why.
std::string ParseRules(const std::string& text, Rules* rules) {
  static const std::map<std::string, Arity> arities = {
      {"switch", Arity::kSwitch}, {"one", Arity::kOne}, {"list", Arity::kList}};
  static const std::map<std::string, Kind> kinds = {{"replaced", Kind::kReplaced},
                                                    {"when-given", Kind::kWhenGiven},
                                                    {"conditional", Kind::kConditional},
                                                    {"read", Kind::kRead},
                                                    {"trial", Kind::kTrial},
                                                    {"data", Kind::kData}};
  std::istringstream in(text);
  std::string line, last;
  for (int number = 1; std::getline(in, line); ++number) {
    std::istringstream words(line);
    std::string first, second, third, extra;
    if (!(words >> first) || first[0] == '#') continue;
    const std::string where = "line " + std::to_string(number) + ": ";
    if (first == "needs") {
      Need need;
      if (!(words >> second) || !std::getline(words >> std::ws, need.reason)) {
        return where + "expected `needs CONDITION REASON`";
      }
      if (last.empty() || (*rules)[last].kind != Kind::kConditional) {
        return where + "`needs` follows a conditional flag";
      }
      for (size_t at = 0; at <= second.size();) {
        const size_t bar = std::min(second.find('|', at), second.size());
        Atom atom;
        if (!ParseAtom(second.substr(at, bar - at), &atom)) return where + "bad " + second;
        need.any.push_back(atom);
        at = bar + 1;
      }
      (*rules)[last].needs.push_back(need);
      continue;
    }
    if (!(words >> second >> third) || (words >> extra) || first.rfind("--", 0) != 0 ||
        !arities.count(second) || !kinds.count(third) || rules->count(first)) {
      return where + "expected `--FLAG switch|one|list KIND`, each flag once";
    }
    (*rules)[first] = {arities.at(second), kinds.at(third), {}};
    last = first;
  }
  for (const auto& [flag, rule] : *rules) {
    for (const Need& need : rule.needs) {
      for (const Atom& atom : need.any) {
        const auto found = rules->find(atom.name);
        if (atom.name != "virtual" &&
            (found == rules->end() || found->second.kind != Kind::kReplaced)) {
          return flag + ": " + atom.name + " is neither `virtual` nor a replaced flag";
        }
      }
    }
  }
  return "";
}

// The built-in table, read once. It is part of the binary, so a line that does not read is a
// build defect: the unit test reads it, and here it stops the program.
const Rules& TheRules() {
  static const Rules rules = [] {
    Rules r;
    const std::string error = ParseRules(MegatronFlagsText(), &r);
    if (!error.empty()) {
      std::fprintf(stderr, "autopar-tune: launcher/megatron_flags.txt: %s\n", error.c_str());
      std::abort();
    }
    return r;
  }();
  return rules;
}

std::map<std::string, Arity> ArityOf(std::initializer_list<Kind> kinds) {
  std::map<std::string, Arity> out;
  for (const auto& [flag, rule] : TheRules()) {
    for (Kind k : kinds) {
      if (rule.kind == k) out[flag] = rule.arity;
    }
  }
  return out;
}

bool IsKind(const std::string& flag, Kind kind) {
  const auto found = TheRules().find(flag);
  return found != TheRules().end() && found->second.kind == kind;
}

// argparse reads "-1" and "-0.5" as values, not options.
bool IsOption(const std::string& word) {
  if (word.size() < 2 || word[0] != '-') return false;
  char* end = nullptr;
  std::strtod(word.c_str(), &end);
  return !(end != nullptr && *end == '\0');
}

// autopar-train's split_options: a flag takes the values its arity says (one after `=`); an
// unknown flag every word up to the next option.
std::vector<Item> SplitOptions(const std::vector<std::string>& words,
                               const std::map<std::string, Arity>& arity) {
  std::vector<Item> items;
  size_t i = 0;
  while (i < words.size()) {
    const std::string& word = words[i];
    if (!IsOption(word)) {
      items.push_back({"", {word}, {word}});
      ++i;
      continue;
    }
    const size_t eq = word.find('=');
    Item item;
    item.name = word.substr(0, eq);
    const auto found = arity.find(item.name);
    const Arity kind = found == arity.end() ? Arity::kList : found->second;
    size_t end = i + 1;
    if (eq != std::string::npos) {
      item.values = {word.substr(eq + 1)};
    } else {
      if (kind == Arity::kOne && end < words.size() && !IsOption(words[end])) {
        ++end;
      } else if (kind == Arity::kList) {
        while (end < words.size() && !IsOption(words[end])) ++end;
      }
      item.values.assign(words.begin() + static_cast<long>(i) + 1,
                         words.begin() + static_cast<long>(end));
    }
    item.words.assign(words.begin() + static_cast<long>(i), words.begin() + static_cast<long>(end));
    items.push_back(std::move(item));
    i = end;
  }
  return items;
}

// autopar-train's allowed(): the reason the configuration refuses a conditional flag, "" when
// it does not. The new command's parallel flags are the candidate's alone (the user's are
// replaced); a switch counts 1 when given, a size its value (1 when absent).
std::string Refused(const Rule& rule, const std::vector<Item>& best, const ParallelConfig& c) {
  const auto value = [&](const std::string& name) -> long {
    if (name == "virtual") return c.vpp;
    const bool is_switch = TheRules().at(name).arity == Arity::kSwitch;
    long v = is_switch ? 0 : 1;
    for (const Item& b : best) {
      if (b.name != name) continue;
      v = is_switch || b.values.empty() ? 1 : std::strtol(b.values[0].c_str(), nullptr, 10);
    }
    return v;
  };
  for (const Need& need : rule.needs) {
    bool holds = false;
    for (const Atom& a : need.any) {
      const long v = value(a.name);
      holds = holds || (a.op == '>' ? v > a.value : a.op == '=' ? v == a.value : v > 0);
    }
    if (!holds) return need.reason;
  }
  return "";
}

}  // namespace

const char* MegatronFlagsText() { return kMegatronFlagsText; }

std::string CheckMegatronFlagsTable(const std::string& text) {
  Rules rules;
  return ParseRules(text, &rules);
}

size_t MegatronScriptStart(const std::vector<std::string>& command) {
  for (size_t i = 0; i < command.size(); ++i) {
    const std::string& w = command[i];
    if (w.size() >= 3 && w.compare(w.size() - 3, 3, ".py") == 0) return i + 1;
  }
  return command.empty() ? 0 : 1;
}

std::vector<std::string> ReplaceParallelFlags(const std::vector<std::string>& user,
                                              const std::vector<std::string>& parallel_flags,
                                              const ParallelConfig& config,
                                              std::vector<std::string>* notes) {
  const std::map<std::string, Arity> known =
      ArityOf({Kind::kReplaced, Kind::kWhenGiven, Kind::kConditional, Kind::kRead});
  const std::vector<Item> best = SplitOptions(parallel_flags, known);
  std::set<std::string> given;
  std::map<std::string, Arity> arity;
  for (const Item& b : best) {
    given.insert(b.name);
    arity[b.name] = b.values.empty()       ? Arity::kSwitch
                    : b.values.size() == 1 ? Arity::kOne
                                           : Arity::kList;
  }
  for (const auto& [name, kind] : known) arity[name] = kind;  // the tables win, as in Python
  std::vector<std::string> out;
  for (const Item& item : SplitOptions(user, arity)) {
    if (IsKind(item.name, Kind::kReplaced) || given.count(item.name)) continue;
    const std::string why = IsKind(item.name, Kind::kConditional)
                                ? Refused(TheRules().at(item.name), best, config)
                                : "";
    if (!why.empty()) {
      if (notes) notes->push_back("dropped " + item.name + ": " + why);
      continue;
    }
    out.insert(out.end(), item.words.begin(), item.words.end());
  }
  for (const Item& b : best) out.insert(out.end(), b.words.begin(), b.words.end());
  return out;
}

std::vector<std::string> MegatronTrialCommand(const std::vector<std::string>& train_command,
                                              const std::vector<std::string>& user_args,
                                              const std::vector<std::string>& parallel_flags,
                                              const ParallelConfig& config,
                                              const MegatronTrialSettings& settings,
                                              std::vector<std::string>* notes) {
  const std::vector<std::string> script(
      user_args.begin() + static_cast<long>(MegatronScriptStart(user_args)), user_args.end());
  // The flags the trial owns go first, read with every table's arity so their values go too.
  const std::map<std::string, Arity> arity =
      ArityOf({Kind::kReplaced, Kind::kWhenGiven, Kind::kConditional, Kind::kRead, Kind::kTrial,
               Kind::kData});
  std::vector<std::string> rest;
  for (const Item& item : SplitOptions(script, arity)) {
    const bool owned =
        IsKind(item.name, Kind::kTrial) || (settings.mock_data && IsKind(item.name, Kind::kData));
    if (!owned) rest.insert(rest.end(), item.words.begin(), item.words.end());
  }
  std::vector<std::string> out = train_command;
  const std::vector<std::string> replaced =
      ReplaceParallelFlags(rest, parallel_flags, config, notes);
  out.insert(out.end(), replaced.begin(), replaced.end());
  for (const std::string& w :
       {std::string("--train-iters"), std::to_string(settings.train_iters),
        std::string("--log-interval"), std::string("1"), std::string("--eval-iters"),
        std::string("0"), std::string("--log-throughput"), std::string("--exit-duration-in-mins"),
        std::to_string(settings.exit_duration_mins)}) {
    out.push_back(w);
  }
  if (settings.mock_data) out.push_back("--mock-data");
  return out;
}

bool NeedsOneDeviceConnection(const ParallelConfig& config, const std::vector<std::string>& args) {
  if (config.tp <= 1 && config.cp * config.up <= 1) return false;
  for (const std::string& a : args) {
    if (a == "--use-torch-fsdp2" || a == "--use-megatron-fsdp" ||
        a == "--overlap-moe-expert-parallel-comm") {
      return false;
    }
  }
  return true;
}

std::vector<std::string> SplitWords(const std::string& text) {
  std::vector<std::string> words;
  std::istringstream in(text);
  std::string w;
  while (in >> w) words.push_back(w);
  return words;
}

}  // namespace autopar::cli
