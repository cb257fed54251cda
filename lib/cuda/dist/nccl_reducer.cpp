// The NCCL Reducer. The communicator is nonblocking (ncclConfig_t::blocking =
// 0) so that no NCCL call can hang the process: creation, every collective's
// enqueue and the final clean-up return at once or ncclInProgress, and this
// file polls ncclCommGetAsyncError against a deadline, aborting the
// communicator when it passes. What runs on the GPU is enqueued on the
// caller's stream, so a CUDA graph can capture it.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>

#include "cuda_check.hpp"
#include "dist/scale.hpp"
#include "dstk/dist/nccl.hpp"

namespace dstk::dist {
namespace {

static_assert(sizeof(ncclUniqueId) == std::tuple_size_v<NcclId>, "NcclId must hold an ncclUniqueId");

using Clock = std::chrono::steady_clock;

std::string nccl_version() {
    int v = 0;
    ncclGetVersion(&v);
    return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

std::string seconds(double s) {
    std::ostringstream o;
    o << s << " s";
    return o.str();
}

class NcclReducer final : public Reducer {
  public:
    NcclReducer(const NcclId& id, int rank, int size, int device, double timeout_s);
    ~NcclReducer() override;
    NcclReducer(const NcclReducer&) = delete;
    NcclReducer& operator=(const NcclReducer&) = delete;

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    void average_host(float* data, std::size_t count) override;
    void average_device(float* data, std::size_t count, void* stream) override;
    void broadcast_host(float* data, std::size_t count) override;
    void broadcast_device(float* data, std::size_t count, void* stream) override;

  private:
    std::string who() const { return "rank " + std::to_string(rank_) + " of " + std::to_string(size_); }
    // Waits until the communicator is no longer busy with `what`; throws (and
    // aborts the communicator) on an error or past the timeout.
    void finish(ncclResult_t r, const char* what);
    [[noreturn]] void fail(const std::string& what, const std::string& why);
    float* staging(std::size_t count);
    template <class F> void through_device(float* data, std::size_t count, F&& op);

    int rank_, size_, device_;
    double timeout_s_;
    ncclComm_t comm_ = nullptr;
    cudaStream_t host_stream_ = nullptr; // the host variants' copies and collectives
    float* staging_ = nullptr;
    std::size_t staging_count_ = 0;
};

NcclReducer::NcclReducer(const NcclId& id, int rank, int size, int device, double timeout_s)
    : rank_(rank), size_(size), device_(device), timeout_s_(timeout_s) {
    if (size < 1 || rank < 0 || rank >= size)
        throw runtime_error("NCCL rank " + std::to_string(rank) + " of " + std::to_string(size) +
                            " (a rank must lie in [0, size)) check the launcher's environment");
    if (!(timeout_s > 0.0)) throw usage_error("NCCL timeout of " + seconds(timeout_s) + " (must be positive)");
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
        cudaGetLastError();
        throw no_fit_error(who() + ": GPU " + std::to_string(device) + " for NCCL (" + std::to_string(count) +
                           " GPU(s) visible) start one process per GPU, or check CUDA_VISIBLE_DEVICES");
    }
    CUDA_CHECK(cudaSetDevice(device));
    ncclUniqueId uid;
    std::memcpy(&uid, id.data(), sizeof uid);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t r = ncclCommInitRankConfig(&comm_, size, uid, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
        const std::string why = ncclGetErrorString(r);
        if (comm_) ncclCommAbort(comm_);
        comm_ = nullptr;
        throw runtime_error(who() + ": NCCL " + nccl_version() + " could not create its communicator (" + why +
                            ") run with NCCL_DEBUG=WARN to see why");
    }
    finish(r, "communicator creation");
}

NcclReducer::~NcclReducer() {
    if (host_stream_) cudaStreamSynchronize(host_stream_);
    if (staging_) cudaFree(staging_);
    if (host_stream_) cudaStreamDestroy(host_stream_);
    if (!comm_) return;
    // Finalize flushes what is in flight; a peer that is gone makes it fail
    // or linger, and then the communicator is aborted instead.
    ncclResult_t r = ncclCommFinalize(comm_), state = r;
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s_);
    while (r == ncclInProgress || r == ncclSuccess) {
        if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess || state != ncclInProgress || Clock::now() > deadline)
            break;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if ((r == ncclSuccess || r == ncclInProgress) && state == ncclSuccess)
        ncclCommDestroy(comm_);
    else
        ncclCommAbort(comm_);
}

void NcclReducer::fail(const std::string& what, const std::string& why) {
    const std::string detail = comm_ ? ncclGetLastError(comm_) : "";
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    throw runtime_error(who() + ": NCCL " + what + " " + why + (detail.empty() ? "" : " [" + detail + "]"));
}

// A nonblocking communicator enqueues each collective from a thread of its
// own and says ncclInProgress until it has: the caller's next kernel must wait
// for that (stream order, and a graph capture's order), so this spins briefly,
// then sleeps between polls.
void NcclReducer::finish(ncclResult_t r, const char* what) {
    if (!comm_) throw runtime_error(who() + ": NCCL " + what + " on a communicator aborted after an earlier error");
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s_);
    ncclResult_t state = r;
    for (int polls = 0; state == ncclInProgress; ++polls) {
        if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclInternalError;
        if (state != ncclInProgress) break;
        if (Clock::now() > deadline)
            fail(what, "did not complete within " + seconds(timeout_s_) +
                           " (a rank did not arrive, or cannot reach the others) check that all " +
                           std::to_string(size_) +
                           " ranks started and can reach each other (NCCL_SOCKET_IFNAME, NCCL_DEBUG=WARN), or allow "
                           "more time (--dist-timeout)");
        if (polls < 1000)
            std::this_thread::yield();
        else
            std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (state != ncclSuccess)
        fail(what, std::string("failed (") + ncclGetErrorString(state) + ") run with NCCL_DEBUG=WARN to see why");
}

void NcclReducer::average_device(float* data, std::size_t count, void* stream) {
    if (count == 0) return;
    const auto s = static_cast<cudaStream_t>(stream);
    finish(ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, s), "all-reduce");
    if (size_ > 1) cuda::launch_scale(data, count, 1.0f / static_cast<float>(size_), s);
}

