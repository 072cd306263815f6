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
  std::string dir = ::testing::TempDir() + "coord_" + name + "_" + std::to_string(::getpid());
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

// ---- corruption, gaps and salvage (docs/journal.md §3, §5, §9) ----

std::string U32(uint32_t v) {
  std::string out;
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return out;
}

// A format-2 frame built by hand from the documented layout, whatever the payload.
std::string RawFrame(const std::string& payload, uint32_t sequence) {
  std::string head = U32(static_cast<uint32_t>(payload.size())) + U32(sequence) +
                     U32(Crc32c(payload.data(), payload.size()));
  head += U32(Crc32c(head.data(), head.size()));
  return head + payload;
}

// A format-1 frame (before sequence numbers).
std::string LegacyFrame(const pb::JournalRecord& r) {
  const std::string payload = r.SerializeAsString();
  return U32(static_cast<uint32_t>(payload.size())) + U32(Crc32c(payload.data(), payload.size())) +
         payload;
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// What a Tuner writes: a session, the probe, three trials (the second retried), the end.
std::vector<pb::JournalRecord> StudyRecords() {
  std::vector<pb::JournalRecord> out;
  pb::JournalRecord r;
  r.mutable_session()->set_session(1);
  r.mutable_session()->set_host("node-0");
  out.push_back(r);
  r.Clear();
  auto* f = r.mutable_probe()->add_features();
  f->set_feature("gemm");
  f->add_ratios(1.25);
  out.push_back(r);
  auto trial = [&](int64_t index, int64_t candidate, int attempts) {
    for (int a = 1; a <= attempts; ++a) {
      pb::JournalRecord s;
      s.mutable_trial_started()->set_trial_index(index);
      s.mutable_trial_started()->set_attempt(a);
      s.mutable_trial_started()->set_candidate(candidate);
      s.mutable_trial_started()->set_spec("tp=" + std::to_string(candidate));
      out.push_back(s);
    }
    pb::JournalRecord t;
    pb::TrialResult* res = t.mutable_trial_finished()->mutable_result();
    res->set_trial_index(index);
    res->set_attempt(attempts);
    res->set_spec("tp=" + std::to_string(candidate));
    res->set_status(pb::OK);
    res->set_step_time_s(1.5 + 0.25 * static_cast<double>(candidate));
    t.mutable_trial_finished()->set_candidate(candidate);
    t.mutable_trial_finished()->set_elapsed_s(10.0 * static_cast<double>(index + 1));
    t.mutable_trial_finished()->set_state_digest(0x1234567 + static_cast<uint64_t>(index));
    out.push_back(t);
  };
  trial(0, 4, 1);
  trial(1, 2, 2);
  trial(2, 8, 1);
  r.Clear();
  r.mutable_finished()->set_stop_reason("converged");
  r.mutable_finished()->set_trials(3);
  out.push_back(r);
  return out;
}

// The records written through FileJournal, the file's bytes, and where each frame starts.
struct Written {
  std::vector<pb::JournalRecord> records;
  std::string bytes;
  std::vector<size_t> starts;  // plus the file's end
};

Written WriteStudy(const std::string& path) {
  Written w;
  w.records = StudyRecords();
  std::remove(path.c_str());
  FileJournal::Opened j = FileJournal::Open(path);
  for (const pb::JournalRecord& r : w.records) {
    w.starts.push_back(ReadFile(path).size());
    j.journal->Append(r);
  }
  w.bytes = ReadFile(path);
  w.starts.push_back(w.bytes.size());
  return w;
}

bool Same(const pb::JournalRecord& a, const pb::JournalRecord& b) {
  return a.SerializeAsString() == b.SerializeAsString();
}

TEST(Journal, FileStartsWithItsHeaderAndFramesCarrySequenceNumbers) {
  const std::string path = FreshDir("format") + "/journal";
  const Written w = WriteStudy(path);
  ASSERT_EQ(w.starts[0], kJournalHeaderBytes);
  EXPECT_EQ(w.bytes.substr(0, 4), "APTJ");
  EXPECT_EQ(w.bytes.substr(0, kJournalHeaderBytes), JournalHeader(kEveryRecordChecked));
  for (size_t i = 0; i < w.records.size(); ++i) {
    EXPECT_EQ(w.bytes.substr(w.starts[i], w.starts[i + 1] - w.starts[i]),
              RawFrame(w.records[i].SerializeAsString(), static_cast<uint32_t>(i)))
        << "frame " << i;
  }
}

TEST(Journal, TornTailIsStillCutAndRecovered) {
  const std::string path = FreshDir("torn_tail") + "/journal";
  const Written w = WriteStudy(path);
  const size_t last = w.starts[w.records.size() - 1];
  // A torn append of one more record, and a flipped byte in the last one: both torn tails.
  for (const std::string& bytes :
       {w.bytes + RawFrame(w.records[0].SerializeAsString(), 99).substr(0, 11),
        w.bytes.substr(0, w.bytes.size() - 1) + static_cast<char>(w.bytes.back() ^ 0x5a)}) {
    WriteBytes(path, bytes);
    FileJournal::Opened j = FileJournal::Open(path);
    const size_t keep = bytes.size() > w.bytes.size() ? w.records.size() : w.records.size() - 1;
    ASSERT_EQ(j.records.size(), keep);
    EXPECT_EQ(ReadFile(path), w.bytes.substr(0, keep == w.records.size() ? w.bytes.size() : last));
    EXPECT_GT(j.cut_bytes, 0);
  }
}

TEST(Journal, BadFrameInTheMiddleIsRefusedWithItsOffsetAndRecordAndTheFileUnchanged) {
  const std::string dir = FreshDir("middle");
  const std::string path = dir + "/journal";
  const Written w = WriteStudy(path);
  std::string bytes = w.bytes;
  bytes[w.starts[3] + kFrameHeaderBytes + 2] ^= 0x10;  // the payload of record 3
  WriteBytes(path, bytes);
  try {
    FileJournal::Open(path);
    FAIL() << "no error";
  } catch (const JournalCorrupt& e) {
    EXPECT_EQ(e.record(), 3);
    EXPECT_EQ(e.offset(), static_cast<int64_t>(w.starts[3]));
    EXPECT_EQ(e.valid_after(), static_cast<int64_t>(w.records.size() - 4));
    const std::string what = e.what();
    EXPECT_NE(what.find("corrupt at record 3, offset " + std::to_string(w.starts[3])),
              std::string::npos)
        << what;
    EXPECT_NE(what.find(std::to_string(w.records.size() - 4) + " valid records follow"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("--salvage"), std::string::npos) << what;
  }
  EXPECT_EQ(ReadFile(path), bytes);  // byte for byte
  // `report`'s reader refuses it the same way (exit 4 at the CLI: a StudyError).
  std::vector<pb::JournalRecord> records;
  int64_t bad = -1;
  EXPECT_THROW(ParseFrames(bytes, &records, &bad), JournalCorrupt);
  EXPECT_THROW(ReadJournal(dir, pb::StudyDescription()), JournalCorrupt);
  EXPECT_EQ(ReadFile(path), bytes);
}

TEST(Journal, AGapInTheSequenceNumbersIsCorruption) {
  const std::string path = FreshDir("gap") + "/journal";
  const Written w = WriteStudy(path);
  // Frame 4 lost whole: every frame left checks, but 3 is followed by 5.
  const std::string bytes = w.bytes.substr(0, w.starts[4]) + w.bytes.substr(w.starts[5]);
  WriteBytes(path, bytes);
  try {
    FileJournal::Open(path);
    FAIL() << "no error";
  } catch (const JournalCorrupt& e) {
    EXPECT_EQ(e.record(), 4);
    EXPECT_EQ(e.offset(), static_cast<int64_t>(w.starts[4]));
    EXPECT_EQ(e.valid_after(), static_cast<int64_t>(w.records.size() - 5));
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ReadFile(path), bytes);
  // So is a frame written twice.
  const std::string twice = w.bytes.substr(0, w.starts[5]) +
                            w.bytes.substr(w.starts[4], w.starts[5] - w.starts[4]) +
                            w.bytes.substr(w.starts[5]);
  const JournalScan scan = ScanJournal(twice);
  EXPECT_TRUE(scan.corrupt());
  EXPECT_EQ(scan.corrupt_record, 5);
  EXPECT_EQ(scan.records.size(), w.records.size());
}

// Each original record, its trial indices cleared: what a salvage must keep.
std::string Content(pb::JournalRecord r) {
  if (r.has_trial_started()) r.mutable_trial_started()->set_trial_index(0);
  if (r.has_trial_finished()) r.mutable_trial_finished()->mutable_result()->set_trial_index(0);
  return r.SerializeAsString();
}

// The salvaged records are what Tuner::Replay accepts: trial indices 0, 1, 2, … each started
// before it finishes, retries of the same candidate.
void ExpectReplayable(const std::vector<pb::JournalRecord>& records) {
  int64_t next = 0;
  int64_t started = -1;  // candidate in flight
  for (const pb::JournalRecord& r : records) {
    if (r.has_trial_started()) {
      EXPECT_EQ(r.trial_started().trial_index(), next);
      if (started >= 0) {
        EXPECT_EQ(r.trial_started().candidate(), started);
      }
      started = r.trial_started().candidate();
    } else if (r.has_trial_finished()) {
      EXPECT_EQ(r.trial_finished().result().trial_index(), next);
      EXPECT_EQ(r.trial_finished().candidate(), started);
      started = -1;
      ++next;
    }
  }
}

// Salvage after losing record `lost` (or the header: lost < 0) of StudyRecords(): every other
// record is kept, a lost result's trial is started again at the end.
void ExpectSalvaged(const std::vector<pb::JournalRecord>& original, int lost,
                    const std::vector<pb::JournalRecord>& salvaged) {
  ExpectReplayable(salvaged);
  std::vector<std::string> want, got;
  for (size_t i = 0; i < original.size(); ++i) {
    if (static_cast<int>(i) == lost || original[i].has_trial_started()) continue;
    want.push_back(Content(original[i]));
  }
  for (const pb::JournalRecord& r : salvaged) {
    if (!r.has_trial_started()) got.push_back(Content(r));
  }
  EXPECT_EQ(got, want) << "lost record " << lost;
  if (lost >= 0 && original[static_cast<size_t>(lost)].has_trial_finished()) {
    // Its trial is left in flight at the end, for Run() to run again.
    const pb::JournalRecord* in_flight = nullptr;
    for (const pb::JournalRecord& r : salvaged) {
      if (r.has_trial_started()) in_flight = &r;
      if (r.has_trial_finished()) in_flight = nullptr;
    }
    ASSERT_NE(in_flight, nullptr) << "lost record " << lost;
    EXPECT_EQ(in_flight->trial_started().candidate(),
              original[static_cast<size_t>(lost)].trial_finished().candidate());
  }
}

TEST(Journal, SalvageKeepsEveryValidRecord) {
  const std::string dir = FreshDir("salvage");
  const std::string path = dir + "/journal";
  const Written w = WriteStudy(path);
  // Record 6 is trial 1's result: its trial runs again, trial 2 becomes trial 1.
  std::string bytes = w.bytes;
  bytes[w.starts[6] + kFrameHeaderBytes + 5] ^= 0x01;
  WriteBytes(path, bytes);
  FileJournal::Opened j = FileJournal::Open(path, JournalRecovery::kSalvage);
  EXPECT_EQ(j.salvaged_copy, path + ".corrupt-1");
  EXPECT_EQ(ReadFile(j.salvaged_copy), bytes);  // the damaged file, as it was
  EXPECT_NE(j.salvage_report.find("corrupt at record 6"), std::string::npos) << j.salvage_report;
  ExpectSalvaged(w.records, 6, j.records);
  // The records before the damage replay with every check; trial 1's second start is dropped
  // with its lost result.
  EXPECT_EQ(j.checked_records, 4u);
  ASSERT_EQ(j.records.size(), w.records.size() - 2);
  EXPECT_EQ(j.records[4].trial_started().candidate(), 8);
  EXPECT_EQ(j.records[4].trial_started().trial_index(), 1);
  EXPECT_EQ(j.records.back().trial_started().trial_index(), 2);
  // The journal goes on from there, and reopens without --salvage to the same records.
  pb::JournalRecord more;
  more.mutable_session()->set_session(2);
  j.journal->Append(more);
  j.journal.reset();
  FileJournal::Opened again = FileJournal::Open(path);
  ASSERT_EQ(again.records.size(), w.records.size() - 1);
  EXPECT_EQ(again.checked_records, 4u);
  EXPECT_TRUE(Same(again.records.back(), more));
  // A second salvage does not overwrite the first copy.
  std::string damaged = ReadFile(path);
  damaged[kJournalHeaderBytes + kFrameHeaderBytes + 1] ^= 0x40;  // record 0
  WriteBytes(path, damaged);
  FileJournal::Opened third = FileJournal::Open(path, JournalRecovery::kSalvage);
  EXPECT_EQ(third.salvaged_copy, path + ".corrupt-2");
  EXPECT_EQ(ReadFile(path + ".corrupt-1"), bytes);
  EXPECT_EQ(third.checked_records, 0u);
  EXPECT_EQ(third.records.size(), w.records.size() - 2);
}

TEST(Journal, RepairRestoresALostStartAndDropsASecondProbe) {
  const std::vector<pb::JournalRecord> all = StudyRecords();
  // Lose trial 0's start (record 2): its result carries what the start needs.
  std::vector<pb::JournalRecord> kept(all);
  kept.erase(kept.begin() + 2);
  size_t checked = 0;
  const std::vector<pb::JournalRecord> repaired = RepairRecords(kept, 2, &checked);
  EXPECT_EQ(checked, 2u);
  ASSERT_EQ(repaired.size(), all.size());
  EXPECT_TRUE(repaired[2].has_trial_started());
  EXPECT_EQ(repaired[2].trial_started().candidate(), 4);
  EXPECT_EQ(repaired[2].trial_started().spec(), "tp=4");
  ExpectSalvaged(all, 2, repaired);
  // Nothing lost: nothing changes, and every record keeps its checks.
  const std::vector<pb::JournalRecord> same = RepairRecords(all, all.size(), &checked);
  EXPECT_EQ(checked, all.size());
  ASSERT_EQ(same.size(), all.size());
  for (size_t i = 0; i < all.size(); ++i) EXPECT_TRUE(Same(same[i], all[i])) << i;
  // A probe after the trials started would not replay: dropped.
  std::vector<pb::JournalRecord> probes(all);
  probes.insert(probes.begin() + 4, all[1]);
  EXPECT_EQ(RepairRecords(probes, 4, &checked).size(), all.size());
}

// One bit flipped anywhere in a small journal: a flip in the last frame is a torn tail (the
// records before it, exactly); anywhere else it is corruption, refused with the file unchanged,
// and a salvage keeps every record but the damaged one. Never a crash, never a record that
// differs from what was written. Every flip goes through the reader (ScanJournal, ParseFrames,
// RepairRecords); a sample of them through the file (FileJournal::Open), whose rewrites and
// fsyncs are slow on some disks.
TEST(Journal, BitFlipAtEveryByte) {
  const std::string dir = FreshDir("bitflip");
  const std::string path = dir + "/journal";
  const Written w = WriteStudy(path);
  const size_t n = w.records.size();
  int torn = 0, corrupt = 0;
  for (size_t at = 0; at < w.bytes.size(); ++at) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bytes = w.bytes;
      bytes[at] = static_cast<char>(bytes[at] ^ (1 << bit));
      // The frame the flip is in (-1: the file header).
      int frame = -1;
      for (size_t i = 0; i < n; ++i) {
        if (at >= w.starts[i] && at < w.starts[i + 1]) frame = static_cast<int>(i);
      }
      const std::string where = "flip of bit " + std::to_string(bit) + " at byte " +
                                std::to_string(at) + " (frame " + std::to_string(frame) + ")";
      const JournalScan scan = ScanJournal(bytes);
      // Whatever is read back was written: the valid records are the originals but the flipped.
      size_t k = 0;
      for (const pb::JournalRecord& r : scan.records) {
        if (static_cast<int>(k) == frame) ++k;
        ASSERT_LT(k, n) << where;
        ASSERT_TRUE(Same(r, w.records[k])) << where;
        ++k;
      }
      const bool sample = bit == 0 && (at % 7 == 0 || at == w.starts[frame < 0 ? 0 : frame]);
      std::vector<pb::JournalRecord> read;
      int64_t unused = -1;
      if (frame == static_cast<int>(n) - 1) {
        ++torn;
        ASSERT_TRUE(scan.torn()) << where;
        ASSERT_EQ(ParseFrames(bytes, &read, &unused), w.starts[n - 1]) << where;
        ASSERT_EQ(read.size(), n - 1) << where;
        if (!sample) continue;
        WriteBytes(path, bytes);
        FileJournal::Opened j = FileJournal::Open(path);
        ASSERT_EQ(j.records.size(), n - 1) << where;
        ASSERT_EQ(ReadFile(path), w.bytes.substr(0, w.starts[n - 1])) << where;
        continue;
      }
      ++corrupt;
      ASSERT_TRUE(scan.corrupt()) << where;
      ASSERT_EQ(scan.records.size(), frame < 0 ? n : n - 1) << where;
      ASSERT_EQ(scan.corrupt_record, frame < 0 ? 0 : frame) << where;
      ASSERT_EQ(scan.corrupt_offset, frame < 0 ? 0 : static_cast<int64_t>(w.starts[frame]))
          << where;
      ASSERT_THROW(ParseFrames(bytes, &read, &unused), JournalCorrupt) << where;
      size_t checked = 0;
      ExpectSalvaged(w.records, frame, RepairRecords(scan.records, scan.intact_records, &checked));
      if (!sample) continue;
      WriteBytes(path, bytes);
      ASSERT_THROW(FileJournal::Open(path), JournalCorrupt) << where;
      ASSERT_EQ(ReadFile(path), bytes) << where;
      FileJournal::Opened j = FileJournal::Open(path, JournalRecovery::kSalvage);
      ExpectSalvaged(w.records, frame, j.records);
      ASSERT_EQ(ReadFile(j.salvaged_copy), bytes) << where;
      std::remove(j.salvaged_copy.c_str());
      j.journal.reset();
      ASSERT_EQ(FileJournal::Open(path).records.size(), j.records.size()) << where;
    }
  }
  EXPECT_EQ(torn, static_cast<int>(8 * (w.starts[n] - w.starts[n - 1])));
  EXPECT_EQ(corrupt, static_cast<int>(8 * w.starts[n - 1]));
}

