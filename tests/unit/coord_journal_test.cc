#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "autopar/coord/files.h"
#include "autopar/coord/journal.h"
#include "autopar/coord/study.h"
#include "autopar/coord/study_read.h"
#include "autopar/spec/parse.h"

namespace autopar::coord {
namespace {

std::string FreshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "coord_" + name + "_" + std::to_string(::getpid());
  std::string cmd = "rm -rf '" + dir + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  MakeDirectory(dir);
  return dir;
}

pb::JournalRecord Started(int64_t index, const std::string& spec) {
  pb::JournalRecord r;
  r.mutable_trial_started()->set_trial_index(index);
  r.mutable_trial_started()->set_attempt(1);
  r.mutable_trial_started()->set_spec(spec);
  return r;
}

TEST(Crc32c, KnownVector) {
  // The check value of CRC-32C (RFC 3720, appendix B.4).
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32c("", 0), 0u);
  // Incremental equals one-shot.
  EXPECT_EQ(Crc32c("6789", 4, Crc32c("12345", 5)), 0xE3069283u);
}

TEST(Journal, AppendsAndReopens) {
  const std::string dir = FreshDir("reopen");
  const std::string path = dir + "/journal";
  {
    FileJournal::Opened j = FileJournal::Open(path);
    EXPECT_TRUE(j.records.empty());
    for (int i = 0; i < 5; ++i) j.journal->Append(Started(i, "tp=" + std::to_string(i)));
    EXPECT_EQ(j.journal->records(), 5);
  }
  FileJournal::Opened j = FileJournal::Open(path);
  ASSERT_EQ(j.records.size(), 5u);
  EXPECT_EQ(j.cut_bytes, 0);
  EXPECT_EQ(j.records[3].trial_started().spec(), "tp=3");
  j.journal->Append(Started(5, "tp=5"));
  EXPECT_EQ(FileJournal::Open(path).records.size(), 6u);
}

// A crash inside the append of the last record leaves any prefix of its frame: every one of them
// opens to the records before it, and the file is cut back to their end.
TEST(Journal, TruncationAtEveryByteOfTheLastRecordOpensToThePreviousState) {
  const std::string dir = FreshDir("torn");
  const std::string path = dir + "/journal";
  std::string full;
  size_t before_last = 0;
  {
    FileJournal::Opened j = FileJournal::Open(path);
    for (int i = 0; i < 4; ++i) j.journal->Append(Started(i, "tp=" + std::to_string(i)));
    before_last = ReadFile(path).size();
    j.journal->Append(Started(4, "tp=8,pp=4,dp=2,cp=1,up=1,ep=1,vpp=1,mbs=1,sp=on"));
    full = ReadFile(path);
  }
  ASSERT_GT(full.size(), before_last + 8);
  for (size_t cut = before_last; cut < full.size(); ++cut) {
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(full.data(), static_cast<std::streamsize>(cut));
    }
    FileJournal::Opened j = FileJournal::Open(path);
    ASSERT_EQ(j.records.size(), 4u) << "cut at " << cut;
    EXPECT_EQ(j.records.back().trial_started().trial_index(), 3);
    EXPECT_EQ(j.cut_bytes, static_cast<int64_t>(cut - before_last));
    EXPECT_EQ(ReadFile(path).size(), before_last);
    // Appending continues right after the last valid record.
    j.journal->Append(Started(4, "again"));
    j.journal.reset();
    EXPECT_EQ(FileJournal::Open(path).records.back().trial_started().spec(), "again");
  }
}

TEST(Journal, CorruptedChecksumCutsTheTailButAParsableLieIsRefused) {
  const std::string dir = FreshDir("corrupt");
  const std::string path = dir + "/journal";
  {
    FileJournal::Opened j = FileJournal::Open(path);
    for (int i = 0; i < 3; ++i) j.journal->Append(Started(i, "x"));
  }
  std::string bytes = ReadFile(path);
  const size_t one = FrameRecord(Started(0, "x")).size();
  bytes[one + 10] ^= 0x55;  // flip a payload byte of record 1: its checksum fails
  { std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes; }
  EXPECT_EQ(FileJournal::Open(path).records.size(), 1u);

  // A frame with a valid checksum over bytes that are not a record is not a torn write.
  std::string junk = "\xff\xff\xff\xff\x0f";
  std::string frame;
  const uint32_t n = static_cast<uint32_t>(junk.size());
  const uint32_t crc = Crc32c(junk.data(), junk.size());
  for (int i = 0; i < 4; ++i) frame.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  for (int i = 0; i < 4; ++i) frame.push_back(static_cast<char>((crc >> (8 * i)) & 0xff));
  frame += junk;
  { std::ofstream(path, std::ios::binary | std::ios::app) << frame; }
  EXPECT_THROW(FileJournal::Open(path), StudyError);
}

