// dstk._Loader: the C++ side of dstk.Loader (dstk/loader.py holds the Python
// iteration protocol, the state dict and the documentation). The engine is
// the library's data::Loader; this file maps arguments and hands out arrays.
#include "bindings.hpp"

#include <unistd.h>

#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

#include <nlohmann/json.hpp>

#include "dstk/data/interrupt.hpp"
#include "dstk/data/loader.hpp"
#include "dstk/enum_names.hpp"
#include "dstk/error.hpp"
#include "dstk/gpu_runtime.hpp"
#include "dstk/json.hpp"

namespace dstk::py {

namespace {

struct LoaderArgs {
    std::vector<std::string> paths;      // one dataset, or a mix's members
    std::vector<double> weights;         // a mix: one per member
    std::vector<std::string> placements; // a mix: one for all or per member (auto, device, host, stream)
    std::string split, placement, device, order, managed_policy, bench;
    std::vector<std::string> fields;
    std::uint32_t batch = 256;
    std::uint64_t seed = 0, chunk = 0, window = 8, host_mem = 0;
    bool drop_last = true, convert = true, normalize = true, oversubscribe = false, labels64 = false;
    int direct = -1;                              // -1: the plan decides; 0 or 1
    unsigned prefetch = 0, readers = 0, keep = 2; // prefetch, readers 0: the plan decides
    std::map<std::string, std::string> kinds;     // per field: "stored", "float32", "int32", "int64", "normalised"
    std::vector<float> mean, std;
};

// The arguments' names in messages: the library's settings are the keyword
// arguments themselves, but for a boolean turned off.
std::string argument_of(std::string_view setting) {
    if (setting == "direct off") return "direct=False";
    return std::string(setting);
}

data::FieldKind kind_of(const std::string& field, const std::string& name) {
    using data::FieldKind;
    static constexpr EnumNames<FieldKind, 5> kinds{{{{FieldKind::stored, "stored"},
                                                     {FieldKind::normalised, "normalised"},
                                                     {FieldKind::values, "float32"},
                                                     {FieldKind::classes32, "int32"},
                                                     {FieldKind::classes64, "int64"}}}};
    return kinds.parse(name, "convert['" + field + "']");
}

data::LoaderRequest request_of(const LoaderArgs& a) {
    data::LoaderRequest r;
    data::SourceRequest& s = r.source;
    s.split = a.split;
    s.fields = a.fields;
    r.device_auto = a.device.empty();
    if (!a.device.empty()) s.device = parse_device(a.device);
    if (a.paths.size() > 1) {
        // A mix: each member placed by plan_mix ("host": kept in the page cache).
        for (const std::string& p : a.placements) r.mix_placements.push_back(data::parse_mix_placement(p));
        r.weights = a.weights;
    } else if (!a.placements.empty() || !a.weights.empty()) {
        throw usage_error(std::string(a.weights.empty() ? "placement" : "weights") +
                          " as a list applies to a mix of datasets (one path given); give a list of paths");
    }
    // "host": the cpu backend's stream source (batches in host memory) whatever device says.
    if (a.paths.size() > 1) {
        s.placement = data::Placement::automatic;
    } else if (a.placement == "host") {
        s.device = Device{};
        r.device_auto = false;
        s.placement = data::Placement::stream;
    } else {
        s.placement = data::parse_placement(a.placement);
    }
    s.order = data::parse_order(a.order);
    s.seed = a.seed;
    s.chunk_samples = a.chunk;
    s.window = a.window;
    s.batch = a.batch;
    s.drop_last = a.drop_last;
    if (a.prefetch) s.prefetch = a.prefetch;
    if (a.readers) s.readers = a.readers;
    if (a.direct >= 0) s.direct = a.direct == 1;
    s.host_mem = a.host_mem;
    s.bench = a.bench;
    s.managed_policy = data::parse_managed_policy(a.managed_policy);
    s.oversubscribe = a.oversubscribe;
    s.names = argument_of;
    r.convert = a.convert;
    for (const auto& [field, kind] : a.kinds) r.kinds[field] = kind_of(field, kind);
    r.normalize = a.normalize;
    r.mean = a.mean;
    r.std = a.std;
    r.keep = a.keep;
    r.labels64 = a.labels64;
    return r;
}

std::vector<std::size_t> batch_shape(const data::FieldOutput& f, std::uint32_t n) {
    std::vector<std::size_t> shape{n};
    for (const std::uint64_t d : f.shape.dims) shape.push_back(static_cast<std::size_t>(d));
    return shape;
}

// Polled by the loader's waits (dstk/data/interrupt.hpp): runs Python's
// signal handlers with the GIL taken back for the moment. What a handler
// raised (KeyboardInterrupt for Ctrl-C) stays set for without_gil to raise.
bool python_signal_raised() {
    nb::gil_scoped_acquire held;
    return PyErr_CheckSignals() != 0;
}

// Runs f, a call that may wait for the loader's threads, without the GIL; a
// signal handler that raises meanwhile ends the wait within
// data::interrupt_poll and its exception is raised here, even where a read
// never returns. A signal that comes after the wait is Python's to handle, at
// its next instruction.
template <typename F> auto without_gil(F&& f) {
    const data::InterruptCheck signals(python_signal_raised);
    try {
        nb::gil_scoped_release unlocked;
        return f();
    } catch (const data::Interrupted&) {
        if (PyErr_Occurred()) throw nb::python_error();
        throw;
    }
}

// Whether the interpreter is exiting (its objects being torn down).
bool interpreter_exiting() {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing() != 0;
#else
    return _Py_IsFinalizing() != 0;
#endif
}

// The loader's end at interpreter exit: its threads are stopped and joined
// where they answer within a second. A thread stuck in a read that does not
// return (a hung network filesystem) cannot be joined: the loader is then
// left to the process's exit, which ends its threads (the kernel may still
// hold the exit until a read in an uninterruptible wait returns).
void close_at_exit(std::unique_ptr<data::Loader>& l) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    try {
        const data::InterruptCheck timed([deadline] { return std::chrono::steady_clock::now() > deadline; });
        l->stop();
    } catch (const data::Interrupted&) {
        (void)l.release(); // its threads still use it
        return;
    } catch (const std::exception&) {
        // The destructor stops what is left.
    }
    l.reset();
}

// The messages the library had for the user (O_DIRECT refused, no GPU),
// collected from any thread for Python to show. Shared with the loader's
// callbacks: a loader given up (a construction interrupted, one left to the
// process's exit) may outlive its PyLoader.
class Messages {
  public:
    void say(const std::string& line) {
        std::lock_guard lock(mutex_);
        lines_.push_back(line);
    }
    std::vector<std::string> take() {
        std::lock_guard lock(mutex_);
        return std::exchange(lines_, {});
    }

