# Checks every #include of src/, include/, companion/, python/ and web/ under ROOT
# against the rooms' table (cmake/layers.cmake): a file may include its own
# room, the rooms its room may include (through their door, where they have
# one; through include/attn/ only, for a room on the public API only), and
# the C++ and system headers. Fails naming each file, include and rule.
#   cmake -DROOT=<source tree> -P cmake/check_layers.cmake
# The build runs it before compiling the library (target attn_layers_check);
# tests/layers_check.cmake shows that it refuses a kernel including io.
cmake_minimum_required(VERSION 3.25)
if(NOT ROOT)
  message(FATAL_ERROR "check_layers: pass -DROOT=<source tree>")
endif()
include(${ROOT}/cmake/layers.cmake)

# The room of a file (a path relative to ROOT), or "" when it has none: the
# library's and the programs' rooms are src/<room>/ and include/attn/, the
# companion's companion/<room>/ and companion/include/companion/.
set(attn_own_rooms ${ATTN_ROOMS})
list(REMOVE_ITEM attn_own_rooms ${ATTN_COMPANION_ROOMS})
function(room_of path out)
  set(room "")
  set(candidates ${attn_own_rooms})
  if(path MATCHES "^companion/")
    set(candidates ${ATTN_COMPANION_ROOMS})
  endif()
  if(path MATCHES "^(include/attn|companion/include/companion)/([^/]+)$")
    foreach(candidate IN LISTS candidates)
      if(CMAKE_MATCH_2 IN_LIST ATTN_PUBLIC_${candidate})
        set(room ${candidate})
      endif()
    endforeach()
  elseif(path MATCHES "^(src|companion)/([^/]+)/")
    if(CMAKE_MATCH_2 IN_LIST candidates)
      set(room ${CMAKE_MATCH_2})
    endif()
  elseif(path MATCHES "^(python|web)/")
    set(room ${CMAKE_MATCH_1})
  endif()
  set(${out} "${room}" PARENT_SCOPE)
endfunction()

# The file a quoted include names, searched as the compiler does: the
# including file's folder, then the include roots of its side (the
# library's and the companion's headers, or the companion's roots); "" when
# none has it. (Which of them a room may include is the table's to say.)
function(resolve including name out)
  get_filename_component(folder ${including} DIRECTORY)
  set(roots ${ATTN_INCLUDE_ROOTS} companion/include)
  if(including MATCHES "^companion/")
    set(roots ${ATTN_COMPANION_INCLUDE_ROOTS})
  endif()
  set(found "")
  foreach(dir IN ITEMS ${folder} ${roots})
    if(NOT found AND EXISTS ${ROOT}/${dir}/${name} AND NOT IS_DIRECTORY ${ROOT}/${dir}/${name})
      file(RELATIVE_PATH found ${ROOT} ${ROOT}/${dir}/${name})
    endif()
  endforeach()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

# Messages hold no ";", which would split them in this list.
set(problems "")

# The rooms form a DAG: ATTN_ROOMS lists them from the bottom up, and a room
# may include only rooms before it (so no two include each other).
set(below "")
foreach(room IN LISTS ATTN_ROOMS)
  foreach(to IN LISTS ATTN_MAY_INCLUDE_${room})
    if(to IN_LIST ATTN_ROOMS AND NOT to IN_LIST below)
      list(APPEND problems "cmake/layers.cmake: ${room} may include ${to}, which is not below it in ATTN_ROOMS (the rooms must form a DAG)")
    endif()
  endforeach()
  list(APPEND below ${room})
endforeach()
macro(refuse file line message_text)
  # The line number, for the message only (file(STRINGS) keeps none).
  file(READ ${ROOT}/${file} text)
  string(FIND "${text}" "${line}" at)
  string(SUBSTRING "${text}" 0 ${at} before)
  string(REGEX MATCHALL "\n" newlines "${before}")
  list(LENGTH newlines line_number)
  math(EXPR line_number "${line_number} + 1")
  string(STRIP "${line}" shown)
  list(APPEND problems "${file}:${line_number}: ${shown}: ${message_text}")
endmacro()

file(GLOB_RECURSE files RELATIVE ${ROOT}
     ${ROOT}/src/* ${ROOT}/include/* ${ROOT}/companion/* ${ROOT}/python/* ${ROOT}/web/*)
list(FILTER files INCLUDE REGEX "\\.(cc|hpp|h)$")
list(SORT files)
foreach(file IN LISTS files)
  room_of(${file} room)
  if(NOT room)
    string(REPLACE ";" ", " rooms "${ATTN_ROOMS}")
    list(APPEND problems "${file}: in no room, give it one in cmake/layers.cmake (rooms: ${rooms})")
    continue()
  endif()
  file(STRINGS ${ROOT}/${file} openings REGEX "^[ \t]*namespace attn::[a-z_]+")
  foreach(line IN LISTS openings)
    string(REGEX MATCH "namespace attn::([a-z_]+)" _ "${line}")
    if(CMAKE_MATCH_1 IN_LIST ATTN_NAMESPACE_ROOMS AND NOT CMAKE_MATCH_1 STREQUAL room)
      refuse(${file} "${line}" "only files of the ${CMAKE_MATCH_1} room open attn::${CMAKE_MATCH_1} (ATTN_NAMESPACE_ROOMS)")
    endif()
  endforeach()
  file(STRINGS ${ROOT}/${file} includes REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
  foreach(line IN LISTS includes)
    string(REGEX MATCH "include[ \t]*([<\"])([^>\"]+)[>\"]" _ "${line}")
    set(bracket "${CMAKE_MATCH_1}")
    set(name "${CMAKE_MATCH_2}")
    set(target_room "")
    set(target "")
    if(bracket STREQUAL "\"" OR name MATCHES "^attn/")
      resolve(${file} ${name} target)
      if(NOT target)
        refuse(${file} "${line}" "no such file in the tree (system headers take <...>)")
        continue()
      endif()
      room_of(${target} target_room)
      if(NOT target_room)
        continue()  # reported as a file in no room
      endif()
    else()
      foreach(external IN ITEMS hwy json stb)
        string(FIND "${name}" "${ATTN_EXTERNAL_${external}}" at)
        if(at EQUAL 0)
          set(target_room ${external})
        endif()
      endforeach()
      if(NOT target_room)
        continue()  # a C++ or system header, open to all
      endif()
    endif()
    if(target_room STREQUAL room)
      continue()
    endif()
    if(NOT target_room IN_LIST ATTN_MAY_INCLUDE_${room})
      string(REPLACE ";" ", " allowed "${ATTN_MAY_INCLUDE_${room}}")
      refuse(${file} "${line}"
             "${room} may not include ${target_room} (${room} may include: ${allowed})")
    elseif(room IN_LIST ATTN_PUBLIC_API_ONLY AND target_room IN_LIST ATTN_LIBRARY_ROOMS AND
           NOT target MATCHES "^include/attn/")
      refuse(${file} "${line}"
             "${room} is built on the library's public API only (include/attn/), not ${target_room}'s inside")
    elseif(DEFINED ATTN_DOOR_${target_room} AND NOT target IN_LIST ATTN_DOOR_${target_room})
      string(REPLACE ";" ", " door "${ATTN_DOOR_${target_room}}")
      refuse(${file} "${line}"
             "inside ${target_room}, not in its door (${door})")
    endif()
  endforeach()
endforeach()

if(problems)
  foreach(problem IN LISTS problems)
    message(NOTICE "${problem}")
  endforeach()
  list(LENGTH problems count)
  message(FATAL_ERROR "${count} problem(s) with the rooms' table in cmake/layers.cmake")
endif()
