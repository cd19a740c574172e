# run.cmake: install mlagen into a staging prefix, build tests/consumer/ against it with
# find_package(mlagen), run it. cmake -DBUILD=<mlagen build dir> -DWORK=<scratch dir>
#   -DSRC=<tests/consumer> -DCC=<C compiler> -P run.cmake
foreach(v BUILD WORK SRC)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run.cmake: -D${v}=... is required")
  endif()
endforeach()
set(stage "${WORK}/stage")
set(out "${WORK}/build")
file(REMOVE_RECURSE "${stage}" "${out}")

function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${o}\n${e}")
  endif()
  set(step_out "${o}" PARENT_SCOPE)
endfunction()

step("cmake --install" "${CMAKE_COMMAND}" --install "${BUILD}" --prefix "${stage}")
foreach(f include/mlagen.h lib/cmake/mlagen/mlagenConfig.cmake
          lib/cmake/mlagen/mlagenConfigVersion.cmake lib/cmake/mlagen/mlagenTargets.cmake
          share/mlagen/tuned/sm_90a/NVIDIA_H200.json share/mlagen/tuned/README.md)
  if(NOT EXISTS "${stage}/${f}")
    message(FATAL_ERROR "the install has no ${f}")
  endif()
endforeach()
file(GLOB libs "${stage}/lib/libmlagen.so*")
if(NOT libs)
  message(FATAL_ERROR "the install has no lib/libmlagen.so")
endif()
set(cc "")
if(CC)
  set(cc "-DCMAKE_C_COMPILER=${CC}")
endif()
step("configuring the consumer" "${CMAKE_COMMAND}" -S "${SRC}" -B "${out}"
     "-DCMAKE_PREFIX_PATH=${stage}" ${cc})
step("building the consumer" "${CMAKE_COMMAND}" --build "${out}")
step("running the consumer" "${out}/consumer")
message(STATUS "${step_out}")
if(NOT step_out MATCHES "consumer: linked mlagen 0\\.1\\.0")
  message(FATAL_ERROR "unexpected consumer output: ${step_out}")
endif()