  private:
    std::mutex mutex_;
    std::vector<std::string> lines_;
};

// The library's loader with its messages; the arguments it was made with
// and the process it was made in, so that a child forked from that process
// (multiprocessing, a DataLoader's workers) makes its own: the reader
// threads stay in the parent.
struct PyLoader {
    std::shared_ptr<Messages> messages = std::make_shared<Messages>();
    std::unique_ptr<data::Loader> loader;
    LoaderArgs args;
    pid_t pid = 0;
    std::atomic<bool> busy{false}; // a thread is in start_epoch or next

    PyLoader() = default;
    PyLoader(const PyLoader&) = delete;
    ~PyLoader() {
        // In a forked child, the loader's threads are the parent's: joining
        // them, or taking a lock one of them held at the fork, would hang.
        if (pid != getpid()) {
            (void)loader.release();
        } else if (loader && interpreter_exiting()) {
            close_at_exit(loader);
        } else if (loader) {
            // Joins the threads: other Python threads run meanwhile (a reader
            // stuck in a read holds this until the read returns).
            nb::gil_scoped_release unlocked;
            loader.reset();
        }
    }
    bool forked() const { return pid != getpid(); }
    std::vector<std::string> take_messages() { return messages->take(); }
};

// A loader made on a thread of its own, so that the wait for it can be
// interrupted: the device placement reads the whole split, which may take
// minutes or wait on a read that never returns. Given up, the thread ends
// at its next piece of the read (or when the read returns) and destroys
// what it made.
struct Construction {
    std::mutex mutex;
    std::condition_variable finished;
    bool done = false, abandoned = false;
    std::unique_ptr<data::Loader> loader;
    std::exception_ptr error;
};

void construct(const std::shared_ptr<Construction>& job, const std::vector<std::filesystem::path>& paths,
               const data::LoaderRequest& r) {
    const data::InterruptCheck given_up([&job] {
        std::lock_guard lock(job->mutex);
        return job->abandoned;
    });
    std::unique_ptr<data::Loader> made;
    std::exception_ptr error;
    try {
        made = std::make_unique<data::Loader>(paths, r);
    } catch (...) {
        error = std::current_exception();
    }
    {
        std::lock_guard lock(job->mutex);
        job->done = true;
        if (!job->abandoned) {
            job->loader = std::move(made);
            job->error = error;
        }
    }
    job->finished.notify_all();
}

std::unique_ptr<data::Loader> construct_interruptibly(std::vector<std::filesystem::path> paths, data::LoaderRequest r) {
    auto job = std::make_shared<Construction>();
    try {
        std::thread([job, paths = std::move(paths), r = std::move(r)] { construct(job, paths, r); }).detach();
    } catch (const std::system_error& e) {
        throw runtime_error(std::string("cannot start a thread to make the loader (") + e.what() +
                            "); the system refuses more threads (a pids or thread limit): end other processes");
    }
    std::unique_lock lock(job->mutex);
    try {
        data::wait_interruptible(job->finished, lock, [&] { return job->done; });
    } catch (const data::Interrupted&) {
        job->abandoned = true;
        throw;
    }
    if (job->error) std::rethrow_exception(job->error);
    return std::move(job->loader);
}

// Makes p's loader from its arguments in this process; a GPU loader's
// device is this thread's current device afterwards, as where it is made
// on this thread.
void make_engine(PyLoader& p) {
    data::LoaderRequest r = request_of(p.args);
    r.source.notice = [m = p.messages](const std::string& line) { m->say(line); };
    r.source.warn = [m = p.messages](const std::string& line) { m->say(line); };
    std::vector<std::filesystem::path> paths(p.args.paths.begin(), p.args.paths.end());
    p.loader = without_gil([&] { return construct_interruptibly(std::move(paths), std::move(r)); });
    if (p.loader->on_gpu()) gpu::set_device(p.loader->plan().config.device.index);
    p.pid = getpid();
}

// One thread at a time in the ring: a second one would restart the epoch
// under the first one's wait, or release the first one's batch.
class OneThread {
  public:
    explicit OneThread(PyLoader& p) : p_(p) {
        if (p_.busy.exchange(true))
            throw usage_error("dstk.Loader is being iterated by another thread (one loader delivers one sequence "
                              "of batches); give each thread a Loader of its own");
    }
    ~OneThread() { p_.busy = false; }
    OneThread(const OneThread&) = delete;
    OneThread& operator=(const OneThread&) = delete;

