# Finds LibTorch: Debian's (libtorch-dev) by default, or the one inside a pip PyTorch when
# CMAKE_PREFIX_PATH (or Torch_DIR) names its torch.utils.cmake_prefix_path.
#
# PyTorch's TorchConfig.cmake looks for some of its own libraries with find_library(... PATHS
# <prefix>/lib), and find_library searches the system folders before PATHS: on a machine that also
# has Debian's libtorch-dev, a PyTorch 2.x build would link Debian's libc10.so beside PyTorch's
# libtorch_cpu.so. Here those libraries are pinned to the package's own lib/ folder.
find_package(Torch REQUIRED)

set(remat_torch_own_libraries c10_LIBRARY=c10 TORCH_LIBRARY=torch kineto_LIBRARY=kineto)
foreach(entry IN LISTS remat_torch_own_libraries)
  string(REPLACE "=" ";" entry "${entry}")
  list(GET entry 0 variable)
  list(GET entry 1 name)
  set(own "${TORCH_INSTALL_PREFIX}/lib/${CMAKE_SHARED_LIBRARY_PREFIX}${name}${CMAKE_SHARED_LIBRARY_SUFFIX}")
  if(NOT ${variable} OR "${${variable}}" STREQUAL "${own}" OR NOT EXISTS "${own}")
    continue()
  endif()
  message(STATUS "LibTorch: ${variable} was ${${variable}}, outside ${TORCH_INSTALL_PREFIX}; using ${own}")
  set(fixed "")
  foreach(library IN LISTS TORCH_LIBRARIES)
    if("${library}" STREQUAL "${${variable}}")
      list(APPEND fixed "${own}")
    else()
      list(APPEND fixed "${library}")
    endif()
  endforeach()
  set(TORCH_LIBRARIES "${fixed}")
  set(${variable} "${own}" CACHE FILEPATH "LibTorch's ${name} library (pinned to the package's own)" FORCE)
endforeach()

# Every TORCH_LIBRARIES entry that is a file must come from the package found.
foreach(library IN LISTS TORCH_LIBRARIES)
  if(IS_ABSOLUTE "${library}" AND "${library}" MATCHES "(torch|c10)[^/]*\\.so$")
    string(FIND "${library}" "${TORCH_INSTALL_PREFIX}/" at)
    if(NOT at EQUAL 0)
      message(FATAL_ERROR "LibTorch library ${library} is not from the LibTorch found at ${TORCH_INSTALL_PREFIX}")
    endif()
  endif()
endforeach()
message(STATUS "LibTorch ${Torch_VERSION} at ${TORCH_INSTALL_PREFIX}")
