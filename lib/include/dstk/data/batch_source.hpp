#pragma once
// Where training batches come from (DESIGN.md, "The training data path").
// A BatchSource hands the Trainer one batch at a time, in the backend's memory
// (device memory for cuda, host memory for cpu), in the order of an EpochOrder:
//
//   device   the whole split resident in backend memory; batches are slices
//            (sequential order) or gathered into a batch slot.
//   stream   I/O threads read whole chunks (storage chunks of zstd-chunked
//            files, the order's chunks of .npy files) into a bounded host
//            window cache (window_cache.hpp); reader threads gather batches
//            from it into a ring of K host slots (pinned on cuda); on cuda each
//            slot is copied on a copy stream into one of K device slots, and
//            events order copy -> compute -> slot reuse. The full order reads
//            single samples instead (random reads). Memory: K slots plus the
//            cache's planned capacity (plan_host_memory), whatever the
//            dataset size.
//   managed  (cuda) the split in cudaMallocManaged memory, read from the file
//            into it; the next batches are prefetched on a side stream.
//
// A batch (dstk/batch.hpp) holds the fields SourceConfig::fields names, in
// that order, under their dataset names, whatever their dtypes and per-sample
// shapes: every field the same samples in the same order, each copied once per
// batch. The batch from next() stays valid until release(); the caller calls
// release() after it has enqueued (cuda) or done (cpu) all work reading it.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dstk/batch.hpp"
#include "dstk/device.hpp"
#include "dstk/data/order.hpp"
#include "dstk/data/settings.hpp"
#include "dstk/data/stage.hpp"
#include "dstk/data/stream_reader.hpp"
#include "dstk/dataset.hpp"

