// Interruptible waits (dstk/data/interrupt.hpp): the helpers themselves (a
// wait, a lock, a read in pieces), and the host ring's waits with a reader stuck in a read that does not return, after
// which the ring must still deliver the right batches.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "../../lib/src/data/host_ring.hpp"
#include "../../lib/src/data/source_parts.hpp"
#include "dstk/data/interrupt.hpp"
#include "dstk/data/stream_reader.hpp"

using namespace dstk;
using namespace dstk::data;
using namespace std::chrono_literals;

namespace {

struct Waiting {
    std::mutex mutex;
    std::condition_variable cv;
    bool ready = false;

    void set_after(std::chrono::milliseconds delay) {
        std::this_thread::sleep_for(delay);
        {
            std::lock_guard lock(mutex);
            ready = true;
        }
        cv.notify_all();
    }
    void wait() {
        std::unique_lock lock(mutex);
        wait_interruptible(cv, lock, [&] { return ready; });
        EXPECT_TRUE(lock.owns_lock());
    }
};

TEST(Interrupt, WithoutACheckTheWaitEndsWhenReady) {
    Waiting w;
    std::thread t([&] { w.set_after(120ms); });
    EXPECT_FALSE(InterruptCheck::installed());
    w.wait();
    t.join();
}

TEST(Interrupt, TheCheckStopsTheWaitWithTheLockHeldAndRunsWithoutIt) {
    Waiting w;
    int calls = 0;
    const InterruptCheck check([&] {
        EXPECT_TRUE(w.mutex.try_lock()) << "the check ran with the wait's lock held";
        w.mutex.unlock();
        return ++calls == 3;
    });
    std::unique_lock lock(w.mutex);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_THROW(wait_interruptible(w.cv, lock, [&] { return w.ready; }), Interrupted);
    EXPECT_TRUE(lock.owns_lock());
    EXPECT_EQ(calls, 3);
    EXPECT_GE(std::chrono::steady_clock::now() - t0, 2 * interrupt_poll);
}

TEST(Interrupt, AReadyWaitDoesNotRunTheCheck) {
    Waiting w;
    w.ready = true;
    int calls = 0;
    const InterruptCheck check([&] { return ++calls > 0; });
    w.wait();
    EXPECT_EQ(calls, 0);
}

TEST(Interrupt, AnEmptyCheckMasksTheOuterOne) {
    const InterruptCheck outer([] { return true; });
    {
        const InterruptCheck none{nullptr};
        EXPECT_FALSE(InterruptCheck::installed());
        Waiting w;
        std::thread t([&] { w.set_after(120ms); });
        w.wait();
        t.join();
    }
    EXPECT_TRUE(InterruptCheck::installed());
    EXPECT_TRUE(InterruptCheck::requested());
}

TEST(Interrupt, InterruptedCarriesTheInterruptedExitCode) {
    EXPECT_EQ(Interrupted().code(), ExitCode::interrupted);
}

TEST(Interrupt, ALockHeldElsewhereIsGivenUpWithNothingHeld) {
    std::timed_mutex m;
    std::unique_lock held(m);
    int calls = 0;
    {
        const InterruptCheck check([&] { return ++calls == 2; });
        EXPECT_THROW((void)lock_interruptible(m), Interrupted);
        EXPECT_EQ(calls, 2);
    }
    held.unlock();
    std::thread other([&] {
        EXPECT_TRUE(m.try_lock()) << "the given-up lock was left held";
        m.unlock();
    });
    other.join();
    const InterruptCheck never([] { return false; });
    EXPECT_TRUE(lock_interruptible(m).owns_lock());
}

TEST(Interrupt, ASplitReadIntoMemoryStopsAtThePieceAfterTheCheck) {
    // Pieces of about 64 MiB: a field of 3 pieces is read in three. The check
    // asks to stop after the first: the second is never read.
    constexpr std::uint64_t sample_bytes = 1 << 20, samples = 3 * (load_piece_bytes / sample_bytes);
    std::vector<std::pair<std::uint64_t, std::uint64_t>> pieces;
    int calls = 0;
    const InterruptCheck check([&] { return ++calls == 2; });
    EXPECT_THROW(for_each_piece(samples, sample_bytes,
                                [&](std::uint64_t first, std::uint64_t n) { pieces.emplace_back(first, n); }),
                 Interrupted);
    ASSERT_EQ(pieces.size(), 1u);
    EXPECT_EQ(pieces[0], std::make_pair(std::uint64_t{0}, samples / 3));
}

TEST(Interrupt, TheLastPieceIsFollowedByACheck) {
    std::vector<std::uint64_t> counts;
    int calls = 0;
    const InterruptCheck check([&] { return ++calls == 3; }); // before 1, before 2, after the last
    EXPECT_THROW(for_each_piece(100, 1 << 20, [&](std::uint64_t, std::uint64_t n) { counts.push_back(n); }),
                 Interrupted);
    EXPECT_EQ(counts, (std::vector<std::uint64_t>{64, 36}));
}

// Labels i in memory; a gather of a sample at or past `from` blocks while the
// gate is closed, as a read of a hung network filesystem does.
FieldInfo label_info() {
    FieldInfo f;
    f.name = "y";
    f.dtype = DType::i32;
    f.shape = Shape{{}};
    return f;
}

class StallingField final : public StreamReader {
  public:
    StallingField(std::uint64_t samples, std::uint64_t from)
        : StreamReader("stalling", label_info(), samples), from_(from) {}
    void gather(std::span<const std::uint64_t> indices, std::uint8_t* dst) override {
        for (std::size_t i = 0; i < indices.size(); ++i) {
            if (indices[i] >= from_) {
                std::unique_lock lock(mutex_);
                stuck_ = true;
                opened_.wait(lock, [&] { return open_; });
            }
            const auto label = static_cast<std::int32_t>(indices[i]);
            std::memcpy(dst + i * 4, &label, 4);
        }
    }
    std::uint64_t read_range(std::uint64_t, std::uint64_t, std::uint8_t*) override {
        throw std::logic_error("no window cache here");
    }
    void open() {
        {
            std::lock_guard lock(mutex_);
            open_ = true;
        }
        opened_.notify_all();
    }
    bool stuck() {
        std::lock_guard lock(mutex_);
        return stuck_;
    }

