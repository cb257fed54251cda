// Data-parallel slicing of the order (data/order.hpp RankSlice, and the
// sources that use it) and the launcher environment (dist/world.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "dstk/data/batch_source.hpp"
#include "support/source_batch.hpp"
#include "dstk/dist/world.hpp"
#include "dstk/error.hpp"
#include "support/test_dataset.hpp"

namespace fs = std::filesystem;
using namespace dstk;
using namespace dstk::data;

namespace {

// The positions each global step covers, rank by rank, for `world` ranks of `batch`.
std::vector<std::vector<std::uint64_t>> global_steps(std::uint64_t samples, std::uint32_t batch, std::uint32_t world) {
    std::vector<std::vector<std::uint64_t>> steps;
    for (std::uint32_t r = 0; r < world; ++r) {
        const RankSlice slice{r, world};
        const std::uint64_t n = slice.batches(samples, batch, true);
        steps.resize(n);
        for (std::uint64_t k = 0; k < n; ++k)
            for (std::uint32_t i = 0; i < batch; ++i) steps[k].push_back(slice.first_position(k, batch) + i);
    }
    return steps;
}

} // namespace

TEST(RankSlice, RanksAreDisjointCoverTheKeptPositionsAndGlobalStepsDoNotDependOnTheWorld) {
    const std::uint64_t samples = 1000;
    const std::uint32_t global = 48;
    const auto one = global_steps(samples, global, 1);
    ASSERT_EQ(one.size(), samples / global);
    for (const std::uint32_t world : {2u, 3u, 4u, 6u, 8u}) {
        const auto steps = global_steps(samples, global / world, world);
        ASSERT_EQ(steps.size(), one.size()) << world;
        std::vector<std::uint64_t> all;
        for (std::size_t k = 0; k < steps.size(); ++k) {
            // Rank order inside a global step: the same positions as one process.
            EXPECT_EQ(steps[k], one[k]) << "world " << world << " step " << k;
            all.insert(all.end(), steps[k].begin(), steps[k].end());
        }
        std::sort(all.begin(), all.end());
        EXPECT_TRUE(std::adjacent_find(all.begin(), all.end()) == all.end()) << "a position taken twice";
        ASSERT_EQ(all.size(), samples / global * global); // the tail that fills no global batch is dropped
        for (std::size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], i);
    }
}

TEST(RankSlice, AWorldOfOneIsThePlainOrderAndKeepsAPartialBatchWhenAsked) {
    const RankSlice one;
    EXPECT_EQ(one.batches(100, 32, true), 3u);
    EXPECT_EQ(one.batches(100, 32, false), 4u);
    EXPECT_EQ(one.first_position(2, 32), 64u);
    EXPECT_THROW((RankSlice{0, 2}.batches(100, 32, false)), std::logic_error);
}

TEST(RankSlice, SourcesDeliverTheRanksSlicesOfTheSameGlobalBatches) {
    const std::uint64_t n = 700, sb = 16;
    const fs::path dir =
        test_support::write_u8_dataset(test_support::temp_path("dstk_dist", "slices"), Shape{{sb}}, {{"train", n}},
                                       static_cast<std::uint32_t>(n), [](std::uint64_t i, std::span<std::uint8_t> b) {
                                           std::fill(b.begin(), b.end(), static_cast<std::uint8_t>(i));
                                           return static_cast<std::int32_t>(i);
                                       });
    const Dataset ds = Dataset::open(dir);
    for (const Placement p : {Placement::device, Placement::stream}) {
        for (const Order o : {Order::sequential, Order::chunk, Order::full}) {
            std::map<std::uint32_t, std::vector<std::vector<std::int32_t>>> by_world; // world -> global steps
            for (const std::uint32_t world : {1u, 2u, 3u}) {
                auto& steps = by_world[world];
                for (std::uint32_t r = 0; r < world; ++r) {
                    SourceConfig c;
                    c.placement = p;
                    c.device = {dstk::Backend::cpu, 0};
                    c.order = {o, 11, 50, 3};
                    c.batch = 24 / world;
                    c.slice = {r, world};
                    c.prefetch = 2;
                    c.readers = 2;
                    auto src = make_batch_source(ds, "train", c);
                    ASSERT_EQ(src->batches_per_epoch(), n / 24);
                    steps.resize(src->batches_per_epoch());
                    src->start_epoch(1, 0);
                    test_support::XY b;
                    for (std::uint64_t k = 0; test_support::next_xy(*src, b); ++k) {
                        steps[k].insert(steps[k].end(), b.y, b.y + b.size);
                        src->release();
                    }
                }
            }
            EXPECT_EQ(by_world[2], by_world[1]) << placement_name(p) << " " << order_name(o);
            EXPECT_EQ(by_world[3], by_world[1]) << placement_name(p) << " " << order_name(o);
        }
    }
    fs::remove_all(dir);
}

