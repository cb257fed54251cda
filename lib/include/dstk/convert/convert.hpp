#pragma once
// dsconvert: dtype, compression, layout and format conversion, out of core.
// Every stage streams blocks of samples, so memory stays bounded whatever the
// dataset size. The stages live in lib/src/convert/ (convert_job.hpp lists
// them in order): settings, field plan, sinks, resumable output, shuffle,
// stream, report, verify.
#include "dstk/convert/options.hpp"

namespace dstk {

// Runs the whole conversion (or the verification, or the benchmark); prints
// the report on stderr (or one JSON document on stdout with --json). Throws
// Error.
void run_convert(const ConvertOptions& o);
// dsconvert --merge: checks that o.merge_parts are the parts 0..N-1 of one
// --shard run, then makes o.output a dataset whose fields list the parts'
// files (FieldInfo::parts), hard-linked (or, with o.move, renamed) into it.
void run_merge(const ConvertOptions& o);
// dsconvert --concat: checks that o.concat_members have the same fields,
// dtypes and shapes, then makes o.output a dataset whose fields list the
// members' files in order (FieldInfo::parts), hard-linked (else copied, or
// with o.move renamed) into it; o.dataset_field adds the member index field.
void run_concat(const ConvertOptions& o);

} // namespace dstk
