# The kernels compile at -O3 in every optimised build (CMakeLists.txt): a
# RelWithDebInfo build, with -O2 in CMAKE_CXX_FLAGS as Debian's flags bring
# it, compiles each kernel with -O3 as its last level and the rest of the
# library at -O2; a Debug build compiles them without optimisation.
#   cmake -DSOURCE=<source tree> -DWORK=<scratch folder> -P tests/kernels_optimised.cmake
cmake_minimum_required(VERSION 3.25)

# The last -O flag of `source`'s compile command in `build`'s compile_commands.json.
function(last_level build source out)
  file(READ ${build}/compile_commands.json commands)
  string(JSON count LENGTH "${commands}")
  math(EXPR last "${count} - 1")
  foreach(i RANGE ${last})
    string(JSON file GET "${commands}" ${i} file)
    if(file STREQUAL "${SOURCE}/${source}")
      string(JSON command GET "${commands}" ${i} command)
      string(REGEX MATCHALL "(^| )-O[0-9sgz]?( |$)" levels "${command}")
      list(POP_BACK levels level)
      string(STRIP "${level}" level)
      set(${out} "${level}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  message(FATAL_ERROR "${source} is not among ${build}'s compile commands")
endfunction()

function(configure build type flags)
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE} -B ${build} -DCMAKE_BUILD_TYPE=${type}
                          "-DCMAKE_CXX_FLAGS=${flags}" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DATTN_BUILD_TESTS=OFF
                  RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "configuring a ${type} build failed:\n${output}")
  endif()
endfunction()

function(expect build source expected)
  last_level(${build} ${source} level)
  if(NOT level STREQUAL expected)
    message(FATAL_ERROR "${source} compiles with ${level} as its last level in ${build}, not ${expected}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK})
configure(${WORK}/relwithdebinfo RelWithDebInfo "-O2 -g")
foreach(kernel prefill decode sparse linear)
  expect(${WORK}/relwithdebinfo src/kernels/${kernel}.cc -O3)
endforeach()
expect(${WORK}/relwithdebinfo src/core/tensor.cc -O2)
configure(${WORK}/debug Debug "")
last_level(${WORK}/debug src/kernels/prefill.cc level)
if(level STREQUAL "-O3")
  message(FATAL_ERROR "a Debug build compiles the kernels at -O3")
endif()
file(REMOVE_RECURSE ${WORK})
