// --shard I/N and --merge: the shard range function, the parse of I/N, the
// per-chunk channel sums, and manifests with parts and shard records.
#include <gtest/gtest.h>

#include "dstk/error.hpp"
#include "dstk/manifest.hpp"
#include "dstk/shard.hpp"
#include "support/error_of.hpp"

using namespace dstk;
using test_support::code_of;

namespace {

TEST(ShardSpec, ParsesZeroBasedAndRejectsTheRest) {
    const ShardSpec s = parse_shard("2/3");
    EXPECT_EQ(s.index, 2u);
    EXPECT_EQ(s.count, 3u);
    EXPECT_EQ(parse_shard("0/1").count, 1u);
    for (const char* bad : {"3/3", "1/0", "0/0", "", "/", "1/", "/2", "a/2", "1/b", "-1/2", "1/2/3", " 1/2", "1.0/2",
                            "99999999999999999999/2"})
        EXPECT_EQ(code_of([&] { parse_shard(bad); }), ExitCode::usage) << bad;
    try {
        parse_shard("3/3");
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("counted from 0"), std::string::npos) << e.what();
    }
}

// Disjoint, in order, covering, starting on chunk boundaries, balanced to a chunk.
TEST(ShardRange, PartsTileTheSplitAtChunkBoundaries) {
    for (std::uint64_t samples : {0ull, 1ull, 7ull, 100ull, 1000ull, 1001ull, 65536ull})
        for (std::uint64_t chunk : {1ull, 3ull, 64ull, 170ull, 5000ull})
            for (std::uint64_t n : {1ull, 2ull, 3ull, 4ull, 7ull, 16ull}) {
                std::uint64_t end = 0, lo = ~0ull, hi = 0;
                for (std::uint64_t i = 0; i < n; ++i) {
                    const SampleRange r = shard_range(samples, chunk, {i, n});
                    EXPECT_EQ(r.first, end) << samples << " " << chunk << " " << i << "/" << n;
                    EXPECT_TRUE(r.first % chunk == 0 || r.first == samples);
                    end = r.first + r.count;
                    const std::uint64_t chunks = (r.count + chunk - 1) / chunk;
                    lo = std::min(lo, chunks);
                    hi = std::max(hi, chunks);
                    // A pure function of its arguments.
                    const SampleRange again = shard_range(samples, chunk, {i, n});
                    EXPECT_EQ(again.first, r.first);
                    EXPECT_EQ(again.count, r.count);
                }
                EXPECT_EQ(end, samples);
                EXPECT_LE(hi - lo, 1u) << samples << " " << chunk << " " << n;
            }
}

TEST(ShardRange, KnownCutsAndEmptyParts) {
    // 1000 samples in 170-sample chunks: 6 chunks -> 2, 2, 2 (the last one short).
    EXPECT_EQ(shard_range(1000, 170, {0, 3}).count, 340u);
    EXPECT_EQ(shard_range(1000, 170, {2, 3}).first, 680u);
    EXPECT_EQ(shard_range(1000, 170, {2, 3}).count, 320u);
    // 2 chunks in 3 parts: part 0 is empty.
    EXPECT_EQ(shard_range(300, 170, {0, 3}).count, 0u);
    EXPECT_EQ(shard_range(300, 170, {1, 3}).count, 170u);
    EXPECT_EQ(shard_range(300, 170, {2, 3}).count, 130u);
    // Huge counts do not overflow.
    const std::uint64_t big = ~0ull - 5;
    EXPECT_EQ(shard_range(big, 1ull << 40, {1, 2}).first + shard_range(big, 1ull << 40, {1, 2}).count, big);
    EXPECT_THROW(shard_range(10, 0, {0, 1}), Error);
}

TEST(ChannelSums, AddsRowsInOrder) {
    ChannelSums s(2);
    s.add({1, 3, 1, 9});
    s.add({3, 5, 9, 25});
    const ChannelStats st = s.stats(2);
    EXPECT_DOUBLE_EQ(st.mean[0], 2.0);
    EXPECT_DOUBLE_EQ(st.mean[1], 4.0);
    EXPECT_DOUBLE_EQ(st.std[0], 1.0);
    EXPECT_DOUBLE_EQ(st.std[1], 1.0);
    EXPECT_THROW(s.add({1, 2}), Error);
}