  private:
    PyLoader& p_;
};

// The loader for a new iteration: in a child forked from the process that
// made it, a new one from the same arguments (the old one left alone, see
// ~PyLoader). CUDA does not survive fork(): a GPU loader cannot follow.
data::Loader& fresh_engine(PyLoader& p) {
    if (p.forked()) {
        if (p.loader->on_gpu())
            throw usage_error("dstk.Loader: a GPU loader cannot be used in a process forked from the one that made "
                              "it (CUDA does not survive fork()); make the Loader in this process, or start it "
                              "with multiprocessing's 'spawn' method");
        (void)p.loader.release();
        make_engine(p);
    }
    return *p.loader;
}

// The loader of the iteration under way; in a forked child that has not
// started one of its own, an error rather than a wait for the parent's threads.
data::Loader& running_engine(PyLoader& p) {
    if (p.forked())
        throw usage_error("dstk.Loader: this iteration began in the process this one was forked from, whose "
                          "reader threads stay there; start a new iteration (for batch in loader) in this process");
    return *p.loader;
}

// cpu: a tuple of NumPy arrays the caller owns, one per output field; None at
// the end of the epoch.
nb::object next_host(data::Loader& l) {
    std::vector<HostBuffer> buffers;
    std::vector<void*> out;
    for (const data::FieldOutput& o : l.outputs()) {
        buffers.emplace_back(std::uint64_t{l.batch()} * o.sample_bytes());
        out.push_back(buffers.back().data.get());
    }
    const std::uint32_t n = without_gil([&] { return l.next_host(out); });
    if (n == 0) return nb::none();
    nb::list arrays;
    for (std::size_t f = 0; f < buffers.size(); ++f) {
        const data::FieldOutput& o = l.outputs()[f];
        arrays.append(to_numpy(std::move(buffers[f]), batch_shape(o, n), dlpack_dtype(o.dtype)));
    }
    return nb::tuple(arrays);
}

// cuda: takes the next batch, and `stream` (a cudaStream_t; -1: none yet)
// waits for it; returns (slot, size), None at the end of the epoch. The
// batch's arrays come from slot_arrays: a consumer that keeps its own views
// of each slot (dstk.Loader's torch tensors) asks once per slot.
nb::object next_device(data::Loader& l, std::int64_t stream) {
    data::DeviceBatch b;
    if (!without_gil([&] { return l.next_device(b); })) return nb::none();
    if (stream != -1) l.wait_ready(b.slot, static_cast<std::uintptr_t>(stream));
    return nb::make_tuple(b.slot, b.size);
}

// The arrays of the batch of `size` samples in `slot`: one DLPack array per
// output field (nanobind's array-API objects carry no shape or dtype:
// fields() gives them).
nb::object slot_arrays(data::Loader& l, unsigned slot, std::uint32_t size) {
    const data::DeviceBatch b = l.slot_batch(slot, size);
    const int dev = l.plan().config.device.index;
    nb::list arrays;
    for (std::size_t f = 0; f < b.data.size(); ++f) {
        const data::FieldOutput& o = l.outputs()[f];
        nb::capsule owner(new std::shared_ptr<const void>(b.memory),
                          [](void* p) noexcept { delete static_cast<std::shared_ptr<const void>*>(p); });
        const auto shape = batch_shape(o, b.size);
        arrays.append(nb::ndarray<nb::array_api>(b.data[f], shape.size(), shape.data(), owner, nullptr,
                                                 dlpack_dtype(o.dtype), nb::device::cuda::value, dev));
    }
    return nb::tuple(arrays);
}

// Each output field: (name, NumPy dtype name, per-sample shape, kind, stored
// dtype's name, delivered dtype's name).
nb::list fields_of(const data::Loader& l) {
    nb::list out;
    for (const data::FieldOutput& o : l.outputs()) {
        nb::list dims;
        for (const std::uint64_t d : o.shape.dims) dims.append(d);
        out.append(nb::make_tuple(o.name, numpy_name(o.dtype), nb::tuple(dims),
                                  std::string(data::field_kind_name(o.kind)), std::string(dtype_name(o.stored)),
                                  std::string(dtype_name(o.dtype))));
    }
    return out;
}

nb::dict times_dict(const data::StageTimes& t) {
    nb::dict d;
    d["read_wait"] = t.read_wait;
    d["read"] = t.read;
    d["decode"] = t.decode;
    d["h2d"] = t.h2d;
    d["batches"] = t.batches;
    d["samples"] = t.samples;
    d["bytes"] = t.bytes;
    return d;
}

// The plan as JSON; a mix's is its first member's settings with the mix's
// facts, placement "mix" and the whole mix plan under "mix".
std::string plan_text(const data::Loader& l) {
    nlohmann::json j = data::plan_json(l.plan());
    if (const data::MixPlan* m = l.mix_plan()) {
        j["placement"] = "mix";
        j["dataset"] = nullptr;
        j["mix"] = data::mix_plan_json(*m);
    }
    return dump_json(j, -1, "the loader's plan");
}

data::Loader& engine(PyLoader& p) {
    return *p.loader;
}

} // namespace

