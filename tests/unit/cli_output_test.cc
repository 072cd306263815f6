// The formats of plan and predict that other tools read (docs/cli.md §5): the NeMo-style CSV
// summary and the Megatron-Bridge overrides (`--format bridge` items, `--format yaml` files).
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "autopar/cli/commands.h"
#include "autopar/common/errors.h"
#include "cli_test_util.h"

namespace autopar::cli {
namespace {

// predict of one SPEC for `model` on 2 x 8 h100 in `format`.
Result Predict(const std::string& model, const std::string& spec, const std::string& format,
               std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {"predict", "--model",
                                   model,     "--gpu",
                                   "h100",    "--nnodes",
                                   "2",       "--nproc-per-node",
                                   "8",       "--global-batch-size",
                                   "64",      "--config",
                                   spec,      "--format",
                                   format};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return RunCli(argv);
}

// One CSV line split into fields, with RFC 4180 quotes.
std::vector<std::string> CsvFields(const std::string& line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char ch = line[i];
    if (quoted && ch == '"' && i + 1 < line.size() && line[i + 1] == '"') {
      fields.back() += '"';
      ++i;
    } else if (ch == '"') {
      quoted = !quoted;
    } else if (ch == ',' && !quoted) {
      fields.emplace_back();
    } else {
      fields.back() += ch;
    }
  }
  return fields;
}

// The rows of a CSV text as column name → value.
std::vector<std::map<std::string, std::string>> CsvRows(const std::string& text) {
  std::istringstream lines(text);
  std::string line;
  std::getline(lines, line);
  const std::vector<std::string> header = CsvFields(line);
  std::vector<std::map<std::string, std::string>> rows;
  while (std::getline(lines, line)) {
    const std::vector<std::string> fields = CsvFields(line);
    EXPECT_EQ(fields.size(), header.size()) << line;
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < header.size() && i < fields.size(); ++i) row[header[i]] = fields[i];
    rows.push_back(row);
  }
  return rows;
}

// `key=value key=value ...` as a map.
std::map<std::string, std::string> Items(const std::string& line) {
  std::map<std::string, std::string> items;
  std::istringstream words(line);
  for (std::string word; words >> word;) {
    const size_t eq = word.find('=');
    EXPECT_NE(eq, std::string::npos) << word;
    EXPECT_EQ(items.count(word.substr(0, eq)), 0u) << "twice: " << word;
    items[word.substr(0, eq)] = word.substr(eq + 1);
  }
  return items;
}

