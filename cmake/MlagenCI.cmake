# mlagen_in_ci(<var>): sets <var> TRUE when this configure runs in CI, else FALSE.
#
# The one rule for "are we in CI" ($CI set, and not empty, "0" or "false", as CI services
# set it; .ci/run sets CI=true when it is unset), which the test-time checks share:
# tests/tool_missing.sh, tests/ci.h (the C tests), tests/python/common.py. In CI a check
# whose tool is missing fails instead of being skipped. tests/ci_rule.cmake (ctest
# ci_rule_agrees) holds this rule and tool_missing.sh's to the same verdicts.
function(mlagen_in_ci var)
  set(ci "$ENV{CI}")
  if(ci STREQUAL "" OR ci STREQUAL "0" OR ci STREQUAL "false")
    set(${var} FALSE PARENT_SCOPE)
  else()
    set(${var} TRUE PARENT_SCOPE)
  endif()
endfunction()
