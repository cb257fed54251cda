#pragma once
// A batch: the data path's contract with whoever consumes it (the trainer,
// the Python loader, dsbench). It is a set of named fields, every one holding
// the same `size` samples in the same order, sample-major, in the memory of
// one device (host memory for the cpu backend, device memory for cuda). A
// consumer takes the fields it names: the trainer its input and its targets,
// the Python loader the fields the user asked for.
//
// The fields' names, dtypes and shapes are fixed for the life of the batch's
// source; each batch only moves `data` and `size`.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dstk/dtype.hpp"
#include "dstk/shape.hpp"

namespace dstk {

struct BatchField {
    std::string name;           // the dataset field's name ("x", "positions", "dataset")
    DType dtype = DType::u8;    // as delivered (the stored dtype, before any conversion)
    Shape shape;                // per sample
    const void* data = nullptr; // size samples, sample-major, in the batch's device memory
    // Device memory, cuda only, set only for a consumer that asked for it
    // (SourceConfig::rows): sample i of the batch is row rows[i] of `data`,
    // a split resident on the GPU read where it lies instead of gathered
    // into a batch first. Null: sample i is row i.
    const std::uint64_t* rows = nullptr;

    std::uint64_t sample_bytes() const { return dstk::sample_bytes(shape, dtype); }
};

struct Batch {
    std::uint32_t size = 0;
    std::vector<BatchField> fields;

    const BatchField* find(std::string_view name) const noexcept;
    // The field named `name`; a logic error naming it and the fields there are
    // otherwise (the consumer asked its source for fields it then lacks).
    const BatchField& field(std::string_view name) const;
    // Bytes of one sample over every field.
    std::uint64_t sample_bytes() const;
};

} // namespace dstk
