#pragma once
// Which ranks reached start-up, for the message of a rank left waiting in
// MPI_Init (which cannot say whom it waits for): each rank marks its arrival
// in a directory of this host's temporary folder named after the launcher's
// job. Where every rank runs on this host, the ranks without a mark are the
// missing ones; elsewhere they cannot be named from here.
#include <filesystem>
#include <string>

#include "dstk/dist/world.hpp"

namespace dstk::dist {

class Arrivals {
  public:
    explicit Arrivals(const Launch& launch);
    ~Arrivals() { done(); }
    Arrivals(const Arrivals&) = delete;
    Arrivals& operator=(const Arrivals&) = delete;
    // "rank(s) 1, 3 never started" or why they cannot be named.
    std::string missing_text() const;
    // After the rendezvous (or on its failure): this rank's mark, and the
    // directory once empty, removed. The watchdog leaves them: another rank's
    // watchdog may still be reading them.
    void done();

  private:
    Launch launch_;
    std::filesystem::path dir_; // empty: marks not kept
};

} // namespace dstk::dist
