# Per-target include roots, so the layering app -> kcp_core -> {kcp_kernels_*, kcp_reference} is
# enforced by the compiler, not by habit: every header is included by its path from the repository
# root ("core/kcp/kcp_engine.h"), but a target sees only the folders it owns plus those of the
# targets it links. kcp_include_root(<target> <PUBLIC|PRIVATE|INTERFACE> <folder>...) makes
# <build>/include_roots/<target>/<folder> a link to <source>/<folder> and adds that root to the
# target. kcp_core links no CPU twin, so `#include "kernels/cpu/..."` inside core/ fails to
# compile ("No such file or directory"); tests/layering/CMakeLists.txt checks exactly that.
function(kcp_include_root target scope)
  set(root "${PROJECT_BINARY_DIR}/include_roots/${target}")
  foreach(folder IN LISTS ARGN)
    get_filename_component(parent "${root}/${folder}" DIRECTORY)
    file(MAKE_DIRECTORY "${parent}")
    if(NOT EXISTS "${root}/${folder}")
      file(CREATE_LINK "${PROJECT_SOURCE_DIR}/${folder}" "${root}/${folder}" SYMBOLIC)
    endif()
  endforeach()
  target_include_directories(${target} ${scope} "${root}")
endfunction()
