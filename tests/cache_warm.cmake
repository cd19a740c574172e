# `mlagen compile` warms the executor's JIT cache: compiles the kernels of MODEL for ARCH
# (FLAGS: more compile options, a ;-list) into an empty cache DIR (MLAGEN_CACHE_DIR), then runs RUN (a ;-list: a CUDA-executor pass
# of the same shape on a device of ARCH, here the fake driver's sm_90a) with the same
# cache: it must add no entry (each kernel it prepares was a cache hit), and the compile
# must have written some (else the check could not fail).
file(REMOVE_RECURSE "${DIR}")
set(ENV{MLAGEN_CACHE_DIR} "${DIR}")
execute_process(COMMAND ${EXE} compile --model ${MODEL} --arch ${ARCH} ${FLAGS}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "mlagen compile: exit ${rc}\n${out}${err}")
endif()
file(GLOB_RECURSE before "${DIR}/*")
list(LENGTH before n0)
if(n0 EQUAL 0)
  message(FATAL_ERROR "mlagen compile wrote nothing into ${DIR}\n${out}${err}")
endif()
execute_process(COMMAND ${RUN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${RUN}: exit ${rc}\n${out}${err}")
endif()
file(GLOB_RECURSE after "${DIR}/*")
list(LENGTH after n1)
if(NOT n1 EQUAL n0)
  list(REMOVE_ITEM after ${before})
  message(FATAL_ERROR "the executor compiled ${n1} - ${n0} kernels `mlagen compile` had not "
                      "(new cache entries: ${after})")
endif()
message(STATUS "${n0} cache entries from mlagen compile; the executor's pass added none")