// The text today's dstk writes for a manifest without parts or shard record.
const char* const plain_manifest = R"({
  "format_version": 1,
  "input_field": "x",
  "label_field": "y",
  "num_classes": 10,
  "provenance": {
    "command_line": "dsgen out",
    "created": "2026-11-24T00:00:00Z",
    "params": {
      "kind": "images"
    },
    "seed": 0,
    "tool": "dsgen",
    "version": "0.1.0"
  },
  "splits": [
    {
      "fields": [
        {
          "bytes": 3200,
          "checksum": "xxh64:0123456789abcdef",
          "dtype": "u8",
          "file": "train_x.npy",
          "name": "x",
          "shape": [
            3,
            4,
            4
          ],
          "storage": "npy"
        },
        {
          "bytes": 208,
          "chunk_samples": 16,
          "dtype": "i32",
          "file": "train_y.zst",
          "name": "y",
          "shape": [],
          "storage": "zstd-chunked"
        }
      ],
      "name": "train",
      "samples": 20
    }
  ],
  "stats": {
    "mean": [
      0.5
    ],
    "std": [
      0.25
    ]
  }
}
)";

TEST(ManifestParts, OldManifestsReadAndWriteAsBefore) {
    const Manifest m = parse_manifest(plain_manifest, "plain.json");
    EXPECT_TRUE(m.splits[0].fields[0].parts.empty());
    EXPECT_FALSE(m.shard);
    EXPECT_EQ(serialize_manifest(m), plain_manifest);
}

Manifest parted() {
    Manifest m = parse_manifest(plain_manifest, "plain.json");
    FieldInfo& x = m.splits[0].fields[0];
    x.file.clear();
    x.checksum.clear();
    x.parts = {{"train_x-00000-of-00002.npy", 16, 2000, "xxh64:1111111111111111"},
               {"train_x-00001-of-00002.npy", 4, 1200, ""}};
    m.shard = ShardInfo{1, 2, 16, "xxh64:2222222222222222", {{"train", 16, 36, {{1.5, 2.5}, {0.1, 1e-300}}}}};
    return m;
}

TEST(ManifestParts, RoundTrip) {
    const Manifest m = parted();
    const std::string text = serialize_manifest(m);
    EXPECT_EQ(text.find("\"file\": \"\""), std::string::npos); // a field in parts has no "file"
    const Manifest again = parse_manifest(text, "again.json");
    const FieldInfo& x = again.splits[0].fields[0];
    ASSERT_EQ(x.parts.size(), 2u);
    EXPECT_EQ(x.parts[0].file, "train_x-00000-of-00002.npy");
    EXPECT_EQ(x.parts[0].samples, 16u);
    EXPECT_EQ(x.parts[0].bytes, 2000u);
    EXPECT_EQ(x.parts[0].checksum, "xxh64:1111111111111111");
    EXPECT_EQ(x.parts[1].checksum, "");
    EXPECT_EQ(x.bytes, 3200u);
    ASSERT_TRUE(again.shard);
    EXPECT_EQ(again.shard->index, 1u);
    EXPECT_EQ(again.shard->count, 2u);
    EXPECT_EQ(again.shard->settings, "xxh64:2222222222222222");
    EXPECT_EQ(again.shard->splits[0].first, 16u);
    EXPECT_EQ(again.shard->splits[0].total, 36u);
    EXPECT_EQ(again.shard->splits[0].chunk_sums, m.shard->splits[0].chunk_sums); // doubles exact
    EXPECT_EQ(serialize_manifest(again), text);
}

TEST(ManifestParts, InconsistentPartsAreRejected) {
    const auto rejects = [](const std::function<void(Manifest&)>& edit, const std::string& why) {
        Manifest m = parted();
        edit(m);
        try {
            parse_manifest(serialize_manifest(m), "bad.json");
            ADD_FAILURE() << "accepted: " << why;
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ExitCode::failure);
            EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
        }
    };
    rejects([](Manifest& m) { m.splits[0].fields[0].parts[1].samples = 5; }, "hold 21 samples, the split 20");
    rejects([](Manifest& m) { m.splits[0].fields[0].parts[1].bytes = 1; }, "hold 2001 bytes");
    rejects([](Manifest& m) { m.splits[0].fields[0].parts[1].file = "../x.npy"; }, "plain file name");
    rejects([](Manifest& m) { m.splits[0].fields[0].parts[1].file = "train_x-00000-of-00002.npy"; }, "same file");
    rejects([](Manifest& m) { m.shard->splits[0].first = 30; }, "ends after the whole split");
    rejects([](Manifest& m) { m.shard->splits[0].name = "test"; }, "expected 'train'");
    // Both "file" and "parts".
    std::string text = serialize_manifest(parted());
    text.insert(text.find("\"name\": \"x\""), "\"file\": \"x.npy\", ");
    EXPECT_THROW(parse_manifest(text, "both.json"), Error);
}

} // namespace
