# Writes OUT (a header with KCP_GIT_SHA and KCP_GIT_DIRTY) from the source tree SRC. Run at every
# build (the kcp_git_info target), not at configure time, so a binary reports the commit it was
# built from; the header is only touched when its text changes, so an unchanged commit rebuilds
# nothing. Dirty: tracked files differ from HEAD at build time.
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${SRC}
                OUTPUT_VARIABLE sha OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT sha)
  set(sha "unknown")
endif()
execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY ${SRC}
                OUTPUT_VARIABLE status OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
set(dirty 0)
if(status)
  set(dirty 1)
endif()
set(text "// Generated at build time by cmake/GitInfo.cmake.\n#pragma once\n#define KCP_GIT_SHA \"${sha}\"\n#define KCP_GIT_DIRTY ${dirty}\n")
set(old "")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT old STREQUAL text)
  file(WRITE ${OUT} "${text}")
endif()
