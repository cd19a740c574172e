# mlagen_embed(OUTPUT out.c BASE dir FILES f1 f2 ...)
#
# Compiles files into a C table (see runtime/base/mg_embed.h) keyed by their path relative
# to BASE, e.g. "templates/explicit_fwd.cu.tpl". The table is regenerated whenever
# one of the files changes.
set(_MLAGEN_EMBED_SCRIPT "${CMAKE_CURRENT_LIST_DIR}/embed_files.cmake")
function(mlagen_embed)
  cmake_parse_arguments(E "" "OUTPUT;BASE" "FILES" ${ARGN})
  list(SORT E_FILES)
  string(REPLACE ";" "|" _files "${E_FILES}")
  add_custom_command(
    OUTPUT "${E_OUTPUT}"
    COMMAND ${CMAKE_COMMAND} "-DOUTPUT=${E_OUTPUT}" "-DBASE=${E_BASE}" "-DFILES=${_files}"
            -P "${_MLAGEN_EMBED_SCRIPT}"
    DEPENDS ${E_FILES} "${_MLAGEN_EMBED_SCRIPT}"
    COMMENT "Embedding ${E_BASE} resources"
    VERBATIM)
endfunction()
