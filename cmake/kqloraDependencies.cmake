# Finds kqlora's dependencies; included by the project and by the installed
# kqloraConfig.cmake, so a consumer gets the same targets.
#
# Kokkos: 3.4 (Debian 12's Trilinos build) or newer. Debian's KokkosConfig.cmake points
# Kokkos::kokkos at <prefix>/lib/<arch>/include, which does not exist; the fix-up below is
# the only place that knows about it. Remove it when the floor moves past Debian 12.
# Kokkos Kernels: the target is Kokkos::kokkoskernels (4.x) or trilinos_kokkoskernels
# (Trilinos); kqlora::kokkoskernels names whichever this install has.

include(CMakeFindDependencyMacro)

macro(kqlora_find_package name)
  if(kqlora_FINDING_AS_DEPENDENCY)
    find_dependency(${name} ${ARGN})
  else()
    find_package(${name} ${ARGN} REQUIRED)
  endif()
endmacro()

kqlora_find_package(Kokkos 3.4)

if(TARGET Kokkos::kokkos)
  get_target_property(_kqlora_kokkos_inc Kokkos::kokkos INTERFACE_INCLUDE_DIRECTORIES)
  set(_kqlora_kokkos_inc_ok TRUE)
  foreach(_dir IN LISTS _kqlora_kokkos_inc)
    if(NOT _dir MATCHES "^\\$<" AND NOT IS_DIRECTORY "${_dir}")
      set(_kqlora_kokkos_inc_ok FALSE)
    endif()
  endforeach()
  if(NOT _kqlora_kokkos_inc_ok)
    if(NOT Kokkos_INCLUDE_DIRS OR NOT EXISTS "${Kokkos_INCLUDE_DIRS}/Kokkos_Core.hpp")
      message(FATAL_ERROR "Kokkos::kokkos names a missing include directory "
                          "(${_kqlora_kokkos_inc}) and Kokkos_INCLUDE_DIRS has no Kokkos_Core.hpp")
    endif()
    set_target_properties(Kokkos::kokkos PROPERTIES INTERFACE_INCLUDE_DIRECTORIES
                                                    "${Kokkos_INCLUDE_DIRS}")
  endif()
endif()

kqlora_find_package(KokkosKernels)
if(NOT TARGET kqlora::kokkoskernels)
  add_library(kqlora::kokkoskernels INTERFACE IMPORTED)
  if(TARGET Kokkos::kokkoskernels)
    set_target_properties(kqlora::kokkoskernels PROPERTIES INTERFACE_LINK_LIBRARIES
                                                           Kokkos::kokkoskernels)
  elseif(TARGET trilinos_kokkoskernels)
    set_target_properties(kqlora::kokkoskernels PROPERTIES
      INTERFACE_LINK_LIBRARIES "trilinos_kokkoskernels;Kokkos::kokkos"
      INTERFACE_INCLUDE_DIRECTORIES "${KokkosKernels_INCLUDE_DIRS}")
  else()
    message(FATAL_ERROR "Kokkos Kernels found, but neither Kokkos::kokkoskernels nor "
                        "trilinos_kokkoskernels is defined")
  endif()
endif()

if(KQLORA_ENABLE_MPI)
  kqlora_find_package(MPI COMPONENTS CXX)
endif()

# NCCL: on by default when Kokkos has CUDA (the backend for device memory); can be forced
# on to build the backend without Kokkos CUDA (it is host code over the CUDA runtime).
if(NOT DEFINED KQLORA_ENABLE_NCCL)
  set(KQLORA_ENABLE_NCCL ${Kokkos_ENABLE_CUDA})
endif()
set(KQLORA_ENABLE_NCCL ${KQLORA_ENABLE_NCCL} CACHE BOOL "Build the NCCL communicator")
if(KQLORA_ENABLE_NCCL)
  if(NOT KQLORA_ENABLE_MPI)
    message(STATUS "NCCL without MPI: a world of one (the bootstrap across ranks needs MPI)")
  endif()
  kqlora_find_package(CUDAToolkit)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${NCCL_ROOT} ENV NCCL_ROOT ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include)
  find_library(NCCL_LIBRARY nccl HINTS ${NCCL_ROOT} ENV NCCL_ROOT ${CUDAToolkit_LIBRARY_DIR}
               ${CUDAToolkit_LIBRARY_DIR}/.. PATH_SUFFIXES lib lib64)
  if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
    message(FATAL_ERROR "KQLORA_ENABLE_NCCL: nccl.h or libnccl not found (set NCCL_ROOT)")
  endif()
  message(STATUS "NCCL: ${NCCL_LIBRARY}")
endif()

# oneDNN: the host GEMM engine where it is installed (docs/BLAS.md, "The GEMM engine"; on
# Debian libdnnl-dev). ON requires it, OFF leaves the BLAS as the only engine, AUTO (the
# default) uses it when found.
set(KQLORA_ENABLE_ONEDNN AUTO CACHE STRING "Use oneDNN as the host GEMM engine (AUTO, ON, OFF)")
set(KQLORA_HAVE_ONEDNN 0)
if(NOT KQLORA_ENABLE_ONEDNN STREQUAL "OFF")
  find_path(ONEDNN_INCLUDE_DIR oneapi/dnnl/dnnl.h HINTS ${DNNL_ROOT} ENV DNNL_ROOT
            PATH_SUFFIXES include)
  find_library(ONEDNN_LIBRARY dnnl HINTS ${DNNL_ROOT} ENV DNNL_ROOT PATH_SUFFIXES lib lib64)
  if(ONEDNN_INCLUDE_DIR AND ONEDNN_LIBRARY)
    set(KQLORA_HAVE_ONEDNN 1)
    message(STATUS "oneDNN: ${ONEDNN_LIBRARY}")
  elseif(KQLORA_ENABLE_ONEDNN)
    message(FATAL_ERROR "KQLORA_ENABLE_ONEDNN=ON: oneapi/dnnl/dnnl.h or libdnnl not found "
                        "(Debian: apt-get install libdnnl-dev; elsewhere set DNNL_ROOT)")
  else()
    message(STATUS "oneDNN: not found; host products through the BLAS only")
  endif()
endif()

if(KQLORA_ENABLE_HDF5)
  # FindHDF5 probes HDF5's C compiler wrapper, which needs the C language enabled.
  get_property(_kqlora_langs GLOBAL PROPERTY ENABLED_LANGUAGES)
  if(NOT "C" IN_LIST _kqlora_langs)
    enable_language(C)
  endif()
  set(HDF5_PREFER_PARALLEL TRUE)
  kqlora_find_package(HDF5 COMPONENTS C)
  if(NOT HDF5_IS_PARALLEL)
    message(FATAL_ERROR
      "kqlora needs a parallel HDF5 (built with MPI), but the HDF5 found (${HDF5_C_INCLUDE_DIRS}) "
      "is serial. On Debian: apt-get install libhdf5-openmpi-dev; elsewhere point HDF5_ROOT at "
      "an MPI build, or configure with -DKQLORA_ENABLE_HDF5=OFF.")
  endif()
  if(NOT KQLORA_ENABLE_MPI)
    message(FATAL_ERROR "KQLORA_ENABLE_HDF5 needs KQLORA_ENABLE_MPI (parallel HDF5)")
  endif()
endif()
