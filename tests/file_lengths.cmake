# No source file of the library, its companion, its headers, the Python package or the
# web page is longer than 600 lines: a file that grows past it holds more than one idea
# and is split by idea (issue 47). Lists every file over the limit.
#   cmake -DSOURCE=<source tree> -P tests/file_lengths.cmake
cmake_minimum_required(VERSION 3.25)
set(limit 600)
file(GLOB_RECURSE files LIST_DIRECTORIES false
     ${SOURCE}/src/*.cc ${SOURCE}/src/*.h ${SOURCE}/src/*.hpp
     ${SOURCE}/include/*.h ${SOURCE}/include/*.hpp
     ${SOURCE}/companion/*.cc ${SOURCE}/companion/*.h ${SOURCE}/companion/*.hpp
     ${SOURCE}/python/*.cc ${SOURCE}/python/*.hpp ${SOURCE}/python/*.py
     ${SOURCE}/web/*.cc ${SOURCE}/web/*.js ${SOURCE}/web/*.html)
set(long "")
foreach(f IN LISTS files)
  # Lines counted by their newlines (file(STRINGS) would skip the empty ones).
  file(READ ${f} text)
  string(REGEX MATCHALL "\n" newlines "${text}")
  list(LENGTH newlines n)
  if(n GREATER limit)
    file(RELATIVE_PATH name ${SOURCE} ${f})
    list(APPEND long "${name}: ${n} lines")
  endif()
endforeach()
list(LENGTH files count)
if(long)
  list(JOIN long "\n  " shown)
  message(FATAL_ERROR "files over ${limit} lines (split them by idea):\n  ${shown}")
endif()
message(STATUS "${count} files, none over ${limit} lines")