// Our YAML override files (sections of `key: value` lines, comments, `---`) as dotted items, one
// map per document.
std::vector<std::map<std::string, std::string>> YamlDocuments(const std::string& text) {
  std::vector<std::map<std::string, std::string>> docs(1);
  std::istringstream lines(text);
  std::string section;
  for (std::string line; std::getline(lines, line);) {
    if (line == "---") {
      docs.emplace_back();
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    const size_t colon = line.find(':');
    EXPECT_NE(colon, std::string::npos) << line;
    if (line[0] != ' ') {
      section = line.substr(0, colon);
      EXPECT_EQ(colon + 1, line.size()) << line;
      for (const auto& [key, value] : docs.back()) {
        EXPECT_NE(key.rfind(section + ".", 0), 0u) << "section twice: " << section;
      }
      continue;
    }
    EXPECT_EQ(line.rfind("  ", 0), 0u) << line;
    const std::string key = section + "." + line.substr(2, colon - 2);
    std::string value = line.substr(colon + 2);
    // A YAML flow list, "[2, 4]", is written "[2,4]" on the command line.
    for (size_t at; (at = value.find(", ")) != std::string::npos;) value.erase(at + 1, 1);
    EXPECT_EQ(docs.back().count(key), 0u) << "twice: " << key;
    docs.back()[key] = value;
  }
  return docs;
}

TEST(CliCsv, NemoSummaryColumns) {
  // llama2-7b has 32 layers and 32 heads: tp 2, pp 2, Ulysses 2 in a ring of 2, on 16 GPUs.
  const Result r = Predict("llama2-7b", "tp=2,pp=2,cp=2,up=2,vpp=2,mbs=1,recompute=full", "csv",
                           {"--seq-length", "8192"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out.rfind("Rank,Model Name,Seq Length,TP,PP,CP,EP,VP,MBS,Act Ckpt Layers,Num Layers,"
                        "GBS,Nodes,GPUs per Node,Time per Step,Samples per Second,"
                        "Model TFLOPS / GPU,Model TFLOPS Aggregate,MFU,Peak Memory GiB,Fits,",
                        0),
            0u)
      << r.out;
  const auto rows = CsvRows(r.out);
  ASSERT_EQ(rows.size(), 1u);
  const auto& row = rows[0];
  const std::map<std::string, std::string> want = {
      {"Rank", "1"},
      {"Model Name", "llama2-7b"},
      {"Seq Length", "8192"},
      {"TP", "2"},
      {"PP", "2"},
      {"CP", "4"},  // Megatron's context-parallel size: ring 2 x Ulysses 2
      {"EP", "1"},
      {"VP", "2"},
      {"MBS", "1"},
      {"Act Ckpt Layers", "16"},  // every layer of a stage of 32 / 2
      {"Num Layers", "32"},
      {"GBS", "64"},
      {"Nodes", "2"},
      {"GPUs per Node", "8"},
      {"DP", "1"},
      {"UP", "2"},
      {"SP", "off"},
      {"Recompute", "full"},
      {"Dist Opt", "off"},
      {"Fits", "true"}};
  for (const auto& [column, value] : want) EXPECT_EQ(row.at(column), value) << column;
  const double step_s = std::stod(row.at("Time per Step"));
  EXPECT_GT(step_s, 0);
  EXPECT_NEAR(std::stod(row.at("Samples per Second")), 64 / step_s, 1e-4 * 64 / step_s);
  EXPECT_NEAR(std::stod(row.at("Model TFLOPS Aggregate")),
              16 * std::stod(row.at("Model TFLOPS / GPU")),
              1e-4 * std::stod(row.at("Model TFLOPS Aggregate")));
  // The SPEC comes back through --config to the same row.
  const Result again = Predict("llama2-7b", row.at("Config"), "csv", {"--seq-length", "8192"});
  EXPECT_EQ(again.out, r.out);
  // Block recompute counts its layers.
  const Result block = Predict("llama2-7b", "tp=2,pp=2,recompute=full,recompute_layers=3", "csv");
  ASSERT_EQ(block.code, kExitOk) << block.err;
  EXPECT_EQ(CsvRows(block.out)[0].at("Act Ckpt Layers"), "3");
  // Every layer of the largest stage: 15 and 17 layers.
  const Result uneven = Predict("llama2-7b", "tp=4,pp=2,pp_first=15,recompute=full", "csv");
  ASSERT_EQ(uneven.code, kExitOk) << uneven.err;
  EXPECT_EQ(CsvRows(uneven.out)[0].at("Act Ckpt Layers"), "17");
  // plan: one row per configuration, ranked.
  const Result plan = RunCli({"plan", "--model", "tiny", "--gpu", "h100", "--global-batch-size",
                              "16", "--top", "3", "--format", "csv"});
  ASSERT_EQ(plan.code, kExitOk) << plan.err;
  const auto ranked = CsvRows(plan.out);
  ASSERT_EQ(ranked.size(), 3u);
  for (size_t i = 0; i < ranked.size(); ++i) EXPECT_EQ(ranked[i].at("Rank"), std::to_string(i + 1));
  EXPECT_LE(std::stod(ranked[0].at("Time per Step")), std::stod(ranked[2].at("Time per Step")));
}

TEST(CliBridge, OverridesSelectTheConfiguration) {
  struct Case {
    const char* model;
    const char* spec;
    std::map<std::string, std::string> want;  // "" : must be absent
  };
  const Case cases[] = {
      {"llama2-7b",
       "tp=2,pp=2,vpp=2,mbs=2,sp=on,recompute=selective,dist_opt=on",
       {{"model.tensor_model_parallel_size", "2"},
        {"model.pipeline_model_parallel_size", "2"},
        {"model.virtual_pipeline_model_parallel_size", "2"},
        {"model.context_parallel_size", "1"},
        {"model.cp_comm_type", ""},
        {"model.expert_model_parallel_size", ""},
        {"model.sequence_parallel", "true"},
        {"model.recompute_granularity", "selective"},
        {"model.recompute_method", "null"},
        {"train.micro_batch_size", "2"},
        {"train.global_batch_size", "64"},
        {"ddp.use_distributed_optimizer", "true"},
        {"optimizer.use_distributed_optimizer", "true"},
        {"ddp.overlap_grad_reduce", "true"},
        {"ddp.overlap_param_gather", "true"},
        {"ddp.grad_reduce_in_fp32", ""},
        {"mixed_precision.grad_reduce_in_fp32", ""}}},
      {"llama2-7b",
       "tp=2,cp=2,up=2,recompute=full,overlap_grad_reduce=off",
       {{"model.virtual_pipeline_model_parallel_size", "null"},
        {"model.context_parallel_size", "4"},
        {"model.cp_comm_type", "a2a+p2p"},
        {"model.hierarchical_context_parallel_sizes", "[2,2]"},
        {"model.sequence_parallel", "false"},
        {"model.recompute_granularity", "full"},
        {"model.recompute_method", "uniform"},
        {"model.recompute_num_layers", "1"},
        {"ddp.use_distributed_optimizer", "false"},
        {"optimizer.use_distributed_optimizer", "false"},
        {"ddp.overlap_grad_reduce", "false"},
        {"ddp.overlap_param_gather", "false"}}},
      {"llama2-7b",
       "tp=2,up=4,recompute=full,recompute_layers=5,grad_reduce_dtype=bf16",
       {{"model.context_parallel_size", "4"},
        {"model.cp_comm_type", "a2a"},
        {"model.hierarchical_context_parallel_sizes", ""},
        {"model.recompute_method", "block"},
        {"model.recompute_num_layers", "5"},
        {"ddp.grad_reduce_in_fp32", "false"},
        {"mixed_precision.grad_reduce_in_fp32", "false"}}},
      {"llama2-7b",
       "tp=4,cp=4,recompute=none",
       {{"model.context_parallel_size", "4"},
        {"model.cp_comm_type", "p2p"},
        {"model.recompute_granularity", "null"},
        {"model.recompute_num_layers", "null"}}},
      {"tiny-moe",
       "tp=2,ep=4,sp=on",
       {{"model.expert_model_parallel_size", "4"},
        {"model.expert_tensor_parallel_size", "2"},
        {"model.moe_token_dispatcher_type", "alltoall"}}},
      {"tiny-moe",
       "tp=2,ep=1,sp=on",
       {{"model.expert_model_parallel_size", "1"},
        {"model.expert_tensor_parallel_size", "2"},
        {"model.moe_token_dispatcher_type", ""}}},
      {"tiny-moe",
       "tp=2,ep=1,sp=on,dispatcher=flex",
       {{"model.expert_model_parallel_size", "1"}, {"model.moe_token_dispatcher_type", "flex"}}},
      {"tiny-moe",
       "tp=2,ep=4,etp=1,sp=on",
       {{"model.tensor_model_parallel_size", "2"},
        {"model.expert_model_parallel_size", "4"},
        {"model.expert_tensor_parallel_size", "1"}}},
      {"llama2-7b", "tp=2", {{"model.expert_tensor_parallel_size", ""}}},
      // Uneven stages, and the recipe's other ways of splitting the layers undone.
      {"llama2-7b",
       "tp=2,pp=4,pp_first=2,pp_last=6,vpp=2",
       {{"model.num_layers_in_first_pipeline_stage", "2"},
        {"model.num_layers_in_last_pipeline_stage", "6"},
        {"model.virtual_pipeline_model_parallel_size", "2"},
        {"model.pipeline_model_parallel_layout", "null"},
        {"model.account_for_embedding_in_pipeline_split", "false"},
        {"model.account_for_loss_in_pipeline_split", "false"}}},
      {"llama2-7b",
       "tp=2,pp=4,pp_last=5",
       {{"model.num_layers_in_first_pipeline_stage", "null"},
        {"model.num_layers_in_last_pipeline_stage", "5"}}},
  };
  for (const Case& k : cases) {
    const Result bridge = Predict(k.model, k.spec, "bridge");
    ASSERT_EQ(bridge.code, kExitOk) << k.spec << ": " << bridge.err;
    ASSERT_EQ(bridge.out.find('\n'), bridge.out.size() - 1) << "one line: " << bridge.out;
    const auto items = Items(bridge.out);
    for (const auto& [key, value] : k.want) {
      if (value.empty()) {
        EXPECT_EQ(items.count(key), 0u) << k.spec << ": " << key;
      } else {
        EXPECT_EQ(items.count(key) ? items.at(key) : "(absent)", value) << k.spec << ": " << key;
      }
    }
    // The YAML file holds the same overrides, each section once.
    const Result yaml = Predict(k.model, k.spec, "yaml");
    ASSERT_EQ(yaml.code, kExitOk) << yaml.err;
    const auto docs = YamlDocuments(yaml.out);
    ASSERT_EQ(docs.size(), 1u) << yaml.out;
    EXPECT_EQ(docs[0], items) << yaml.out;
    EXPECT_NE(yaml.out.find(std::string("# 1: ")), std::string::npos) << yaml.out;
  }
  // An fp16 run reduces in fp16 by default: fp32 is the departure.
  const auto fp16 = Items(Predict("llama2-7b", "tp=2", "bridge", {"--fp16"}).out);
  EXPECT_EQ(fp16.at("mixed_precision.grad_reduce_in_fp32"), "true");
  EXPECT_EQ(fp16.at("ddp.grad_reduce_in_fp32"), "true");
  EXPECT_EQ(Items(Predict("llama2-7b", "tp=2,grad_reduce_dtype=bf16", "bridge", {"--fp16"}).out)
                .count("ddp.grad_reduce_in_fp32"),
            0u);
  // FP8 runs say whether their parameters are FP8 (Megatron-Bridge's FP8 presets turn them on);
  // BF16 runs have none to say.
  const std::vector<std::string> fp8 = {"--fp8-format", "hybrid"};
  EXPECT_EQ(Items(Predict("llama2-7b", "tp=2,dist_opt=on", "bridge", fp8).out)
                .at("mixed_precision.fp8_param_gather"),
            "false");
  EXPECT_EQ(Items(Predict("llama2-7b", "tp=2,dist_opt=on,fp8_param_gather=on", "bridge", fp8).out)
                .at("mixed_precision.fp8_param_gather"),
            "true");
  EXPECT_EQ(Items(Predict("llama2-7b", "tp=2,dist_opt=on", "bridge").out)
                .count("mixed_precision.fp8_param_gather"),
            0u);
}

TEST(CliBridge, PlanWritesOneOverrideSetPerConfiguration) {
  const std::vector<std::string> plan = {
      "plan", "--model", "tiny", "--gpu", "h100", "--global-batch-size", "16", "--top", "3"};
  auto with_format = [&](const char* format) {
    std::vector<std::string> argv = plan;
    argv.insert(argv.end(), {"--format", format});
    const Result r = RunCli(argv);
    EXPECT_EQ(r.code, kExitOk) << r.err;
    return r.out;
  };
  const auto docs = YamlDocuments(with_format("yaml"));
  std::istringstream lines(with_format("bridge"));
  std::vector<std::map<std::string, std::string>> items;
  for (std::string line; std::getline(lines, line);) items.push_back(Items(line));
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs, items);
  // In the ranked order: the SPECs of the csv.
  const auto rows = CsvRows(with_format("csv"));
  ASSERT_EQ(rows.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(items[i].at("model.tensor_model_parallel_size"), rows[i].at("TP"));
    EXPECT_EQ(items[i].at("train.micro_batch_size"), rows[i].at("MBS"));
  }
}

}  // namespace
}  // namespace autopar::cli
