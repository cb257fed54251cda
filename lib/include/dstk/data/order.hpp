#pragma once
// The order in which an epoch visits the samples of a split. Every order is a
// pure function of (seed, epoch, position) computed in O(1) memory, so any
// batch of any epoch can be produced on its own: a resumed run continues with
// exactly the batch it would have seen, and reader threads need no shared
// shuffle table however large the split.
//
//   sequential  0, 1, 2, ...
//   chunk       the split cut into chunks of C samples; the chunk order is a
//               permutation per epoch; consecutive groups of W chunks (a
//               window) are visited in a random order of their samples. I/O
//               stays sequential at chunk granularity, mixing reaches W*C.
//   full        one global permutation per epoch (random reads).
#include <cstdint>
#include <string_view>
#include <vector>

namespace dstk::data {

enum class Order : std::uint8_t { sequential, chunk, full };
Order parse_order(std::string_view text, std::string_view setting = "order"); // usage error naming `setting` otherwise
std::string_view order_name(Order o);

// A bijection of [0, n) keyed by `key`: a balanced Feistel network over the
// next even number of bits, cycle-walked back into range (on average fewer
// than 4 rounds of walking). O(1) memory, O(1) expected time per index.
class Permutation {
  public:
    Permutation(std::uint64_t n, std::uint64_t key);
    std::uint64_t size() const { return n_; }
    std::uint64_t operator()(std::uint64_t i) const;
    std::uint64_t inverse(std::uint64_t j) const;

  private:
    std::uint64_t forward_once(std::uint64_t x) const;
    std::uint64_t backward_once(std::uint64_t x) const;
    std::uint64_t round(std::uint64_t r, std::uint64_t half) const;

    std::uint64_t n_;
    unsigned half_bits_ = 1;
    std::uint64_t half_mask_ = 1;
    std::uint64_t keys_[4]{};
};

struct OrderConfig {
    Order kind = Order::chunk;
    std::uint64_t seed = 0;
    std::uint64_t chunk_samples = 4096; // chunk order: samples per chunk (the storage's chunk for chunked files)
    std::uint64_t window_chunks = 8;    // chunk order: chunks mixed together
};

// Data-parallel training: `world` ranks each train on `batch` samples per
// step, one global batch of world x batch positions of the epoch's order.
// Global step k covers positions [k*world*batch, (k+1)*world*batch) and rank
// r takes [k*world*batch + r*batch, k*world*batch + (r+1)*batch), so a global
// step holds the same samples whatever the world size (for the same global
// batch); positions that fill no global batch are dropped. A world of one is
// the plain run: batch k at position k*batch.
struct RankSlice {
    std::uint32_t rank = 0, world = 1;
    // First position of this rank's batch `k`.
    std::uint64_t first_position(std::uint64_t k, std::uint32_t batch) const { return (k * world + rank) * batch; }
    // Batches (global steps) per epoch; a partial last batch is kept with
    // drop_last false, which only a world of one may ask.
    std::uint64_t batches(std::uint64_t samples, std::uint32_t batch, bool drop_last) const;
};

// The sample visited at each position of one epoch.
class EpochOrder {
  public:
    EpochOrder(const OrderConfig& config, std::uint64_t samples, std::uint64_t epoch);
    std::uint64_t size() const { return n_; }
    std::uint64_t operator[](std::uint64_t position) const;

    // Chunk order: the chunks (in file order of their first samples) that hold
    // the window containing `position`; empty for the other orders. Readers
    // use it to ask the kernel for the window's chunks as whole sequential reads.
    std::vector<std::uint64_t> window_chunks(std::uint64_t position) const;
    // Chunk order: first position of the window after the one holding `position`
    // (size() at the end); other orders: size().
    std::uint64_t next_window_start(std::uint64_t position) const;
    const OrderConfig& config() const { return config_; }
    std::uint64_t epoch() const { return epoch_; }

  private:
    struct Window {
        std::uint64_t index, first_position, positions;
    };
    Window window_of(std::uint64_t position) const;
    std::uint64_t window_start(std::uint64_t w) const;

    OrderConfig config_;
    std::uint64_t n_, epoch_;
    Permutation global_;          // full: samples; chunk: chunks
    std::uint64_t chunks_ = 0;    // chunk order
    std::uint64_t tail_ = 0;      // samples in the last chunk when partial, else 0
    std::uint64_t tail_slot_ = 0; // its position in the chunk order
    std::uint64_t window_samples_ = 0;
};

} // namespace dstk::data
