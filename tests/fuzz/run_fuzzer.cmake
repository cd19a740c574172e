# Runs one libFuzzer harness for SECONDS on a scratch copy of its seed corpus (so the
# tree is never written), under ctest. Fails on any finding: libFuzzer exits non-zero on
# a crash, a sanitizer report, a leak, a timeout (-timeout) or running out of memory
# (-rss_limit_mb); the reproducer is left in WORK (crash-*, leak-*, timeout-*, oom-*).
# -DFUZZER=exe -DCORPUS=dir -DWORK=dir -DSECONDS=n
foreach(v FUZZER CORPUS WORK SECONDS)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_fuzzer.cmake: -D${v}= is required")
  endif()
endforeach()
if(NOT EXISTS "${FUZZER}")
  message(FATAL_ERROR "${FUZZER} was not built")
endif()
file(GLOB seeds "${CORPUS}/*")
if(NOT seeds)
  message(FATAL_ERROR "no seed corpus in ${CORPUS}")
endif()
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/corpus")
file(COPY ${seeds} DESTINATION "${WORK}/corpus")
execute_process(COMMAND "${FUZZER}" -max_total_time=${SECONDS} -timeout=10 -rss_limit_mb=2048
                        -print_final_stats=1 -artifact_prefix=${WORK}/ "${WORK}/corpus"
                WORKING_DIRECTORY "${WORK}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(REGEX MATCHALL "stat::[a-z_]+: *[0-9]+" stats "${err}")
string(REPLACE ";" "\n" stats "${stats}")
message("${stats}")
if(NOT rc EQUAL 0)
  string(LENGTH "${err}" n)
  if(n GREATER 6000)
    math(EXPR from "${n} - 6000")
    string(SUBSTRING "${err}" ${from} 6000 err)
  endif()
  file(GLOB found "${WORK}/crash-*" "${WORK}/leak-*" "${WORK}/timeout-*" "${WORK}/oom-*")
  message(FATAL_ERROR "${FUZZER} found a problem (exit ${rc}); reproducer: ${found}\n"
          "rerun: ${FUZZER} ${found}\n...${err}")
endif()
