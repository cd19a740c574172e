# The GPU programs' output check: tests/cli_check.cmake (EXE, ARGS, EXIT, EXPECT and REJECT
# lists).
include("${CMAKE_CURRENT_LIST_DIR}/../cli_check.cmake")
