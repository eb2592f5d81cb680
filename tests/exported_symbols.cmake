# What libattn.so exports: the C API (attn_*) and namespace attn only, by
# mangled name (cmake/attn.map) -- never attn's internals (attn::detail,
# attn::core, attn::kernels, attn::reference), Highway's, stb's or
# the C++ standard library's symbols -- and the public API is there.
#   cmake -DLIBRARY=<libattn.so> -DNM=<nm> -P exported_symbols.cmake
execute_process(COMMAND ${NM} -D --defined-only --format=posix ${LIBRARY}
                OUTPUT_VARIABLE listing RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "${NM} failed on ${LIBRARY}")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(stray "")
set(count 0)
foreach(line IN LISTS lines)
  if(line STREQUAL "")
    continue()
  endif()
  string(REGEX REPLACE " .*" "" name "${line}")
  string(REGEX REPLACE "@.*" "" name "${name}")
  if(name STREQUAL "ATTN_0")  # the version node itself
    continue()
  endif()
  math(EXPR count "${count} + 1")
  if(NOT name MATCHES "^(attn_|_ZN4attn|_ZNK4attn|_ZTIN4attn|_ZTSN4attn|_ZTVN4attn)" OR
     name MATCHES "^_Z(N|NK|TIN|TSN|TVN)4attn(6detail|4core|7kernels|9reference)")
    list(APPEND stray "${name}")
  endif()
endforeach()
if(stray)
  list(LENGTH stray n)
  list(JOIN stray "\n  " shown)
  message(FATAL_ERROR "${LIBRARY} exports ${n} symbols outside attn_* and attn::* (or in its internals):\n  ${shown}")
endif()
# The public API: attention<float, float>, its plan's run, the layer's forward, the errors' type information.
foreach(required "_ZN4attn9attentionIffEE" "_ZNK4attn13AttentionPlanIffE3run" "_ZTIN4attn10ValueErrorE" "_ZNK4attn18MultiHeadAttentionIfE7forward")
  string(FIND "${listing}" "${required}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${LIBRARY} does not export ${required}")
  endif()
endforeach()
message(STATUS "${LIBRARY}: ${count} symbols, all attn_* or attn::*")
