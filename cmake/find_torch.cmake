# Finds LibTorch: Debian's (libtorch-dev) by default, or the one inside a pip PyTorch when
# CMAKE_PREFIX_PATH (or Torch_DIR) names its torch.utils.cmake_prefix_path.
#
# PyTorch's TorchConfig.cmake looks for some of its own libraries with find_library(... PATHS
# <prefix>/lib), and find_library searches the system folders before PATHS: on a machine that also
# has Debian's libtorch-dev, a PyTorch 2.x build would link Debian's libc10.so beside PyTorch's
# libtorch_cpu.so. Here those libraries are pinned to the package's own lib/ folder.
# TorchConfig.cmake finds its Caffe2 package with PATHS, which also come after the system folders:
# with Torch_DIR naming a PyTorch (as an installed remat's config does), Debian's Caffe2 targets
# would be imported. Point Caffe2_DIR at the one beside it.
if(Torch_DIR AND NOT Caffe2_DIR AND EXISTS "${Torch_DIR}/../Caffe2/Caffe2Config.cmake")
  get_filename_component(remat_caffe2_dir "${Torch_DIR}/../Caffe2" ABSOLUTE)
  set(Caffe2_DIR "${remat_caffe2_dir}" CACHE PATH "The Caffe2 package beside Torch_DIR")
endif()
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

# Every TORCH_LIBRARIES entry that is a file, and the torch target, must come from the package found.
set(remat_torch_files ${TORCH_LIBRARIES})
foreach(config RELEASE NONE NOCONFIG)
  get_target_property(location torch IMPORTED_LOCATION_${config})
  if(location)
    list(APPEND remat_torch_files "${location}")
  endif()
endforeach()
foreach(library IN LISTS remat_torch_files)
  if(IS_ABSOLUTE "${library}" AND "${library}" MATCHES "(torch|c10)[^/]*\\.so[.0-9]*$")
    string(FIND "${library}" "${TORCH_INSTALL_PREFIX}/" at)
    if(NOT at EQUAL 0)
      message(FATAL_ERROR "LibTorch library ${library} is not from the LibTorch found at ${TORCH_INSTALL_PREFIX}")
    endif()
  endif()
endforeach()
message(STATUS "LibTorch ${Torch_VERSION} at ${TORCH_INSTALL_PREFIX}")