TEST(Journal, APayloadThatPassesItsChecksumsButDoesNotParseIsRefused) {
  const std::string path = FreshDir("lie") + "/journal";
  const Written w = WriteStudy(path);
  const std::string bytes =
      w.bytes + RawFrame("\xff\xff\xff\xff\x0f", static_cast<uint32_t>(w.records.size()));
  WriteBytes(path, bytes);
  EXPECT_THROW(FileJournal::Open(path), StudyError);
  EXPECT_THROW(FileJournal::Open(path, JournalRecovery::kSalvage), StudyError);
  EXPECT_EQ(ReadFile(path), bytes);
}

TEST(Journal, ANewerFormatIsRefusedByName) {
  const std::string path = FreshDir("newer") + "/journal";
  // In this format's header layout and in format 2's.
  for (const std::string& fingerprint : {U32(7) + U32(0), std::string()}) {
    std::string header = "APTJ" + U32(4) + U32(0xffffffff) + U32(0xffffffff) + fingerprint;
    header += U32(Crc32c(header.data(), header.size()));
    WriteBytes(path, header);
    try {
      FileJournal::Open(path);
      FAIL() << "no error";
    } catch (const StudyError& e) {
      EXPECT_NE(std::string(e.what()).find("format 4"), std::string::npos) << e.what();
    }
    EXPECT_EQ(ReadFile(path), header);
  }
}

