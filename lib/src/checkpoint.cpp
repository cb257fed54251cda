#include "dstk/checkpoint.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstring>

#include <nlohmann/json.hpp>

#include "dstk/atomic_output.hpp"
#include "dstk/checksum.hpp"
#include "dstk/error.hpp"
#include "dstk/fd.hpp"
#include "dstk/json.hpp"

namespace fs = std::filesystem;

namespace dstk {
namespace {

constexpr char magic[8] = {'D', 'S', 'T', 'K', 'C', 'K', 'P', '1'};
constexpr std::uint64_t max_header_bytes = 1 << 20;

std::string hex64(std::uint64_t v) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
    return buf;
}

} // namespace

fs::path checkpoint_path(const fs::path& dir) {
    return dir / checkpoint_file_name;
}

bool checkpoint_exists(const fs::path& dir) {
    std::error_code ec;
    return fs::is_regular_file(checkpoint_path(dir), ec);
}

void save_checkpoint(const fs::path& dir, const Checkpoint& c) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec)
        throw runtime_error("cannot create checkpoint directory '" + dir.string() + "' (" + ec.message() +
                            "); choose another --checkpoint");
    nlohmann::json h;
    h["format"] = "dstrain-checkpoint";
    h["version"] = 1;
    h["epoch"] = c.position.epoch;
    h["next_batch"] = c.position.next_batch;
    h["steps"] = c.position.steps;
    h["seed"] = c.seed;
    h["run"] = c.run;
    h["options"] = c.options;
    h["created"] = c.created;
    h["command_line"] = c.command_line;
    if (!c.mix.empty()) h["mix"] = parse_json(c.mix);
    h["state_bytes"] = c.trainer_state.size();
    h["state_checksum"] = "xxh64:" + hex64(xxh64(c.trainer_state.data(), c.trainer_state.size()));
    const std::string header = dump_json(h, 2, "the checkpoint header") + "\n";
    const std::uint64_t header_bytes = header.size();

    AtomicFile f(checkpoint_path(dir), Replace::earlier);
    f.write(magic, sizeof magic);
    f.write(&header_bytes, sizeof header_bytes);
    f.write(header.data(), header.size());
    f.write(c.trainer_state.data(), c.trainer_state.size());
    f.commit();
}

Checkpoint load_checkpoint(const fs::path& dir) {
    const fs::path path = checkpoint_path(dir);
    const std::string where = path.string();
    const UniqueFd file = try_open_input_file(path, "checkpoint");
    if (!file) {
        if (errno == ENOENT)
            throw runtime_error("no checkpoint in '" + dir.string() + "' (" + checkpoint_file_name +
                                " not found); run without --resume to start training");
        throw_errno("cannot open checkpoint", where);
    }
    const int fd = file.get();
    struct stat st {};
    if (::fstat(fd, &st) != 0) throw_errno("cannot stat checkpoint", where);
    const auto size = static_cast<std::uint64_t>(st.st_size);
    const std::string bad = " (not a dstrain checkpoint, or damaged); delete it or point --checkpoint elsewhere";
    char m[8];
    std::uint64_t header_bytes = 0;
    if (size < sizeof m + 8) throw runtime_error(where + ": " + std::to_string(size) + " bytes" + bad);
    read_all(fd, m, sizeof m, 0, path);
    if (std::memcmp(m, magic, sizeof m) != 0) throw runtime_error(where + ": bad magic" + bad);
    read_all(fd, &header_bytes, 8, 8, path);
    if (header_bytes > max_header_bytes || header_bytes > size - 16)
        throw runtime_error(where + ": header of " + std::to_string(header_bytes) + " bytes" + bad);
    std::string header(header_bytes, '\0');
    read_all(fd, header.data(), header.size(), 16, path);

    Checkpoint c;
    std::uint64_t state_bytes = 0;
    std::string state_checksum;
    try {
        const auto h = parse_json(header);
        if (h.at("format") != "dstrain-checkpoint" || h.at("version") != 1)
            throw runtime_error(where + ": unknown format or version" + bad);
        c.position.epoch = h.at("epoch").get<std::uint64_t>();
        c.position.next_batch = h.at("next_batch").get<std::uint64_t>();
        c.position.steps = h.at("steps").get<std::uint64_t>();
        c.seed = h.at("seed").get<std::uint64_t>();
        c.run = h.at("run").get<std::map<std::string, std::string>>();
        if (h.contains("options")) c.options = h.at("options").get<std::map<std::string, std::vector<std::string>>>();
        c.created = h.at("created").get<std::string>();
        c.command_line = h.at("command_line").get<std::string>();
        if (h.contains("mix")) c.mix = dump_json(h.at("mix"), -1, "the checkpoint's mix");
        state_bytes = h.at("state_bytes").get<std::uint64_t>();
        state_checksum = h.at("state_checksum").get<std::string>();
    } catch (const nlohmann::json::exception& e) {
        throw runtime_error(where + ": header: " + e.what() + bad);
    }
    if (state_bytes != size - 16 - header_bytes)
        throw runtime_error(where + ": holds " + std::to_string(size - 16 - header_bytes) +
                            " bytes of trainer state but its header says " + std::to_string(state_bytes) +
                            " (truncated?)" + bad);
    c.trainer_state.resize(state_bytes);
    read_all(fd, c.trainer_state.data(), state_bytes, static_cast<long long>(16 + header_bytes), path);
    const std::string sum = "xxh64:" + hex64(xxh64(c.trainer_state.data(), c.trainer_state.size()));
    if (sum != state_checksum)
        throw runtime_error(where + ": trainer state checksum " + sum + " does not match " + state_checksum + bad);
    return c;
}

