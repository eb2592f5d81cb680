# The rooms' check refuses what it should: on a copy of the tree, it passes
# as the tree is, and fails once a kernel includes "attn/io.hpp", or the
# companion reaches inside the library, naming the file, the include and the
# rule of cmake/layers.cmake.
#   cmake -DSOURCE=<source tree> -DWORK=<scratch folder> -P tests/layers_check.cmake
cmake_minimum_required(VERSION 3.25)
set(tree ${WORK}/tree)
file(REMOVE_RECURSE ${tree})
file(MAKE_DIRECTORY ${tree})
file(COPY ${SOURCE}/src ${SOURCE}/include ${SOURCE}/companion ${SOURCE}/python ${SOURCE}/cmake DESTINATION ${tree})

function(check expect_failure expected_output)
  execute_process(COMMAND ${CMAKE_COMMAND} -DROOT=${tree} -P ${tree}/cmake/check_layers.cmake
                  RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if(expect_failure AND status EQUAL 0)
    message(FATAL_ERROR "the check passed what it should refuse:\n${output}")
  elseif(NOT expect_failure AND NOT status EQUAL 0)
    message(FATAL_ERROR "the check refused the tree as it is:\n${output}")
  endif()
  string(FIND "${output}" "${expected_output}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "expected \"${expected_output}\" in the check's output:\n${output}")
  endif()
endfunction()

check(FALSE "")
file(WRITE ${tree}/src/kernels/includes_io.cc "// A kernel reaching for a file format.\n#include \"attn/io.hpp\"\n")
check(TRUE "src/kernels/includes_io.cc:2: #include \"attn/io.hpp\": kernels may not include io (kernels may include: core, reference, hwy)")
file(REMOVE ${tree}/src/kernels/includes_io.cc)
file(WRITE ${tree}/companion/train/includes_core.cc "// The companion reaching past the public API.\n#include \"core/attention_problem.hpp\"\n")
check(TRUE "companion/train/includes_core.cc:2: #include \"core/attention_problem.hpp\": no such file in the tree")
file(WRITE ${tree}/companion/train/includes_core.cc "// The companion reaching past the public API.\n#include \"../../src/core/attention_problem.hpp\"\n")
check(TRUE "train is built on the library's public API only (include/attn/), not core's inside")
file(REMOVE ${tree}/companion/train/includes_core.cc)
file(WRITE ${tree}/src/api/opens_kernels.cc "// A room adding to another's namespace.\nnamespace attn::kernels {}\n")
check(TRUE "src/api/opens_kernels.cc:2: namespace attn::kernels {}: only files of the kernels room open attn::kernels")
file(REMOVE ${tree}/src/api/opens_kernels.cc)
file(WRITE ${tree}/src/cli/includes_kernels.cc "// A program reaching inside the library.\n#include \"kernels/attention_kernel.hpp\"\n")
check(TRUE "cli may not include kernels")
file(REMOVE_RECURSE ${tree})