TEST(Files, ErrorsNameThePath) {
  try {
    WriteFileAtomic("/nonexistent-dir/for/sure/result.json", "{}");
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/for/sure/result.json"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ReadFile("/nonexistent-file"), IoError);
  EXPECT_THROW(FileJournal::Open("/nonexistent-dir/journal"), IoError);
  const std::string dir = FreshDir("atomic");
  WriteFileAtomic(dir + "/a.txt", "one");
  WriteFileAtomic(dir + "/a.txt", "two");
  EXPECT_EQ(ReadFile(dir + "/a.txt"), "two");
  // --study runs/llama70b on a fresh checkout: the missing parents are made too.
  MakeDirectory(dir + "/runs/deeper/study");
  struct stat st;
  ASSERT_EQ(::stat((dir + "/runs/deeper/study").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  MakeDirectory(dir + "/runs/deeper/study");  // exists: fine
  EXPECT_THROW(MakeDirectory(dir + "/a.txt/study"), IoError);  // a file in the way
}

TEST(StudyDir, ASecondCoordinatorIsLockedOut) {
  const std::string dir = FreshDir("lock");
  StudyDir first(dir + "/study");
  EXPECT_THROW(StudyDir second(dir + "/study"), StudyError);
  pb::StudyDescription d;
  d.set_format_version(kStudyFormatVersion);
  d.mutable_model()->set_name("m");
  first.WriteDescription(d);
  ASSERT_TRUE(first.HasDescription());
  EXPECT_EQ(first.ReadDescription().model().name(), "m");
}

TEST(StudyDir, MismatchNamesTheField) {
  pb::StudyDescription a;
  a.set_format_version(kStudyFormatVersion);
  a.mutable_model()->set_num_layers(32);
  a.mutable_search()->set_seed(1);
  pb::StudyDescription b = a;
  EXPECT_NO_THROW(CheckSameStudy(a, b));
  b.mutable_search()->set_stop_fraction(0.9);  // stop knobs may change on resume
  EXPECT_NO_THROW(CheckSameStudy(a, b));
  b.mutable_model()->set_num_layers(80);
  try {
    CheckSameStudy(a, b);
    FAIL() << "no error";
  } catch (const StudyError& e) {
    EXPECT_NE(std::string(e.what()).find("num_layers"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("model"), std::string::npos) << e.what();
  }
  pb::StudyDescription c = a;
  c.mutable_search()->set_seed(2);
  EXPECT_THROW(CheckSameStudy(a, c), StudyError);
  EXPECT_EQ(Fingerprint(a), Fingerprint(c));  // the seed is rank 0's business
  EXPECT_NE(Fingerprint(a), Fingerprint(b));
}

// study.pb keeps every ModelSpec field, the sliding window and MTP included, so `report` and
// `--resume` see the model the study was started with.
TEST(StudyDir, ModelRoundTripsThroughTheDescription) {
  ModelSpec m = ModelPreset("deepseek-v3");
  m.window_size = 4096;
  m.window_attn_skip_freq = 6;
  m.mtp_num_layers = 1;
  ClusterSpec cluster;
  cluster.gpu = GpuPreset("h800");
  pb::StudyDescription d;
  *d.mutable_model() = Describe(m);
  *d.mutable_train() = Describe(TrainSpec{});
  *d.mutable_cluster() = Describe(cluster);
  *d.mutable_perf() = Describe(PerfConstants{});
  const ModelSpec back = SpecsOf(d).model;
  EXPECT_EQ(back.window_size, 4096);
  EXPECT_EQ(back.window_attn_skip_freq, 6);
  EXPECT_EQ(back.mtp_num_layers, 1);
  EXPECT_EQ(back.num_experts, m.num_experts);
  EXPECT_EQ(back.moe_first_dense_layers, m.moe_first_dense_layers);
  pb::StudyDescription other = d;
  other.mutable_model()->set_window_size(0);
  EXPECT_THROW(CheckSameStudy(d, other), StudyError);
}

// The NVLink domain round-trips; a study written before the field existed has none in its
// GpuDesc and reads as 0, the node, which is what the h100 preset still says, so such a study
// still resumes under the same inputs. A changed domain refuses --resume.
TEST(StudyDir, NvlinkDomainRoundTripsAndOldStudiesReadAsTheNode) {
  const auto describe = [](const ClusterSpec& cluster) {
    pb::StudyDescription d;
    *d.mutable_model() = Describe(ModelPreset("llama2-70b"));
    *d.mutable_train() = Describe(TrainSpec{});
    *d.mutable_cluster() = Describe(cluster);
    *d.mutable_perf() = Describe(PerfConstants{});
    return d;
  };
  const pb::StudyDescription d = describe(ClusterSpec{18, 4, GpuPreset("gb200")});
  EXPECT_EQ(SpecsOf(d).cluster.gpu.nvlink_domain_gpus, 72);
  EXPECT_EQ(SpecsOf(d).cluster.NvlinkDomainGpus(), 72);
  pb::StudyDescription one_rack_less = d;
  one_rack_less.mutable_cluster()->mutable_gpu()->set_nvlink_domain_gpus(36);
  EXPECT_THROW(CheckSameStudy(d, one_rack_less), StudyError);

  pb::StudyDescription old = describe(ClusterSpec{4, 8, GpuPreset("h100")});
  old.mutable_cluster()->mutable_gpu()->clear_nvlink_domain_gpus();  // as written before
  EXPECT_EQ(SpecsOf(old).cluster.gpu.nvlink_domain_gpus, 0);
  EXPECT_EQ(SpecsOf(old).cluster.NvlinkDomainGpus(), 8);
  const pb::StudyDescription now = describe(ClusterSpec{4, 8, GpuPreset("h100")});
  EXPECT_EQ(old.SerializeAsString(), now.SerializeAsString());
  EXPECT_NO_THROW(CheckSameStudy(old, now));
}

}  // namespace
}  // namespace autopar::coord
