#include <fcntl.h>
#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "dstk/data/order.hpp"
#include "dstk/enum_names.hpp"
#include "dstk/error.hpp"
#include "dstk/fd.hpp"

namespace dstk {
namespace {

enum class Colour { red, green, blue };
constexpr EnumNames<Colour, 3> colour_names{{{{Colour::red, "red"}, {Colour::green, "green"}, {Colour::blue, "blue"}}}};

TEST(EnumNames, ParsesAndNamesBothWays) {
    EXPECT_EQ(colour_names.parse("green", "--colour"), Colour::green);
    EXPECT_EQ(colour_names.name(Colour::blue), "blue");
    EXPECT_EQ(colour_names.choices(), "red, green or blue");
    EXPECT_EQ(data::parse_order("chunk"), data::Order::chunk);
    EXPECT_EQ(data::order_name(data::Order::full), "full");
}

TEST(EnumNames, UnknownTextIsAUsageErrorListingTheChoices) {
    try {
        colour_names.parse("purple", "--colour");
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::usage);
        EXPECT_STREQ(e.what(), "invalid --colour 'purple' (expected red, green or blue)");
    }
}

TEST(UniqueFd, ClosesOnScopeExitAndOnMove) {
    const auto path = std::filesystem::temp_directory_path() / ("dstk-fd-" + std::to_string(::getpid()));
    int raw = -1;
    {
        UniqueFd fd = UniqueFd::open(path, O_WRONLY | O_CREAT | O_TRUNC, "create");
        raw = fd.get();
        ASSERT_GE(raw, 0);
        UniqueFd moved = std::move(fd);
        EXPECT_FALSE(fd);
        EXPECT_EQ(moved.get(), raw);
        EXPECT_NE(::fcntl(raw, F_GETFD), -1);
    }
    EXPECT_EQ(::fcntl(raw, F_GETFD), -1); // closed
    std::filesystem::remove(path);
}

TEST(UniqueFd, OpenFailureThrowsNamingThePath) {
    try {
        UniqueFd::open("/nonexistent-dstk-dir/file", O_RDONLY, "open");
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::failure);
        EXPECT_NE(std::string(e.what()).find("/nonexistent-dstk-dir/file"), std::string::npos);
    }
    EXPECT_FALSE(UniqueFd::try_open("/nonexistent-dstk-dir/file", O_RDONLY));
}

} // namespace
} // namespace dstk
