# INTERFACE target carrying the project's warning flags, forwarded to nvcc host compilation.
add_library(kcp_warnings INTERFACE)
# -Wconversion and -Wshadow too: the host code builds clean with them (checked on every target);
# nvcc's host pass keeps -Wall -Wextra only (its generated stubs are not ours to fix).
set(_kcp_cxx_warn -Wall -Wextra -Wconversion -Wshadow -Wno-unused-parameter)
if(KCP_WERROR)
  list(APPEND _kcp_cxx_warn -Werror)
endif()
target_compile_options(kcp_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:${_kcp_cxx_warn}>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wno-unused-parameter>)
