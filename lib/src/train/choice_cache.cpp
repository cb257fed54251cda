#include "dstk/train/choice_cache.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "dstk/atomic_output.hpp"
#include "dstk/enum_names.hpp"
#include "dstk/error.hpp"
#include "dstk/fd.hpp"

namespace fs = std::filesystem;

namespace dstk::train {
namespace {

constexpr std::string_view magic = "dstk-kernel-choices 1";

constexpr EnumNames<KernelMode, 4> kernel_mode_names{{{{KernelMode::automatic, "auto"},
                                                       {KernelMode::cached, "cached"},
                                                       {KernelMode::retune, "retune"},
                                                       {KernelMode::heuristic, "heuristic"}}}};
constexpr EnumNames<ChoiceSource, 4> choice_source_names{{{{ChoiceSource::cache, "cache"},
                                                           {ChoiceSource::timed, "timed"},
                                                           {ChoiceSource::heuristic, "heuristic"},
                                                           {ChoiceSource::rule, "rule"}}}};

std::string one_line(std::string s) {
    std::replace(s.begin(), s.end(), '\n', ' ');
    std::replace(s.begin(), s.end(), '\r', ' ');
    return s;
}

bool one_word(std::string_view s) {
    return !s.empty() && s.find_first_of(" \t\r\n") == std::string_view::npos;
}

std::string format_ms(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return buf;
}

template <class T> bool parse_number(std::string_view s, T& out) {
    const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
    return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

std::vector<std::string_view> words(std::string_view line) {
    std::vector<std::string_view> out;
    std::size_t i = 0;
    while (i < line.size()) {
        while (i < line.size() && line[i] == ' ') ++i;
        const std::size_t j = std::min(line.find(' ', i), line.size());
        if (j > i) out.push_back(line.substr(i, j - i));
        i = j;
    }
    return out;
}

bool parse_entry(std::string_view line, std::string& key, Choice& c) {
    const auto w = words(line);
    if (w.size() != 5) return false;
    const std::size_t slash = w[4].find('/');
    if (slash == std::string_view::npos) return false;
    key = std::string(w[0]);
    c.kernel = std::string(w[1]);
    return parse_number(w[2], c.median_ms) && parse_number(w[3], c.runner_up_ms) &&
           parse_number(w[4].substr(0, slash), c.wins) && parse_number(w[4].substr(slash + 1), c.repetitions) &&
           c.median_ms >= 0.0 && c.runner_up_ms >= 0.0 && c.wins <= c.repetitions;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t m = v.size() / 2;
    return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// An flock on a sibling lock file for the read-merge-write of a store
// (released when the descriptor closes).
UniqueFd lock_file(const fs::path& p) {
    UniqueFd fd = UniqueFd::open(p, O_RDWR | O_CREAT, "open the lock file");
    if (::flock(fd.get(), LOCK_EX) != 0) throw runtime_error("cannot lock " + p.string());
    return fd;
}

} // namespace

KernelMode parse_kernel_mode(std::string_view text) {
    return kernel_mode_names.parse(text, "--kernels");
}
std::string_view kernel_mode_name(KernelMode m) {
    return kernel_mode_names.name(m);
}
std::string_view choice_source_name(ChoiceSource s) {
    return choice_source_names.name(s);
}

std::string DeviceIdentity::text() const {
    return one_line("gpu=" + gpu + "; cc=" + compute + "; driver=" + driver + "; cudnn=" + cudnn + "; dstk=" + dstk +
                    "; kernels=" + kernel_set);
}

std::string ConvKey::text() const {
    return "conv." + op + "." + std::string(precision_name(precision)) + (deterministic ? ".det" : "") +
           (nchw ? ".nchw" : ".nhwc") + ".n" + std::to_string(n) + ".c" + std::to_string(c) + ".h" + std::to_string(h) +
           ".w" + std::to_string(w) + ".k" + std::to_string(k) + ".r" + std::to_string(kernel) + ".s" +
           std::to_string(stride) + ".p" + std::to_string(pad) + ".ws" + std::to_string(workspace);
}

std::string text_hash(std::string_view text) {
    std::uint64_t h = 1469598103934665603ull; // FNV-1a
    for (const unsigned char ch : text) h = (h ^ ch) * 1099511628211ull;
    char buf[24];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    return buf;
}

std::string choice_file_name(const DeviceIdentity& id) {
    return "kernel-choices-" + text_hash(id.text()) + ".txt";
}

fs::path default_choice_dir() {
    if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x == '/') return fs::path(x) / "dstk";
    if (const char* h = std::getenv("HOME"); h && *h) return fs::path(h) / ".cache" / "dstk";
    return {};
}

std::optional<Pick> pick_fastest(const std::vector<CandidateTimes>& cands, std::string_view previous, double tie) {
    std::vector<double> med(cands.size(), 0.0);
    std::vector<unsigned> wins(cands.size(), 0);
    std::size_t reps = 0;
    for (const auto& c : cands) reps = std::max(reps, c.ms.size());
    for (std::size_t r = 0; r < reps; ++r) {
        std::optional<std::size_t> best;
        for (std::size_t j = 0; j < cands.size(); ++j)
            if (r < cands[j].ms.size() && (!best || cands[j].ms[r] < cands[*best].ms[r])) best = j;
        if (best) ++wins[*best];
    }
    std::optional<std::size_t> fastest;
    for (std::size_t j = 0; j < cands.size(); ++j) {
        if (cands[j].ms.empty()) continue;
        med[j] = median(cands[j].ms);
        if (!fastest || med[j] < med[*fastest]) fastest = j;
    }
    if (!fastest) return std::nullopt;
    const double bound = med[*fastest] * (1.0 + tie);
    std::size_t pick = *fastest, tied = 0;
    bool from_previous = false;
    for (std::size_t j = 0; j < cands.size(); ++j) {
        if (cands[j].ms.empty() || med[j] > bound) continue;
        ++tied;
        if (from_previous) continue;
        if (!previous.empty() && cands[j].kernel == previous) {
            pick = j;
            from_previous = true;
        } else if (wins[j] > wins[pick] || (wins[j] == wins[pick] && med[j] < med[pick])) {
            pick = j;
        }
    }
    Pick p;
    p.index = pick;
    p.near_tie = tied > 1;
    p.choice.kernel = cands[pick].kernel;
    p.choice.median_ms = med[pick];
    p.choice.wins = wins[pick];
    p.choice.repetitions = static_cast<unsigned>(cands[pick].ms.size());
    std::optional<double> runner;
    for (std::size_t j = 0; j < cands.size(); ++j)
        if (j != pick && !cands[j].ms.empty() && (!runner || med[j] < *runner)) runner = med[j];
    p.choice.runner_up_ms = runner.value_or(0.0);
    return p;
}

std::string serialise_choices(const DeviceIdentity& id, const std::map<std::string, Choice>& entries) {
    std::string out = std::string(magic) + "\ndevice " + id.text() + "\n";
    for (const auto& [key, c] : entries)
        out += key + " " + c.kernel + " " + format_ms(c.median_ms) + " " + format_ms(c.runner_up_ms) + " " +
               std::to_string(c.wins) + "/" + std::to_string(c.repetitions) + "\n";
    out += "end " + std::to_string(entries.size()) + "\n";
    return out;
}

bool parse_choices(std::string_view text, const DeviceIdentity& id, std::map<std::string, Choice>& out,
                   std::string* why) {
    auto fail = [&](const std::string& w) {
        if (why) *why = w;
        return false;
    };
    std::map<std::string, Choice> got;
    std::size_t pos = 0, line_no = 0;
    bool ended = false;
    while (pos < text.size()) {
        const std::size_t nl = text.find('\n', pos);
        if (nl == std::string_view::npos) return fail("the last line is incomplete (truncated file?)");
        const std::string_view line = text.substr(pos, nl - pos);
        pos = nl + 1;
        ++line_no;
        if (ended) return fail("text after the end line");
        if (line_no == 1) {
            if (line != magic) return fail("not a dstk kernel-choice file");
        } else if (line_no == 2) {
            if (line != "device " + id.text())
                return fail("written for another device or version (" + std::string(line) + ")");
        } else if (line.starts_with("end ")) {
            std::size_t count = 0;
            if (!parse_number(line.substr(4), count) || count != got.size())
                return fail("the end line does not match the " + std::to_string(got.size()) + " entries");
            ended = true;
        } else {
            std::string key;
            Choice c;
            if (!parse_entry(line, key, c)) return fail("line " + std::to_string(line_no) + " is malformed");
            got[key] = c;
        }
    }
    if (!ended) return fail("no end line (truncated file?)");
    out = std::move(got);
    return true;
}

ChoiceCache::ChoiceCache(fs::path dir, DeviceIdentity id, NoticeSink notice)
    : dir_(std::move(dir)), id_(std::move(id)), notice_(std::move(notice)) {
    if (dir_.empty()) return;
    path_ = dir_ / choice_file_name(id_);
    read_file(entries_, false);
}

bool ChoiceCache::read_file(std::map<std::string, Choice>& into, bool quiet) const {
    std::error_code ec;
    if (!fs::exists(path_, ec)) return false;
    if (!fs::is_regular_file(path_, ec)) {
        if (!quiet && notice_) notice_("kernel-choice cache " + path_.string() + " is not a regular file; ignored");
        return false;
    }
    std::ifstream in(path_, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string why;
    if (!in || !parse_choices(ss.str(), id_, into, &why)) {
        if (!quiet && notice_)
            notice_("kernel-choice cache " + path_.string() + " ignored (" + (why.empty() ? "unreadable" : why) +
                    "); it is rewritten at the next store");
        into.clear();
        return false;
    }
    return true;
}

std::optional<Choice> ChoiceCache::find(const std::string& key) const {
    const auto it = entries_.find(key);
    if (it == entries_.end()) return std::nullopt;
    return it->second;
}

void ChoiceCache::put(const std::string& key, const Choice& c) {
    if (!one_word(key) || !one_word(c.kernel)) throw runtime_error("kernel choice '" + key + "' is not one word");
    entries_[key] = c;
    fresh_[key] = c;
}

bool ChoiceCache::store() {
    if (dir_.empty() || fresh_.empty()) return true;
    try {
        fs::create_directories(dir_);
        const UniqueFd lock = lock_file(dir_ / (path_.filename().string() + ".lock"));
        std::map<std::string, Choice> merged;
        read_file(merged, true);
        for (const auto& [k, c] : fresh_) merged[k] = c;
        const std::string text = serialise_choices(id_, merged);
        AtomicFile out(path_, true);
        out.write(text.data(), text.size());
        out.commit();
        for (const auto& [k, c] : merged) entries_.try_emplace(k, c);
        fresh_.clear();
        return true;
    } catch (const std::exception& e) {
        if (notice_) notice_(std::string("kernel choices not stored (") + e.what() + ")");
        return false;
    }
}

} // namespace dstk::train
