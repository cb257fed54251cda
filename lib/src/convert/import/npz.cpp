// .npz archives: stored or deflated members, zip64; arrays found by name.
#include "formats.hpp"

namespace dstk::import {

// ---- .npz ---------------------------------------------------------------

// A deflated member: its .npy header read through the inflater, then samples
// streamed from it.
SourceField deflated_npy_field(const std::shared_ptr<File>& f, const ZipMember& m, const std::string& source,
                               std::uint64_t& samples) {
    auto in = std::make_unique<InflateStream>(f, m);
    std::vector<std::uint8_t> head(10);
    if (m.uncompressed_bytes < 10) bad_input(source, "member too short for a .npy header");
    in->read(head.data(), 10);
    const std::uint64_t hlen = head[6] == 1 ? le16(head.data() + 8) : 0;
    std::uint64_t total = 10 + hlen;
    if (head[6] >= 2) {
        head.resize(12);
        in->read(head.data() + 10, 2);
        total = 12 + le32(head.data() + 8);
    }
    if (total > m.uncompressed_bytes) bad_input(source, ".npy header longer than the member");
    const std::size_t have = head.size();
    head.resize(total);
    in->read(head.data() + have, total - have);
    const NpyHeader h = parse_npy_header(head, source);
    if (h.shape.empty()) bad_input(source, "a 0-d array has no samples");
    if (h.data_offset + h.data_bytes() != m.uncompressed_bytes)
        bad_input(source,
                  "array header (" + std::to_string(h.data_bytes()) + " data bytes) disagrees with the member size");
    if (h.fortran_order && h.shape.size() > 1 && h.count() > h.shape[0])
        bad_input(source, "Fortran-order arrays inside a compressed .npz cannot be streamed; save it with "
                          "np.savez (stored) or as .npy");
    SourceField sf;
    sf.dtype = h.dtype;
    sf.shape = sample_shape(h.shape, source);
    const std::size_t swap = h.big_endian == is_little_endian() ? dtype_size(h.dtype) : 0;
    sf.stream = std::make_unique<BytesField>(std::move(in), sample_bytes(sf.shape, sf.dtype), swap);
    samples = h.shape[0];
    return sf;
}

Source open_npz(const fs::path& path, const RawInputOptions& raw) {
    auto f = std::make_shared<File>(path);
    const std::string where = path.string();
    const std::uint64_t tail_bytes = std::min<std::uint64_t>(f->bytes, 1 << 20);
    const auto tail = f->read_at(f->bytes - tail_bytes, tail_bytes);
    std::vector<ZipMember> members = parse_zip_directory(tail, f->bytes, where);
    std::vector<NamedArray> arrays;
    auto add = [&](const std::string& member, SourceField sf, std::uint64_t samples) {
        arrays.push_back({member.substr(0, member.size() - 4), std::move(sf), samples});
    };
    for (ZipMember& m : members) {
        if (!ends_with(m.name, ".npy")) continue;
        if ((m.flags & 1) || m.method == 99) // traditional PKWARE or AES encryption
            bad_input(where + ":" + m.name, "is encrypted (a password-protected archive), which dsconvert does not "
                                            "read; extract it with the password (unzip) and save the arrays again "
                                            "with np.savez");
        const std::uint64_t lh_bytes =
            std::min<std::uint64_t>(f->bytes - std::min(f->bytes, m.data_offset), 30 + 65535 * 2);
        m.data_offset = zip_data_offset(f->read_at(m.data_offset, lh_bytes), m, f->bytes, where);
        const std::string source = where + ":" + m.name;
        std::unique_ptr<ByteStream> bytes;
        NpyHeader h;
        if (m.method == 0) {
            // The .npy header is at most 10 + 2^32 bytes; read it in growing pieces.
            std::uint64_t want = std::min<std::uint64_t>(m.uncompressed_bytes, 4096);
            for (;;) {
                const auto head = f->read_at(m.data_offset, want);
                try {
                    h = parse_npy_header(head, source);
                    break;
                } catch (const Error&) {
                    if (want >= std::min<std::uint64_t>(m.uncompressed_bytes, 1ull << 32)) throw;
                    want = std::min<std::uint64_t>(m.uncompressed_bytes, want * 16);
                }
            }
            if (h.data_offset + h.data_bytes() != m.uncompressed_bytes)
                bad_input(source, "array header disagrees with the member size");
            if (h.shape.empty()) bad_input(source, "a 0-d array has no samples");
            add(m.name, npy_field_from(f, h, m.data_offset + h.data_offset, "", source), h.shape[0]);
            continue;
        }
        if (m.method != 8)
            bad_input(source, "compression method " + std::to_string(m.method) +
                                  " is not supported (numpy writes stored or deflated members)");
        std::uint64_t samples = 0;
        SourceField sf = deflated_npy_field(f, m, source, samples);
        add(m.name, std::move(sf), samples);
    }
    Source s = source_from_arrays(std::move(arrays), raw, where);
    s.format = InputFormat::npz;
    s.description = ".npz archive";
    return s;
}

} // namespace dstk::import

