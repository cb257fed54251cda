#include <gtest/gtest.h>

#include <cstdlib>

#include "dstk/env.hpp"

using namespace dstk;

namespace {
constexpr const char* name = "DSTK_TEST_ENV_SWITCH";
}

TEST(Env, UnsetAndEmptyMeanTheDefault) {
    unsetenv(name);
    EXPECT_EQ(env_value(name), "");
    EXPECT_FALSE(env_off(name));
    EXPECT_FALSE(env_flag(name).has_value());
    setenv(name, "", 1);
    EXPECT_FALSE(env_off(name));
    EXPECT_FALSE(env_flag(name).has_value());
    unsetenv(name);
}

TEST(Env, ZeroIsOffAnythingElseOn) {
    setenv(name, "0", 1);
    EXPECT_TRUE(env_off(name));
    ASSERT_TRUE(env_flag(name).has_value());
    EXPECT_FALSE(*env_flag(name));
    for (const char* v : {"1", "yes", "00", "fwd"}) {
        setenv(name, v, 1);
        EXPECT_FALSE(env_off(name)) << v;
        ASSERT_TRUE(env_flag(name).has_value()) << v;
        EXPECT_TRUE(*env_flag(name)) << v;
        EXPECT_EQ(env_value(name), v);
    }
    unsetenv(name);
}