// Issue 17: a journal carries its study's fingerprint, and opening or reading it for another
// study is refused (exit 4 at the CLI) with the file unchanged, even with --salvage; 0 on either
// side is "not recorded". The fingerprint is covered by the header's checksum.
TEST(Journal, AJournalOfAnotherStudyIsRefusedAndLeftAsItIs) {
  const std::string path = FreshDir("foreign") + "/journal";
  std::remove(path.c_str());
  const std::vector<pb::JournalRecord> records = StudyRecords();
  {
    FileJournal::Opened j = FileJournal::Open(path, JournalRecovery::kRefuseCorrupt, 0xabc);
    for (const pb::JournalRecord& r : records) j.journal->Append(r);
  }
  const std::string bytes = ReadFile(path);
  EXPECT_EQ(bytes.substr(0, kJournalHeaderBytes), JournalHeader(kEveryRecordChecked, 0xabc));
  EXPECT_EQ(ScanJournal(bytes).fingerprint, 0xabcu);
  for (const JournalRecovery recovery :
       {JournalRecovery::kRefuseCorrupt, JournalRecovery::kSalvage}) {
    try {
      FileJournal::Open(path, recovery, 0xdef);
      FAIL() << "another study's journal was opened";
    } catch (const JournalForeign& e) {
      EXPECT_NE(std::string(e.what()).find("belongs to another study"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(ReadFile(path), bytes);
  }
  std::vector<pb::JournalRecord> read;
  int64_t unused = -1;
  EXPECT_THROW(ParseFrames(bytes, &read, &unused, path, 0xdef), JournalForeign);
  EXPECT_EQ(ParseFrames(bytes, &read, &unused, path, 0xabc), bytes.size());
  EXPECT_EQ(read.size(), records.size());
  EXPECT_EQ(FileJournal::Open(path, JournalRecovery::kRefuseCorrupt, 0xabc).records.size(),
            records.size());
  EXPECT_EQ(FileJournal::Open(path).records.size(), records.size());  // 0: not checked
}

// A format-2 journal (no fingerprint) is read as it is and rewritten in format 3 with the
// fingerprint of the study that opens it.
TEST(Journal, Format2JournalsAreReadAndUpgradedWithTheFingerprint) {
  const std::string path = FreshDir("format2") + "/journal";
  const std::vector<pb::JournalRecord> records = StudyRecords();
  std::string old = "APTJ" + U32(2) + U32(0xffffffff) + U32(0xffffffff);
  old += U32(Crc32c(old.data(), old.size()));
  for (size_t i = 0; i < records.size(); ++i) {
    old += RawFrame(records[i].SerializeAsString(), static_cast<uint32_t>(i));
  }
  const JournalScan scan = ScanJournal(old);
  EXPECT_EQ(scan.format, 2u);
  EXPECT_FALSE(scan.corrupt());
  EXPECT_EQ(scan.records.size(), records.size());
  WriteBytes(path, old);
  FileJournal::Opened j = FileJournal::Open(path, JournalRecovery::kRefuseCorrupt, 0x5eed);
  EXPECT_TRUE(j.upgraded);
  ASSERT_EQ(j.records.size(), records.size());
  j.journal.reset();
  const std::string now = ReadFile(path);
  EXPECT_EQ(now.substr(0, kJournalHeaderBytes), JournalHeader(kEveryRecordChecked, 0x5eed));
  EXPECT_THROW(FileJournal::Open(path, JournalRecovery::kRefuseCorrupt, 0x1), JournalForeign);
}

// Journals written before sequence numbers (format 1) are read with the same rules, and rewritten
// in format 3 when opened for appending.
TEST(Journal, Format1JournalsAreReadAndUpgraded) {
  const std::string path = FreshDir("legacy") + "/journal";
  const std::vector<pb::JournalRecord> records = StudyRecords();
  std::string old;
  std::vector<size_t> starts;
  for (const pb::JournalRecord& r : records) {
    starts.push_back(old.size());
    old += LegacyFrame(r);
  }
  // A bad frame in the middle: refused, file unchanged.
  std::string bad = old;
  bad[starts[5] + 9] ^= 0x04;
  WriteBytes(path, bad);
  try {
    FileJournal::Open(path);
    FAIL() << "no error";
  } catch (const JournalCorrupt& e) {
    EXPECT_EQ(e.record(), 5);
    EXPECT_EQ(e.offset(), static_cast<int64_t>(starts[5]));
  }
  EXPECT_EQ(ReadFile(path), bad);
  // A torn tail: cut, and the rest upgraded.
  WriteBytes(path, old + LegacyFrame(records[0]).substr(0, 7));
  {
    std::vector<pb::JournalRecord> read;
    int64_t unused = -1;
    EXPECT_EQ(ParseFrames(ReadFile(path), &read, &unused), old.size());
    EXPECT_EQ(read.size(), records.size());
  }
  FileJournal::Opened j = FileJournal::Open(path);
  EXPECT_TRUE(j.upgraded);
  EXPECT_EQ(j.cut_bytes, 7);
  ASSERT_EQ(j.records.size(), records.size());
  for (size_t i = 0; i < records.size(); ++i) EXPECT_TRUE(Same(j.records[i], records[i]));
  j.journal->Append(records[0]);
  j.journal.reset();
  const std::string now = ReadFile(path);
  EXPECT_EQ(now.substr(0, 4), "APTJ");
  EXPECT_EQ(FileJournal::Open(path).records.size(), records.size() + 1);
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

// The stack's statements a study models with (--tp-comm-overlap, --cross-entropy-loss-fusion,
// --attention-efficiency, --no-async-tp-backward) round-trip, so `--resume` and `report` predict
// as the run that started the study; a changed one refuses --resume. A description written before
// the asynchronous backward's field existed reads as today's Megatron, with it.
TEST(StudyDir, StackStatementsRoundTripThroughTheDescription) {
  PerfConstants k;
  k.stack.tp_comm_overlap = true;
  k.stack.cross_entropy_fusion = true;
  k.eff.attention = 0.32;
  pb::StudyDescription d;
  *d.mutable_model() = Describe(ModelPreset("llama2-7b"));
  *d.mutable_train() = Describe(TrainSpec{});
  *d.mutable_cluster() = Describe(ClusterSpec{});
  *d.mutable_perf() = Describe(k);
  EXPECT_TRUE(SpecsOf(d).constants.stack.tp_comm_overlap);
  EXPECT_TRUE(SpecsOf(d).constants.stack.cross_entropy_fusion);
  EXPECT_EQ(SpecsOf(d).constants.eff.attention, 0.32);
  EXPECT_TRUE(SpecsOf(d).constants.stack.async_tp_backward);
  EXPECT_FALSE(d.perf().no_async_tp_backward());  // the field's default: an older study's value
  pb::StudyDescription other = d;
  other.mutable_perf()->set_tp_comm_overlap(false);
  EXPECT_THROW(CheckSameStudy(d, other), StudyError);
  k.stack.async_tp_backward = false;
  *other.mutable_perf() = Describe(k);
  EXPECT_FALSE(SpecsOf(other).constants.stack.async_tp_backward);
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
