# INTERFACE target carrying the project's warning flags, forwarded to nvcc host compilation.
add_library(kcp_warnings INTERFACE)
set(_kcp_cxx_warn -Wall -Wextra -Wno-unused-parameter)
if(KCP_WERROR)
  list(APPEND _kcp_cxx_warn -Werror)
endif()
target_compile_options(kcp_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:${_kcp_cxx_warn}>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wno-unused-parameter>)
