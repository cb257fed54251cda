#pragma once
// SIGINT/SIGTERM handling. The first signal sets a flag that long loops poll
// (throw_if_interrupted), so the normal unwinding removes temporary outputs and
// the tool exits 130. A second signal removes every registered temporary path
// from the handler itself (unlink/rmdir are async-signal-safe) and exits 130
// at once.
#include <filesystem>

namespace dstk {

void install_interrupt_handlers();
bool interrupted();
void throw_if_interrupted(); // Error(ExitCode::interrupted)

// Temporary paths to remove on a second signal. Files before the directories
// that hold them: removal runs in reverse registration order.
void register_temp_path(const std::filesystem::path& p);
void unregister_temp_path(const std::filesystem::path& p);

} // namespace dstk
