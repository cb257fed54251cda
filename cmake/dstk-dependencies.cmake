# The libraries every build of dstk's library links, found the same way by
# the root CMakeLists.txt and by dstk-config.cmake (a consumer of the library
# a build tree exported: python/CMakeLists.txt).
find_package(PkgConfig REQUIRED)
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
pkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc)
pkg_check_modules(ZLIB REQUIRED IMPORTED_TARGET zlib)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
find_package(Threads REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
