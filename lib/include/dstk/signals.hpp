#pragma once
// SIGINT/SIGTERM handling. The first signal sets a flag that long loops poll
// (throw_if_interrupted), so the normal unwinding removes temporary outputs and
// the tool exits 128 + the signal's number, as shells and supervisors expect:
// 130 after SIGINT, 143 after SIGTERM. A second signal removes every
// registered temporary path from the handler itself (unlink/rmdir are
// async-signal-safe) and exits the same way at once.
#include <filesystem>

#include "dstk/error.hpp"

namespace dstk {

void install_interrupt_handlers();
bool interrupted();
void throw_if_interrupted(); // Error(ExitCode::interrupted)
// The exit code for an interrupted run: terminated (143) when the first signal
// was SIGTERM, else interrupted (130).
ExitCode interrupt_exit_code();

// Temporary paths to remove on a second signal. Files before the directories
// that hold them: removal runs in reverse registration order.
void register_temp_path(const std::filesystem::path& p);
void unregister_temp_path(const std::filesystem::path& p);

} // namespace dstk
