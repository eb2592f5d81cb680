# The web build's dependencies (make web, under Emscripten's emcmake), in
# place of the native build's find_package calls.
#
# Highway: Debian ships it built for the host only, so its two sources that
# attn links (target detection, the aligned allocator) are compiled here from
# the source of the same version (tools/highway-source.sh puts it in
# ATTN_HWY_SOURCE_DIR). One target, WebAssembly's SIMD128, chosen at compile
# time: there is nothing to detect at run time.
set(ATTN_HWY_SOURCE_DIR "" CACHE PATH "Highway's source (tools/highway-source.sh)")
if(NOT EXISTS "${ATTN_HWY_SOURCE_DIR}/hwy/targets.cc")
  message(FATAL_ERROR "The web build needs Highway's source in ATTN_HWY_SOURCE_DIR (tools/highway-source.sh), "
                      "got '${ATTN_HWY_SOURCE_DIR}'")
endif()
# Exceptions as WebAssembly's own (an attn error becomes a message on the
# page, not an aborted module), SIMD128 for Highway's WASM target.
add_compile_options(-msimd128 -fwasm-exceptions)
add_compile_definitions(HWY_COMPILE_ONLY_STATIC=1)
add_library(hwy STATIC ${ATTN_HWY_SOURCE_DIR}/hwy/targets.cc ${ATTN_HWY_SOURCE_DIR}/hwy/aligned_allocator.cc)
target_include_directories(hwy SYSTEM PUBLIC ${ATTN_HWY_SOURCE_DIR})
add_library(hwy::hwy ALIAS hwy)

# Header-only libraries from Debian (nlohmann/json; stb, which the pictures'
# room includes), seen through a folder that holds them alone: /usr/include
# itself holds the host's C library, which must not shadow Emscripten's.
set(attn_host_headers ${CMAKE_BINARY_DIR}/host-headers)
file(MAKE_DIRECTORY ${attn_host_headers})
file(CREATE_LINK /usr/include/nlohmann ${attn_host_headers}/nlohmann SYMBOLIC)
file(CREATE_LINK /usr/include/stb ${attn_host_headers}/stb SYMBOLIC)
add_library(attn_web_json INTERFACE)
target_include_directories(attn_web_json SYSTEM INTERFACE ${attn_host_headers})
add_library(nlohmann_json::nlohmann_json ALIAS attn_web_json)
add_library(attn_web_stb INTERFACE)
target_include_directories(attn_web_stb SYSTEM INTERFACE ${attn_host_headers}/stb)
add_library(PkgConfig::stb ALIAS attn_web_stb)
# No threads: a page served without cross-origin isolation has no
# SharedArrayBuffer, so the page runs attn on one thread (web/attn_web.cc).
add_library(attn_web_threads INTERFACE)
add_library(Threads::Threads ALIAS attn_web_threads)
