// dstk/dist/nccl.hpp as every build links it: without NCCL each entry point
// says that the build lacks it (exit code 3, what to do); with NCCL, bad
// arguments are refused before NCCL is asked anything, GPU or not.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <utility>

#include "dstk/dist/nccl.hpp"
#include "dstk/error.hpp"

using namespace dstk;

namespace {

// The message and exit code of what f throws, or "no error".
template <class F> std::pair<ExitCode, std::string> error_of(F&& f) {
    try {
        f();
    } catch (const Error& e) {
        return {e.code(), e.what()};
    }
    return {ExitCode::ok, "no error"};
}

} // namespace

TEST(NcclBuild, AvailabilityFollowsTheBuild) {
#if defined(DSTK_HAVE_NCCL)
    EXPECT_TRUE(dist::nccl_available());
#else
    EXPECT_FALSE(dist::nccl_available());
#endif
}

TEST(NcclBuild, WithoutNcclEveryEntryPointSaysSo) {
    if (dist::nccl_available()) GTEST_SKIP() << "built with NCCL (tests/gpu/dist_nccl_test.cpp covers it)";
    for (const auto& [code, what] :
         {error_of([] { dist::nccl_unique_id(); }), error_of([] { dist::make_nccl_reducer({}, 0, 1, 0, 10.0); })}) {
        EXPECT_EQ(code, ExitCode::no_fit) << what;
        EXPECT_NE(what.find("built without NCCL"), std::string::npos) << what;
        EXPECT_NE(what.find("--device cpu"), std::string::npos) << what;
    }
}

TEST(NcclBuild, BadArgumentsAreRefusedBeforeNcclRuns) {
    if (!dist::nccl_available()) GTEST_SKIP() << "built without NCCL";
    const dist::NcclId id{}; // never reaches NCCL
    auto [code, what] = error_of([&] { dist::make_nccl_reducer(id, 2, 2, 0, 10.0); });
    EXPECT_EQ(code, ExitCode::failure) << what;
    EXPECT_NE(what.find("rank 2 of 2"), std::string::npos) << what;
    std::tie(code, what) = error_of([&] { dist::make_nccl_reducer(id, 0, 1, 0, 0.0); });
    EXPECT_EQ(code, ExitCode::usage) << what;
    std::tie(code, what) = error_of([&] { dist::make_nccl_reducer(id, 0, 1, 4096, 10.0); });
    EXPECT_EQ(code, ExitCode::no_fit) << what;
    EXPECT_NE(what.find("GPU 4096"), std::string::npos) << what;
}
