# The libraries every build of dstk's library links, found the same way by
# the root CMakeLists.txt and by dstk-config.cmake (a consumer of the library
# a build tree exported: python/CMakeLists.txt).
find_package(PkgConfig REQUIRED)
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
pkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc)
pkg_check_modules(ZLIB REQUIRED IMPORTED_TARGET zlib)
# libxxhash: pkg-config's (libxxhash-dev), else a libxxhash-dev unpacked
# under DSTK_XXHASH_ROOT (a machine without network: scripts/gpu-test.sh
# unpacks a carried .deb there), linked statically; the same target name.
set(DSTK_XXHASH_ROOT "" CACHE PATH "An unpacked libxxhash-dev (its usr/ folder) where pkg-config has none")
if(DSTK_XXHASH_ROOT)
  find_path(XXHASH_INCLUDE_DIR xxhash.h PATHS ${DSTK_XXHASH_ROOT}/include NO_DEFAULT_PATH REQUIRED)
  find_library(XXHASH_LIBRARY NAMES libxxhash.a PATHS ${DSTK_XXHASH_ROOT}/lib/x86_64-linux-gnu
               ${DSTK_XXHASH_ROOT}/lib/aarch64-linux-gnu ${DSTK_XXHASH_ROOT}/lib NO_DEFAULT_PATH REQUIRED)
  if(NOT TARGET PkgConfig::XXHASH)
    add_library(PkgConfig::XXHASH INTERFACE IMPORTED)
    set_target_properties(PkgConfig::XXHASH PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${XXHASH_INCLUDE_DIR}
                                                       INTERFACE_LINK_LIBRARIES ${XXHASH_LIBRARY})
  endif()
else()
  pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
endif()
find_package(Threads REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
