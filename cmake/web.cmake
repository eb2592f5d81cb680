# The page (make web): web/'s bindings over the library's rooms that it
# calls and the companion's (colour maps, training), compiled to one
# WebAssembly module, with the page's files beside it in ATTN_WEB_OUTPUT.
set(ATTN_WEB_OUTPUT ${CMAKE_BINARY_DIR}/web CACHE PATH "Where the page goes")
set(attn_web_rooms core reference kernels api io layer picture train)
set(attn_web_objects)
foreach(room IN LISTS attn_web_rooms)
  list(APPEND attn_web_objects $<TARGET_OBJECTS:attn_${room}>)
endforeach()
add_executable(attn_web web/attn_web.cc ${attn_web_objects})
target_include_directories(attn_web PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/include ${CMAKE_CURRENT_SOURCE_DIR}/companion/include)
target_link_libraries(attn_web PRIVATE hwy::hwy nlohmann_json::nlohmann_json)
add_dependencies(attn_web attn_layers_check)
# embind for the bindings; a factory (createAttn) that the page and its
# worker each call; memory that grows with a long sentence's maps.
target_link_options(attn_web PRIVATE -fwasm-exceptions --bind -sMODULARIZE=1 -sEXPORT_NAME=createAttn
                    -sALLOW_MEMORY_GROWTH=1 -sENVIRONMENT=web,worker)
set_target_properties(attn_web PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${ATTN_WEB_OUTPUT})
# The page's own files, copied whenever one changes (make web builds both).
set(attn_web_pages index.html app.js worker.js style.css)
set(attn_web_copies)
foreach(page IN LISTS attn_web_pages)
  add_custom_command(OUTPUT ${ATTN_WEB_OUTPUT}/${page}
    COMMAND ${CMAKE_COMMAND} -E copy ${CMAKE_CURRENT_SOURCE_DIR}/web/${page} ${ATTN_WEB_OUTPUT}/${page}
    DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/web/${page})
  list(APPEND attn_web_copies ${ATTN_WEB_OUTPUT}/${page})
endforeach()
add_custom_target(attn_web_page DEPENDS ${attn_web_copies} attn_web)