void NcclReducer::broadcast_device(float* data, std::size_t count, void* stream) {
    if (count == 0) return;
    finish(ncclBroadcast(data, data, count, ncclFloat32, 0, comm_, static_cast<cudaStream_t>(stream)), "broadcast");
}

float* NcclReducer::staging(std::size_t count) {
    if (count > staging_count_) {
        CUDA_CHECK(cudaStreamSynchronize(host_stream_));
        if (staging_) CUDA_CHECK(cudaFree(staging_));
        staging_ = nullptr;
        staging_count_ = 0;
        CUDA_CHECK(cudaMalloc(&staging_, count * sizeof(float)));
        staging_count_ = count;
    }
    return staging_;
}

// Host data through the staging buffer: copy in, op(device pointer, stream),
// copy out, wait, then check that the collective itself went well.
template <class F> void NcclReducer::through_device(float* data, std::size_t count, F&& op) {
    if (count == 0) return;
    CUDA_CHECK(cudaSetDevice(device_));
    if (!host_stream_) CUDA_CHECK(cudaStreamCreateWithFlags(&host_stream_, cudaStreamNonBlocking));
    float* d = staging(count);
    CUDA_CHECK(cudaMemcpyAsync(d, data, count * sizeof(float), cudaMemcpyHostToDevice, host_stream_));
    op(d, host_stream_);
    CUDA_CHECK(cudaMemcpyAsync(data, d, count * sizeof(float), cudaMemcpyDeviceToHost, host_stream_));
    CUDA_CHECK(cudaStreamSynchronize(host_stream_));
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess || state != ncclSuccess)
        fail("collective", std::string("failed (") + ncclGetErrorString(state) + ") a peer may have exited");
}

void NcclReducer::average_host(float* data, std::size_t count) {
    through_device(data, count, [&](float* d, cudaStream_t s) { average_device(d, count, s); });
}

void NcclReducer::broadcast_host(float* data, std::size_t count) {
    through_device(data, count, [&](float* d, cudaStream_t s) { broadcast_device(d, count, s); });
}

} // namespace

bool nccl_available() {
    return true;
}

NcclId nccl_unique_id() {
    ncclUniqueId uid;
    const ncclResult_t r = ncclGetUniqueId(&uid);
    if (r != ncclSuccess)
        throw runtime_error(std::string("NCCL could not make its unique id (") + ncclGetErrorString(r) +
                            ") check the network interfaces NCCL may use (NCCL_SOCKET_IFNAME, NCCL_DEBUG=WARN)");
    NcclId id;
    std::memcpy(id.data(), &uid, sizeof uid);
    return id;
}

std::unique_ptr<Reducer> make_nccl_reducer(const NcclId& id, int rank, int size, int device, double timeout_s) {
    return std::make_unique<NcclReducer>(id, rank, size, device, timeout_s);
}

} // namespace dstk::dist