void bind_loader(nb::module_& m) {
    nb::class_<PyLoader>(m, "_Loader")
        .def("__init__",
             [](PyLoader* self, const LoaderArgs& a) {
                 new (self) PyLoader();
                 self->args = a;
                 make_engine(*self);
             })
        .def("take_messages", &PyLoader::take_messages)
        .def_prop_ro("on_gpu", [](PyLoader& p) { return engine(p).on_gpu(); })
        .def_prop_ro("samples", [](PyLoader& p) { return engine(p).samples(); })
        .def_prop_ro("batches_per_epoch", [](PyLoader& p) { return engine(p).batches_per_epoch(); })
        .def_prop_ro("device_bytes", [](PyLoader& p) { return engine(p).device_bytes(); })
        .def_prop_ro("host_bytes", [](PyLoader& p) { return engine(p).host_bytes(); })
        .def_prop_ro("fields", [](PyLoader& p) { return fields_of(engine(p)); })
        .def_prop_ro("plan_json", [](PyLoader& p) { return plan_text(engine(p)); })
        .def_prop_ro("plan_lines",
                     [](PyLoader& p) {
                         const data::Loader& l = engine(p);
                         return l.mix_plan() ? data::describe_mix(*l.mix_plan()) : data::describe(l.plan());
                     })
        .def_prop_ro("norms",
                     [](PyLoader& p) {
                         nb::dict d;
                         for (const data::FieldOutput& o : engine(p).outputs())
                             if (!o.norm.mean.empty()) d[o.name.c_str()] = nb::make_tuple(o.norm.mean, o.norm.std);
                         return d;
                     })
        .def("start_epoch",
             [](PyLoader& p, std::uint64_t epoch, std::uint64_t first) {
                 const OneThread one(p);
                 data::Loader& l = fresh_engine(p);
                 without_gil([&] { l.start_epoch(epoch, first); });
             })
        .def(
            "next",
            [](PyLoader& p, std::int64_t stream) {
                const OneThread one(p);
                data::Loader& l = running_engine(p);
                return l.on_gpu() ? next_device(l, stream) : next_host(l);
            },
            nb::arg("stream") = -1)
        .def(
            "slot_arrays",
            [](PyLoader& p, unsigned slot, std::uint32_t size) { return slot_arrays(engine(p), slot, size); },
            nb::arg("slot"), nb::arg("size"))
        .def(
            "wait_ready", [](PyLoader& p, unsigned slot, std::uintptr_t stream) { engine(p).wait_ready(slot, stream); },
            nb::arg("slot"), nb::arg("stream"))
        .def("take_times", [](PyLoader& p) {
            if (p.forked()) return times_dict({});
            data::Loader& l = engine(p);
            return times_dict(without_gil([&] { return l.take_times(); }));
        });

    nb::class_<LoaderArgs>(m, "_LoaderArgs")
        .def(nb::init<>())
        .def_rw("paths", &LoaderArgs::paths)
        .def_rw("weights", &LoaderArgs::weights)
        .def_rw("placements", &LoaderArgs::placements)
        .def_rw("split", &LoaderArgs::split)
        .def_rw("fields", &LoaderArgs::fields)
        .def_rw("placement", &LoaderArgs::placement)
        .def_rw("device", &LoaderArgs::device)
        .def_rw("order", &LoaderArgs::order)
        .def_rw("managed_policy", &LoaderArgs::managed_policy)
        .def_rw("bench", &LoaderArgs::bench)
        .def_rw("batch", &LoaderArgs::batch)
        .def_rw("seed", &LoaderArgs::seed)
        .def_rw("chunk", &LoaderArgs::chunk)
        .def_rw("window", &LoaderArgs::window)
        .def_rw("host_mem", &LoaderArgs::host_mem)
        .def_rw("drop_last", &LoaderArgs::drop_last)
        .def_rw("direct", &LoaderArgs::direct)
        .def_rw("convert", &LoaderArgs::convert)
        .def_rw("kinds", &LoaderArgs::kinds)
        .def_rw("normalize", &LoaderArgs::normalize)
        .def_rw("oversubscribe", &LoaderArgs::oversubscribe)
        .def_rw("prefetch", &LoaderArgs::prefetch)
        .def_rw("readers", &LoaderArgs::readers)
        .def_rw("keep", &LoaderArgs::keep)
        .def_rw("labels64", &LoaderArgs::labels64)
        .def_rw("mean", &LoaderArgs::mean)
        .def_rw("std", &LoaderArgs::std);
}

} // namespace dstk::py