TEST(Launch, ReadsEachLaunchersVariables) {
    auto env_of = [](std::map<std::string, std::string> vars) {
        return [vars = std::move(vars)](const char* name) -> const char* {
            const auto it = vars.find(name);
            return it == vars.end() ? nullptr : it->second.c_str();
        };
    };
    EXPECT_EQ(dist::detect_launch(env_of({})).size, 1);
    EXPECT_EQ(dist::detect_launch(env_of({})).launcher, "");
    auto l = dist::detect_launch(env_of({{"OMPI_COMM_WORLD_RANK", "2"},
                                         {"OMPI_COMM_WORLD_SIZE", "4"},
                                         {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                         {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                         {"PMIX_NAMESPACE", "77"},
                                         {"SLURM_PROCID", "0"},
                                         {"SLURM_NTASKS", "1"}}));
    EXPECT_EQ(l.launcher, "Open MPI");
    EXPECT_EQ(l.rank, 2);
    EXPECT_EQ(l.size, 4);
    EXPECT_EQ(l.local_rank, 1);
    EXPECT_EQ(l.local_size, 2);
    EXPECT_EQ(l.job, "77");
    EXPECT_TRUE(l.by_mpi_launcher);
    l = dist::detect_launch(env_of({{"PMI_RANK", "1"}, {"PMI_SIZE", "3"}, {"MPI_LOCALRANKID", "1"}}));
    EXPECT_EQ(l.launcher, "MPICH/PMI");
    EXPECT_TRUE(l.by_mpi_launcher);
    EXPECT_EQ(l.rank, 1);
    EXPECT_EQ(l.size, 3);
    l = dist::detect_launch(env_of({{"SLURM_PROCID", "5"},
                                    {"SLURM_NTASKS", "8"},
                                    {"SLURM_LOCALID", "1"},
                                    {"SLURM_STEP_NUM_NODES", "1"},
                                    {"SLURM_JOB_ID", "42"},
                                    {"SLURM_STEP_ID", "3"}}));
    EXPECT_EQ(l.launcher, "Slurm");
    EXPECT_EQ(l.rank, 5);
    EXPECT_EQ(l.local_rank, 1);
    EXPECT_EQ(l.local_size, 8);
    EXPECT_EQ(l.job, "42.3");
    // Slurm sets its variables in a batch script's plain commands too: a world of one there is a plain run.
    EXPECT_FALSE(l.by_mpi_launcher);
    EXPECT_FALSE(dist::detect_launch(env_of({})).by_mpi_launcher);
    for (const auto& bad :
         std::vector<std::map<std::string, std::string>>{{{"SLURM_PROCID", "x"}, {"SLURM_NTASKS", "2"}},
                                                         {{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "2"}},
                                                         {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "0"}}}) {
        try {
            (void)dist::detect_launch(env_of(bad));
            ADD_FAILURE() << "accepted " << bad.begin()->second;
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ExitCode::usage);
            EXPECT_NE(std::string(e.what()).find("SLURM_"), std::string::npos) << e.what();
        }
    }
}

TEST(World, AWorldOfOneInitialisesNothingAndItsCollectivesAreTheIdentity) {
    auto w = dist::World::join(dist::Launch{}, 1.0);
    EXPECT_TRUE(w->root());
    EXPECT_FALSE(w->distributed());
    dist::Launch slurm_one;
    slurm_one.launcher = "Slurm";
    EXPECT_FALSE(dist::World::join(slurm_one, 1.0)->distributed());
    std::vector<double> v{1.5, 2.5};
    w->sum(v);
    EXPECT_EQ(v, (std::vector<double>{1.5, 2.5}));
    EXPECT_EQ(w->gather(7), std::vector<std::uint64_t>{7});
    EXPECT_TRUE(w->any(true));
    EXPECT_FALSE(w->any(false));
}
