// TensorBoard event files: the TFRecord framing and the three protobuf
// messages written by hand (the format is in dstk/run/tensorboard.hpp), so
// that dstrain needs neither protobuf nor TensorFlow.
#include "dstk/run/tensorboard.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "dstk/atomic_output.hpp"
#include "dstk/checksum.hpp"
#include "dstk/error.hpp"

namespace dstk::run {
namespace {

static_assert(std::endian::native == std::endian::little, "the event file's integers are written little-endian");

// Protobuf's wire types: varint, 64-bit, length-delimited, 32-bit.
enum class Wire : std::uint8_t { varint = 0, fixed64 = 1, bytes = 2, fixed32 = 5 };

void put_varint(std::string& out, std::uint64_t v) {
    while (v >= 0x80) {
        out.push_back(static_cast<char>((v & 0x7F) | 0x80));
        v >>= 7;
    }
    out.push_back(static_cast<char>(v));
}
void put_key(std::string& out, unsigned field, Wire w) {
    put_varint(out, (std::uint64_t{field} << 3) | static_cast<std::uint8_t>(w));
}
template <class T> void put_raw(std::string& out, T v) {
    char b[sizeof v];
    std::memcpy(b, &v, sizeof v);
    out.append(b, sizeof v);
}
void put_bytes(std::string& out, unsigned field, std::string_view bytes) {
    put_key(out, field, Wire::bytes);
    put_varint(out, bytes.size());
    out.append(bytes);
}

// Event's header fields: wall_time = 1, step = 2.
std::string event_head(double wall_time, std::int64_t step) {
    std::string e;
    put_key(e, 1, Wire::fixed64);
    put_raw(e, wall_time);
    if (step != 0) { // proto3 leaves a default value out
        put_key(e, 2, Wire::varint);
        put_varint(e, static_cast<std::uint64_t>(step));
    }
    return e;
}

std::string hostname() {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    return host;
}

double now_seconds() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

} // namespace

std::uint32_t masked_crc32c(const void* data, std::size_t len) {
    const std::uint32_t c = crc32c(data, len);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
    std::string r;
    r.reserve(data.size() + 16);
    put_raw(r, std::uint64_t{data.size()});
    put_raw(r, masked_crc32c(r.data(), 8));
    r.append(data);
    put_raw(r, masked_crc32c(data.data(), data.size()));
    return r;
}

std::string file_version_event(double wall_time) {
    std::string e = event_head(wall_time, 0);
    put_bytes(e, 3, "brain.Event:2");
    return e;
}

std::string scalars_event(double wall_time, std::int64_t step, const std::vector<Scalar>& values) {
    std::string summary;
    for (const Scalar& s : values) {
        std::string v;
        put_bytes(v, 1, s.tag);
        put_key(v, 2, Wire::fixed32);
        put_raw(v, static_cast<float>(s.value));
        put_bytes(summary, 1, v);
    }
    std::string e = event_head(wall_time, step);
    put_bytes(e, 5, summary);
    return e;
}

EventFile::EventFile(const std::filesystem::path& dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec || !std::filesystem::is_directory(dir))
        throw usage_error("cannot create the TensorBoard directory '" + dir.string() + "' (" +
                          (ec ? ec.message() : std::string("a file of that name exists")) +
                          ") give a directory that can be created or written");
    const std::string stem = "events.out.tfevents." + std::to_string(static_cast<long long>(now_seconds())) + "." +
                             hostname() + "." + std::to_string(::getpid()) + ".";
    for (int n = 0; !fd_; ++n) {
        path_ = dir / (stem + std::to_string(n));
        // O_EXCL: a file of that name (another run's, or a link) is never opened.
        fd_ = UniqueFd::try_open(path_, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0644);
        if (!fd_ && (errno != EEXIST || n >= 1000))
            throw_errno("cannot create the TensorBoard event file", path_.string());
    }
    append(tfrecord(file_version_event(now_seconds())));
}

void EventFile::write(std::int64_t step, const std::vector<Scalar>& values) {
    append(tfrecord(scalars_event(now_seconds(), step, values)));
}

void EventFile::append(std::string_view record) {
    write_all(fd_.get(), record.data(), record.size(), -1, path_);
}

} // namespace dstk::run
