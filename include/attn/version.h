/* attn's version, written in this one place: CMake reads it for the project
   version (and so the shared library's SONAME, attnConfigVersion.cmake and
   attn.pc), and the CLI, the C API and the Python module report it. Plain C,
   so that C programs can check it at compile time too. */
#ifndef ATTN_VERSION_H
#define ATTN_VERSION_H

#define ATTN_VERSION_MAJOR 0
#define ATTN_VERSION_MINOR 2
#define ATTN_VERSION_PATCH 0

#define ATTN_VERSION_STRINGIFY_(x) #x
#define ATTN_VERSION_STRINGIFY(x) ATTN_VERSION_STRINGIFY_(x)
/* "MAJOR.MINOR.PATCH" */
#define ATTN_VERSION                                                          \
  ATTN_VERSION_STRINGIFY(ATTN_VERSION_MAJOR) "." ATTN_VERSION_STRINGIFY(      \
      ATTN_VERSION_MINOR) "." ATTN_VERSION_STRINGIFY(ATTN_VERSION_PATCH)

#endif /* ATTN_VERSION_H */