namespace dstk::data {

enum class Placement : std::uint8_t { automatic, device, stream, managed };
// "auto", "device", "stream", "managed"; a usage error naming `setting` otherwise.
Placement parse_placement(std::string_view text, std::string_view setting = "placement");
std::string_view placement_name(Placement p);

// What managed memory is told and asked (the setting managed_policy).
//   prefetch  cudaMemPrefetchAsync of the next batches to the GPU on a side stream
//   advise    PreferredLocation=CPU + AccessedBy=GPU: the GPU reads host pages in place
//   fault     nothing: on-demand page migration
enum class ManagedPolicy : std::uint8_t { prefetch, advise, fault };
ManagedPolicy parse_managed_policy(std::string_view text, std::string_view setting = "managed_policy");
std::string_view managed_policy_name(ManagedPolicy p);

// Host memory of the stream placement, known before it is built: the host
// ceiling printed beside the GPU's. Every delivered field counts.
struct HostPlan {
    std::uint64_t ring = 0;      // K batch slots (pinned on cuda) and the readers' index buffers
    std::uint64_t cache = 0;     // window cache: whole chunks (0 for the full order, which gathers samples)
    std::uint64_t other = 0;     // the readers' zstd frames and decoded chunks, O_DIRECT bounce buffers
    std::uint64_t min_cache = 0; // the least window cache that reads ahead (two windows)
    bool drop_pages = false;     // the split does not fit beside it: chunks leave the page cache once read
    std::uint64_t total() const { return ring + cache + other; }
};

// A source's configuration, resolved: plan_source (source_plan.hpp) builds
// it, make_batch_source builds the source from it.
struct SourceConfig {
    // The split's fields every batch holds, in this order (any dtype and
    // per-sample shape, at least one). Empty: the manifest's input and label
    // roles, the label one i32 per sample (the trainer's pair).
    std::vector<std::string> fields;
    Placement placement = Placement::stream; // resolved: never automatic here
    Device device;
    OrderConfig order;
    std::uint32_t batch = 256;
    RankSlice slice;       // data parallel: this rank's part of each global batch (order.hpp)
    bool drop_last = true; // training drops a partial last batch; evaluation keeps it
    unsigned prefetch = 4; // K: ring slots (stream), batches prefetched ahead (managed)
    unsigned readers = 2;  // reader threads (stream)
    ManagedPolicy managed_policy = ManagedPolicy::prefetch;
    bool oversubscribe = false;     // managed: allow a split larger than free GPU memory
    void* compute_stream = nullptr; // cuda: where batches are read (Trainer::input_stream), ordered before it
    // device, managed: the consumer reads samples through BatchField::rows, so
    // a shuffled batch is handed over as the split plus its rows (uploaded on
    // compute_stream) and no gather pass runs. Only for a consumer that reads
    // every field only on compute_stream, before the next batch is asked for.
    bool rows = false;
    // stream: read the bulk fields with O_DIRECT (.npy chunks, zstd frames; a
    // field under a quarter of the lead field's bytes per sample, a label,
    // stays in the page cache: lib/src/data/source_fields.hpp says why); falls
    // back to the page cache with a notice where the filesystem refuses
    // O_DIRECT at open, with a warning (once per file) where it refuses a read
    // later on.
    bool direct = false;
    // stream: host memory for ring + window cache + reader buffers (the
    // setting host_mem); 0: chosen from the memory available.
    std::uint64_t host_mem = 0;
    // stream: the host memory plan (plan_host_memory): the window cache's
    // capacity and whether chunks leave the page cache once read.
    HostPlan host;
    // cpu: an XXH64 of every batch's fields, in order, per epoch
    // (StageTimes::batch_hash): two placements deliver the same batches iff
    // their hashes agree (dstrain --log-json).
    bool hash_batches = false;
    std::function<void(const std::string&)> notice; // messages for the user (O_DIRECT refused at open)
    std::function<void(const std::string&)> warn;   // warnings (O_DIRECT refused mid-run); from reader threads
    SettingNames names;                             // how messages spell the settings
};

// Seconds spent per stage since the last take_times(), summed over batches.
struct StageTimes {
    double read_wait = 0; // the training loop waiting for a batch (the data path's cost to training)
    double read = 0;      // reader threads in pread and copies, decode excluded (sum over threads)
    double decode = 0;    // reader threads decompressing zstd frames, their reads excluded (sum over threads)
    double h2d = 0;       // host -> device copies (cuda; measured with events)
    double compute = 0;   // train steps (filled in by the training loop)
    std::uint64_t batches = 0, samples = 0, bytes = 0; // bytes: of every field delivered
    IoCounters io; // stream: reads of the lead field (the most bytes per sample; chunk reads through the window cache)
    std::vector<IoCounters> fields_io; // stream: each delivered field's reads, in batch order
    std::uint64_t cache_peak = 0;      // stream: most bytes the window cache held at once (since the source was built)
    std::optional<std::uint64_t> batch_hash; // with SourceConfig::hash_batches: the batches since the last take
};

// The stage that limits an epoch, from its times: "compute" while the loop
// waits for batches less than a tenth of its time (read_wait + compute), else
// the data path's largest stage: "read (disk)", "decode (zstd)" or
// "h2d (host to device)". read and decode are sums over the same reader
// threads, so their ratio is the per-thread one.
std::string_view limiting_stage(const StageTimes& t);

// Chunk reads the stream's window cache keeps in flight (its I/O threads) for
// this order and reader count; storage_chunk: samples per chunk of
// zstd-chunked input, 0 for .npy. dsplan times the disk at this thread count.
unsigned io_threads_for(const OrderConfig& order, unsigned readers, std::uint64_t storage_chunk);

// The split's fields a source of `config` delivers, in batch order:
// config.fields, or the manifest's input and label roles. Usage errors (naming
// the setting `fields`): a field the split lacks (listing the split's fields),
// a field named twice, no input or label role in the manifest where fields is
// empty.
std::vector<const FieldInfo*> source_fields(const Manifest& manifest, const SplitInfo& split,
                                            const SourceConfig& config);

// `available`: host memory free for the run (available_host_memory()). With
// config.host_mem == 0 the cache takes up to a quarter of it (at most four
// windows, at least two); a host_mem below ring + two windows is a
// no_fit_error (exit 3) naming what to lower.
HostPlan plan_host_memory(const SplitInfo& split, const std::vector<const FieldInfo*>& fields,
                          const SourceConfig& config, std::uint64_t available);
// Memory this process may still take: /proc/meminfo's MemAvailable, lowered
// to the cgroup v2 limit less the cgroup's anonymous memory where one is set.
std::uint64_t available_host_memory();

class BatchSource {
  public:
    virtual ~BatchSource() = default;
    virtual Placement placement() const = 0;
    virtual std::uint64_t samples() const = 0;
    virtual std::uint64_t batches_per_epoch() const = 0;
    // Positions the source at batch `first_batch` of `epoch` (a resume point).
    // The stage times start afresh: what an abandoned iteration counted is dropped.
    virtual void start_epoch(std::uint64_t epoch, std::uint64_t first_batch) = 0;
    // The epochs started from now on end at batch `end` (a mix takes the
    // first batches of a member's epoch), and each is followed by epoch + 1
    // from its first batch: the stream placement reads that epoch's first
    // window as this one's last reads are issued, within the same host
    // memory, so that the restart between epochs finds it read. The resident
    // placements have nothing to read ahead and ignore it.
    virtual void chain_epochs(std::uint64_t end) { (void)end; }
    // The next batch of the epoch, owned by the source; nullptr when the
    // epoch is done. Rethrows reader errors (naming the file and chunk).
    // start_epoch and next wait for reader threads where they must; those
    // waits are interruptible (interrupt.hpp): an interrupted next took no
    // batch and may be called again, an interrupted start_epoch is called
    // again before next.
    virtual const Batch* next() = 0;
    virtual void release() = 0;
    // Stops the source's threads (a stream's readers; the reads in flight
    // land first) until the next start_epoch. An interruptible wait.
    virtual void stop() {}
    virtual StageTimes take_times() = 0;
    virtual std::uint64_t device_bytes() const = 0; // backend memory held: slots or the resident split
    virtual std::uint64_t host_bytes() const = 0;   // host memory held: ring, reader buffers, decoded chunks
    // Of host_bytes(), what is resident now (a window cache fills as it reads;
    // a chunk counts once its read has landed).
    virtual std::uint64_t host_resident() const { return host_bytes(); }
};

// Bytes a source of this configuration will hold in backend memory, known
// before it is built (the GPU memory ceiling): its device_bytes().
std::uint64_t planned_device_bytes(const SplitInfo& split, const std::vector<const FieldInfo*>& fields,
                                   const SourceConfig& config);

} // namespace dstk::data
