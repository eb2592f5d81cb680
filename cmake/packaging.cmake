# Debian packages of attn (make package: cpack -G DEB in the build folder),
# one per install component: libattn0 (the shared library), libattn-dev
# (headers, libattn.a, the CMake and pkg-config files), attn (the
# command-line tool) and, where MPI was found, libattn-dist-dev (attn::dist:
# attn/dist.hpp, libattn_dist.a, its CMake and pkg-config files). Installed
# under /usr; the libraries' dependencies come from dpkg-shlibdeps, the -dev
# packages' from what the static libraries and the CMake config need
# (Highway, stb; Open MPI).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME attn)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "multi-head attention and positional encodings, fast on the CPU")
set(CPACK_PACKAGE_CONTACT "attn developers <attn@localhost>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime dev cli)
if(TARGET attn_dist_library)
  list(APPEND CPACK_COMPONENTS_ALL dist)
endif()
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
# A cross build (make package-arm) packages for its target architecture;
# cpack runs there with DEB_HOST_ARCH=arm64 so that dpkg-shlibdeps reads the
# binaries with the cross objdump and looks up the arm64 libraries.
if(CMAKE_CROSSCOMPILING AND CMAKE_SYSTEM_PROCESSOR STREQUAL "aarch64")
  set(CPACK_DEBIAN_PACKAGE_ARCHITECTURE arm64)
endif()
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME libattn${PROJECT_VERSION_MAJOR})
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_DEV_PACKAGE_NAME libattn-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
    "libattn${PROJECT_VERSION_MAJOR} (= ${PROJECT_VERSION}), libhwy-dev, libstb-dev, pkg-config")
set(CPACK_DEBIAN_DIST_PACKAGE_NAME libattn-dist-dev)
set(CPACK_DEBIAN_DIST_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DIST_PACKAGE_DEPENDS "libattn-dev (= ${PROJECT_VERSION}), libopenmpi-dev")
set(CPACK_DEBIAN_CLI_PACKAGE_NAME attn)
set(CPACK_DEBIAN_CLI_PACKAGE_DEPENDS "libattn${PROJECT_VERSION_MAJOR} (= ${PROJECT_VERSION}), fonts-wqy-microhei")
# The CLI links libattn.so.0 of this very build: let dpkg-shlibdeps find it there.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CMAKE_BINARY_DIR})
include(CPack)