namespace dstk {

using namespace import;

std::vector<ZipMember> parse_zip_directory(std::span<const std::uint8_t> tail, std::uint64_t file_bytes,
                                           const std::string& source) {
    if (tail.size() < 22 || tail.size() > file_bytes) bad_input(source, "too short for a zip archive (.npz)");
    const std::uint64_t tail_start = file_bytes - tail.size();
    std::size_t eocd = tail.size() - 22 + 1;
    while (eocd-- > 0)
        if (le32(tail.data() + eocd) == 0x06054b50 && eocd + 22 + le16(tail.data() + eocd + 20) == tail.size()) break;
    if (eocd == static_cast<std::size_t>(-1))
        bad_input(source, "no zip end-of-directory record (not an .npz archive, or truncated)");
    const std::uint8_t* e = tail.data() + eocd;
    std::uint64_t entries = le16(e + 10), cd_size = le32(e + 12), cd_offset = le32(e + 16);
    if ((entries == 0xFFFF || cd_size == 0xFFFFFFFF || cd_offset == 0xFFFFFFFF) && eocd >= 20 &&
        le32(e - 20) == 0x07064b50) {
        const std::uint64_t z64 = le64(e - 20 + 8);
        // (z64 + 56 can wrap around: compare what is left after z64 instead)
        if (z64 < tail_start || z64 > file_bytes || file_bytes - z64 < 56)
            bad_input(source, "zip64 end record is out of range");
        const std::uint8_t* z = tail.data() + (z64 - tail_start);
        if (le32(z) != 0x06064b50) bad_input(source, "zip64 end record has the wrong signature");
        entries = le64(z + 32);
        cd_size = le64(z + 40);
        cd_offset = le64(z + 48);
    }
    if (cd_offset > file_bytes || cd_size > file_bytes - cd_offset || cd_offset < tail_start)
        bad_input(source, "zip central directory is out of range (archive truncated?)");
    std::vector<ZipMember> out;
    const std::uint8_t* p = tail.data() + (cd_offset - tail_start);
    const std::uint8_t* end = p + cd_size;
    for (std::uint64_t i = 0; i < entries; ++i) {
        if (end - p < 46 || le32(p) != 0x02014b50) bad_input(source, "zip central directory entry is malformed");
        ZipMember m;
        m.flags = le16(p + 8);
        m.method = le16(p + 10);
        m.crc32 = le32(p + 16);
        m.compressed_bytes = le32(p + 20);
        m.uncompressed_bytes = le32(p + 24);
        const std::size_t name_len = le16(p + 28), extra_len = le16(p + 30), comment_len = le16(p + 32);
        m.data_offset = le32(p + 42);
        if (static_cast<std::size_t>(end - p) < 46 + name_len + extra_len + comment_len)
            bad_input(source, "zip central directory entry is cut short");
        m.name.assign(reinterpret_cast<const char*>(p + 46), name_len);
        const std::uint8_t* x = p + 46 + name_len;
        const std::uint8_t* xend = x + extra_len;
        while (xend - x >= 4) {
            const std::uint16_t tag = le16(x), len = le16(x + 2);
            if (xend - x - 4 < len) break;
            if (tag == 0x0001) { // zip64: only the fields that overflowed are present, in order
                const std::uint8_t* v = x + 4;
                const std::uint8_t* vend = v + len;
                auto take = [&](std::uint64_t& field) {
                    if (field != 0xFFFFFFFF) return;
                    if (vend - v < 8) bad_input(source, "zip64 extra field is cut short");
                    field = le64(v);
                    v += 8;
                };
                take(m.uncompressed_bytes);
                take(m.compressed_bytes);
                take(m.data_offset);
            }
            x += 4 + len;
        }
        if (m.data_offset >= file_bytes || m.compressed_bytes > file_bytes)
            bad_input(source, "zip member '" + m.name + "' is outside the archive (truncated?)");
        out.push_back(std::move(m));
        p += 46 + name_len + extra_len + comment_len;
    }
    return out;
}

std::uint64_t zip_data_offset(std::span<const std::uint8_t> local_header, const ZipMember& m, std::uint64_t file_bytes,
                              const std::string& source) {
    if (local_header.size() < 30 || le32(local_header.data()) != 0x04034b50)
        bad_input(source, "zip member '" + m.name + "' has no local header (archive corrupted)");
    const std::uint64_t data =
        m.data_offset + 30 + le16(local_header.data() + 26) + std::uint64_t{le16(local_header.data() + 28)};
    if (data > file_bytes || m.compressed_bytes > file_bytes - data)
        bad_input(source, "zip member '" + m.name + "' extends past the end of the archive (truncated?)");
    if (m.method == 0 && m.compressed_bytes != m.uncompressed_bytes)
        bad_input(source, "stored zip member '" + m.name + "' has different stored and original sizes");
    return data;
}

} // namespace dstk
