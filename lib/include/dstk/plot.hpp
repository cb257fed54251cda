#pragma once
// Pictures of dstk's results (PNG), drawn by python/dstk/plot.py with
// matplotlib in a child process: the tools link no plotting library, and the
// picture is the one `python -m dstk.plot` draws.
#include <filesystem>
#include <vector>

namespace dstk {

// Draws `inputs` (one dstrain --log-json file, or one or more dsbench results
// files) into `png`, written as every output is (atomic_output.hpp: replaced
// only with `force`). The interpreter is $DSTK_PYTHON, else python3.
// Throws Error: no_fit when Python, matplotlib or plot.py is missing; usage
// or failure as plot.py exits (its message is on stderr before it).
void draw_plot(const std::vector<std::filesystem::path>& inputs, const std::filesystem::path& png, bool force);

} // namespace dstk
