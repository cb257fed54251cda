#include "dstk/run/options.hpp"

#include <CLI/CLI.hpp>

#include "dstk/cli.hpp"

namespace dstk::run {

void add_data_options(CLI::App& app, DataOptions& d) {
    app.add_option("--data", d.data,
                   "Placement: auto, device (split in GPU memory), stream (reader threads + ring) or "
                   "managed (cudaMallocManaged)")
        ->capture_default_str();
    app.add_option("--order", d.order, "Sample order: sequential, chunk (shuffled chunks, mixed in windows) or full")
        ->capture_default_str();
    app.add_option("--window", d.window, "Chunk order: chunks whose samples are mixed together")->capture_default_str();
    app.add_option("--chunk-samples", d.chunk_samples,
                   "Chunk order on .npy storage: samples per chunk (0: about 4 MiB; chunked files use theirs)")
        ->capture_default_str();
    app.add_option("--prefetch", d.prefetch, "Stream: batch slots in the ring (K); managed: batches prefetched ahead")
        ->capture_default_str()
        ->each([&d](const std::string&) { d.prefetch_given = true; });
    app.add_option("--readers", d.readers, "Stream: reader threads")
        ->capture_default_str()
        ->each([&d](const std::string&) { d.readers_given = true; });
    app.add_option("--bench", d.bench,
                   "dsbench results (dsbench all DATA --json FILE): choose --prefetch and --readers from its "
                   "random-read, sequential-read and host-to-device figures (explicit options win)");
    CLI::Option* direct =
        app.add_flag("--direct", d.direct,
                     "Stream: read the inputs (.npy chunks, zstd frames) with O_DIRECT, bypassing the page cache "
                     "(the default where the data does not fit in available memory beside the stream's own; where "
                     "the filesystem refuses it, through the page cache: with a notice at open, with a warning "
                     "mid-run)")
            ->each([&d](const std::string&) { d.direct_given = true; });
    app.add_flag_function(
           "--no-direct",
           [&d](std::int64_t) {
               d.direct = false;
               d.direct_given = true;
           },
           "Stream: read through the page cache even where the data does not fit in available memory")
        ->excludes(direct);
    app.add_option("--host-mem", d.host_mem,
                   "Stream: host memory for the ring and the window cache of whole chunks, e.g. 2G (default: a "
                   "quarter of available memory, at most four windows); printed as the host ceiling. A mix: the "
                   "budget of all its members, the host-kept ones' bytes included (default: half of available memory)");
    app.add_option("--managed-policy", d.managed_policy, "Managed: prefetch, advise or fault")->capture_default_str();
    app.add_flag("--oversubscribe", d.oversubscribe, "Managed: allow a split larger than free GPU memory");
    app.add_option("--eval-every", d.eval_every, "Evaluate the test split every N steps (0: after each epoch)")
        ->capture_default_str();
    app.add_option("--checkpoint", d.checkpoint, "Checkpoint directory (written atomically after each epoch)");
    app.add_option("--checkpoint-every", d.checkpoint_every, "Also checkpoint every N steps (0: epochs only)")
        ->capture_default_str();
    app.add_flag("--resume", d.resume, "Continue from the checkpoint in --checkpoint");
    app.add_option("--max-steps", d.max_steps, "Stop after N steps in total, with a checkpoint (0: no limit)")
        ->capture_default_str();
    app.add_option("--weights", d.weights,
                   "A mix of datasets: each one's weight, in their order, e.g. 2,1,1 (default: their sizes, every "
                   "sample once per epoch)")
        ->delimiter(',')
        ->check(mix_weight());
    app.add_option("--placement", d.placements,
                   "A mix of datasets: where each one lives, auto, device (GPU memory), host (kept in the page "
                   "cache) or stream (read from disk every epoch); one for all, or one per dataset, e.g. "
                   "device,stream,auto (default auto: by rows read per byte, within --host-mem)")
        ->delimiter(',');
}

} // namespace dstk::run