  private:
    std::uint64_t from_;
    std::mutex mutex_;
    std::condition_variable opened_;
    bool open_ = false, stuck_ = false;
};

constexpr std::uint32_t batch = 8;
constexpr std::uint64_t samples = 6 * batch;

// A ring of sequential batches (no window cache: readers gather from the
// field) whose batches from 2 on stall until the field opens.
HostRing stalling_ring(StallingField& field) {
    OrderConfig order;
    order.kind = Order::sequential;
    return HostRing({&field}, batch, true, RankSlice{}, order, 3, 2, plain_host_memory());
}

// Takes batch `b` and checks its labels.
void expect_batch(HostRing& ring, std::uint64_t b) {
    const RingSlot* s = ring.acquire();
    ASSERT_NE(s, nullptr) << "batch " << b;
    ASSERT_EQ(s->size, batch);
    for (std::uint32_t i = 0; i < batch; ++i) {
        std::int32_t label;
        std::memcpy(&label, s->fields[0] + i * 4, 4);
        EXPECT_EQ(label, static_cast<std::int32_t>(b * batch + i)) << "batch " << b << " row " << i;
    }
    ring.release();
}

void wait_until_stuck(StallingField& field) {
    while (!field.stuck()) std::this_thread::sleep_for(5ms);
}

// An epoch whose first two batches arrive and whose reader then sticks in the third's read.
void start_until_stuck(HostRing& ring, StallingField& field) {
    ring.start(0, 0);
    expect_batch(ring, 0);
    expect_batch(ring, 1);
    wait_until_stuck(field);
}

TEST(Interrupt, AnInterruptedAcquireTakesNoBatch) {
    StallingField field(samples, 2 * batch);
    HostRing ring = stalling_ring(field);
    start_until_stuck(ring, field);
    {
        const InterruptCheck stop_now([] { return true; });
        EXPECT_THROW(ring.acquire(), Interrupted);
        EXPECT_THROW(ring.acquire(), Interrupted);
    }
    field.open();
    for (std::uint64_t b = 2; b < 6; ++b) expect_batch(ring, b);
    EXPECT_EQ(ring.acquire(), nullptr);
}

TEST(Interrupt, AnInterruptedStopLeavesTheRingToStartAgain) {
    StallingField field(samples, 2 * batch);
    HostRing ring = stalling_ring(field);
    start_until_stuck(ring, field);
    {
        const InterruptCheck stop_now([] { return true; });
        EXPECT_THROW(ring.stop(), Interrupted);
        EXPECT_THROW(ring.start(0, 2), Interrupted); // start stops first: the reader is still stuck
    }
    EXPECT_THROW(ring.acquire(), std::logic_error); // no epoch: never a wait for readers that have gone
    field.open();
    ring.start(0, 2);
    for (std::uint64_t b = 2; b < 6; ++b) expect_batch(ring, b);
    EXPECT_EQ(ring.acquire(), nullptr);
}

TEST(Interrupt, TheDestructorWaitsForAStuckReaderWhateverTheCheck) {
    StallingField field(samples, 0);
    std::thread opener;
    {
        const InterruptCheck stop_now([] { return true; });
        HostRing ring = stalling_ring(field);
        ring.start(0, 0);
        wait_until_stuck(field);
        opener = std::thread([&] {
            std::this_thread::sleep_for(150ms);
            field.open();
        });
        // ~HostRing, under the check: no Interrupted out of a destructor; it
        // joins the reader once the read returns.
    }
    EXPECT_TRUE(field.stuck());
    opener.join();
}

} // namespace
