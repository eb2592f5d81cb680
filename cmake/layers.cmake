# The rooms of attn and which room may include which: the one table that
# cmake/check_layers.cmake holds every #include of src/, include/, companion/
# and python/ against, before the library compiles (so a kernel that includes
# "attn/io.hpp" fails the build). CMakeLists.txt builds one OBJECT library per
# room, composing attn::attn (the library's rooms) and attn_companion (the
# companion's).

# The library's rooms, from the bottom up; the article's companion (pictures,
# training and the experiments, the machine's ceilings), built on the
# library's public API; then the programs built on them.
set(ATTN_LIBRARY_ROOMS core reference kernels api io layer onnx capi)
set(ATTN_COMPANION_ROOMS picture train machine)
set(ATTN_ROOMS ${ATTN_LIBRARY_ROOMS} ${ATTN_COMPANION_ROOMS} dist cli python web)

# Where a file lives: src/<room>/, companion/<room>/ and python/ are rooms by
# folder; the public headers (include/attn/, one flat folder for users; the
# companion's in companion/include/companion/) are assigned one by one.
set(ATTN_PUBLIC_core attention.hpp batch_attention.hpp cascade.hpp error.hpp half.hpp linear.hpp mask.hpp quantize.hpp random.hpp
                     latent_attention.hpp softmax.hpp sparse_attention.hpp tensor.hpp threads.hpp varlen.hpp version.h)
set(ATTN_PUBLIC_layer attn.hpp kv_cache.hpp latent_cache.hpp paged_kv_cache.hpp multi_head.hpp multi_head_attention.hpp
                      multi_head_latent_attention.hpp positional.hpp rope_scaling.hpp)
set(ATTN_PUBLIC_onnx onnx.hpp)
set(ATTN_PUBLIC_io io.hpp file.hpp)
set(ATTN_PUBLIC_capi attn.h)
set(ATTN_PUBLIC_dist dist.hpp)
set(ATTN_PUBLIC_picture picture.hpp utf8.hpp)
set(ATTN_PUBLIC_train adam.hpp embedding.hpp experiments.hpp train.hpp)
set(ATTN_PUBLIC_machine machine.hpp)

# Which rooms a room may include besides its own. External libraries count as
# rooms too (hwy: Highway, json: nlohmann, stb); the C++ and system headers,
# CLI11 and pybind11 are open to all.
#   core: tensors, masks, the options and the plan (attention_problem.hpp):
#     the bottom, which includes no other room.
#   reference: the double-precision definition, over core's plan.
#   kernels: the plan and the types; no file formats, no pictures. The
#     reference, for the rare float32 rows their vector arithmetic cannot
#     settle (reference_attention_row).
#   api: the functions that validate once and dispatch (attention, its
#     backward, varlen, softmax): to the kernels (through their door) for
#     float32, to the reference for float64.
#   layer: over the public API (attention, linear: core's headers, the api's
#     code), io for its save/load, and json for rope_scaling dicts.
#   onnx: ONNX's operators, an adapter over the public API and the
#     positional encodings.
#   capi: the C API, a thin layer over the C++ API's public headers.
#   picture, train, machine: the companion (attn_companion): heat maps;
#     Adam, the classifier, the trainer and the experiments; the machine's
#     ceilings (over precision_peak_loop).
#   dist: context parallelism over MPI (a library of its own, attn::dist).
set(ATTN_MAY_INCLUDE_core)
set(ATTN_MAY_INCLUDE_reference core)
set(ATTN_MAY_INCLUDE_kernels core reference hwy)
set(ATTN_MAY_INCLUDE_api core reference kernels)
set(ATTN_MAY_INCLUDE_layer core io json)
set(ATTN_MAY_INCLUDE_onnx core layer)
set(ATTN_MAY_INCLUDE_io core json)
set(ATTN_MAY_INCLUDE_capi core layer io)
set(ATTN_MAY_INCLUDE_picture core io stb)
set(ATTN_MAY_INCLUDE_train core layer io)
set(ATTN_MAY_INCLUDE_machine core hwy)
set(ATTN_MAY_INCLUDE_dist core)
set(ATTN_MAY_INCLUDE_cli core layer io picture train machine json dist)
set(ATTN_MAY_INCLUDE_python core layer onnx io dist)
# web: the page's bindings (web/), over the public API and the companion.
set(ATTN_MAY_INCLUDE_web core layer picture train json)

# A room's door: the only files of it that other rooms may include (every
# file, for a room without one). The rest of the kernels (-inl.h pieces,
# scratch) is theirs alone.
set(ATTN_DOOR_kernels src/kernels/attention_kernel.hpp src/kernels/linear.hpp)

# What a room gives the rooms above it beyond the public API is in a
# namespace named after it (attn::core, attn::kernels, attn::reference),
# which only that room's files open; attn::detail is each room's own, used
# by no other room.
set(ATTN_NAMESPACE_ROOMS core kernels reference)

# The rooms built on the library's public API only: of the library's rooms
# they may include the public headers (include/attn/) and nothing else.
set(ATTN_PUBLIC_API_ONLY ${ATTN_COMPANION_ROOMS} dist cli python web)

# External headers, by how their name starts in <...>.
set(ATTN_EXTERNAL_hwy "hwy/")
set(ATTN_EXTERNAL_json "nlohmann/")
set(ATTN_EXTERNAL_stb "stb_")

# The include roots of the library's rooms (and of the tests and benchmarks of
# its internals), as the compiler searches them after the including file's
# own folder: public headers, internal ones by room ("kernels/linear.hpp"),
# and core's plan header ("attention_problem.hpp"). Users, the Python module
# and the fuzzers see include/ only.
set(ATTN_INCLUDE_ROOTS include src src/core)
# The companion's: the library's public headers, its own ("companion/
# picture.hpp") and its rooms' ("picture/colour_map.hpp").
set(ATTN_COMPANION_INCLUDE_ROOTS include companion/include companion)