void check_resume_compatible(const Checkpoint& c, const std::map<std::string, std::string>& run, const fs::path& dir) {
    std::string diffs;
    for (const auto& [key, value] : run) {
        const auto it = c.run.find(key);
        const std::string was = it == c.run.end() ? "(unset)" : it->second;
        if (key == "epochs" && it != c.run.end() &&
            std::strtoull(value.c_str(), nullptr, 10) > std::strtoull(was.c_str(), nullptr, 10))
            continue;
        if (was != value) diffs += (diffs.empty() ? "" : ", ") + key + " " + was + " -> " + value;
    }
    if (!diffs.empty())
        throw usage_error("cannot resume from '" + checkpoint_path(dir).string() +
                          "' (the run's options differ: " + diffs +
                          "); --resume repeats the run's options by itself (only --epochs may grow): drop those "
                          "options, or use a new --checkpoint directory");
}

std::map<std::string, std::vector<std::string>> given_options(const CLI::App& app,
                                                              const std::vector<std::string>& exclude) {
    std::map<std::string, std::vector<std::string>> out;
    for (const CLI::Option* o : app.get_options()) {
        const std::string name = o->get_name();
        if (o->count() == 0 || std::find(exclude.begin(), exclude.end(), name) != exclude.end()) continue;
        out[name] = o->results();
    }
    return out;
}

std::vector<std::string> take_recorded_options(CLI::App& app,
                                               const std::map<std::string, std::vector<std::string>>& recorded) {
    std::vector<std::string> taken;
    for (CLI::Option* o : app.get_options()) {
        const auto it = recorded.find(o->get_name());
        if (o->count() > 0 || it == recorded.end()) continue;
        o->add_result(it->second);
        o->run_callback();
        taken.push_back(it->first);
    }
    return taken;
}

} // namespace dstk

namespace dstk {

std::map<std::string, std::vector<std::string>> resume_options(CLI::App& app, const fs::path& dir, bool resume,
                                                               bool quiet) {
    if (resume && !dir.empty() && checkpoint_exists(dir)) {
        const auto taken = take_recorded_options(app, load_checkpoint(dir).options);
        std::string names;
        for (const auto& n : taken) names += (names.empty() ? "" : " ") + n;
        if (!taken.empty() && !quiet)
            std::fprintf(stderr, "dstrain: --resume: %s as recorded in %s\n", names.c_str(),
                         checkpoint_path(dir).c_str());
    }
    return given_options(app, {"--resume", "--checkpoint", "--max-steps", "--init-from", "--force", "--quiet",
                               "--progress", "--json", "--help", "--version"});
}

} // namespace dstk
