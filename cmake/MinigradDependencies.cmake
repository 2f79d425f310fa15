# Finds minigrad's dependencies and says in one line each what was found and where.

find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(ZLIB REQUIRED)
# Header-only; parses and writes the JSON header of safetensors checkpoints (nn/serialize.cpp).
find_package(nlohmann_json 3.2 REQUIRED)
message(STATUS "minigrad: nlohmann_json ${nlohmann_json_VERSION}")

set(MINIGRAD_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wno-unused-parameter)

# ---- OpenBLAS through CBLAS (the CPU matmul) ----
find_path(MINIGRAD_CBLAS_INCLUDE_DIR NAMES cblas.h
          PATH_SUFFIXES openblas x86_64-linux-gnu aarch64-linux-gnu)
find_library(MINIGRAD_OPENBLAS_LIBRARY NAMES openblas)
if(NOT MINIGRAD_CBLAS_INCLUDE_DIR OR NOT MINIGRAD_OPENBLAS_LIBRARY)
  message(FATAL_ERROR "minigrad: OpenBLAS (cblas.h, libopenblas) not found; "
                      "on Debian: apt-get install libopenblas-dev")
endif()
add_library(minigrad_blas INTERFACE)
target_include_directories(minigrad_blas INTERFACE ${MINIGRAD_CBLAS_INCLUDE_DIR})
target_link_libraries(minigrad_blas INTERFACE ${MINIGRAD_OPENBLAS_LIBRARY})
message(STATUS "minigrad: OpenBLAS: ${MINIGRAD_OPENBLAS_LIBRARY} (cblas.h in ${MINIGRAD_CBLAS_INCLUDE_DIR})")

# ---- CUDA ----
set(MINIGRAD_WITH_CUDA OFF)
if(NOT MINIGRAD_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER)
    # nvcc is often not on PATH in a plain shell; look where the toolkit installs.
    find_program(MINIGRAD_NVCC nvcc HINTS ENV CUDA_HOME ENV CUDA_PATH
                 PATHS /usr/local/cuda/bin PATH_SUFFIXES bin)
    if(MINIGRAD_NVCC)
      set(CMAKE_CUDA_COMPILER ${MINIGRAD_NVCC})
    endif()
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # Hopper by default (the GPU machine); override with -DCMAKE_CUDA_ARCHITECTURES=.
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(MINIGRAD_WITH_CUDA ON)
    message(STATUS "minigrad: CUDA: found nvcc ${CMAKE_CUDA_COMPILER_VERSION} at ${CMAKE_CUDA_COMPILER} "
                   "(architectures ${CMAKE_CUDA_ARCHITECTURES}); building the CUDA backend")
  elseif(MINIGRAD_CUDA STREQUAL "ON")
    message(FATAL_ERROR "minigrad: MINIGRAD_CUDA=ON but nvcc was not found (set CUDA_HOME or CMAKE_CUDA_COMPILER)")
  else()
    message(STATUS "minigrad: CUDA: nvcc not found, building without the CUDA backend")
  endif()
else()
  message(STATUS "minigrad: CUDA: off (MINIGRAD_CUDA=OFF)")
endif()

# ---- NCCL: under the CUDA toolkit, or in the system paths ----
set(MINIGRAD_WITH_NCCL OFF)
if(MINIGRAD_WITH_CUDA AND NOT MINIGRAD_NCCL STREQUAL "OFF")
  find_path(MINIGRAD_NCCL_INCLUDE_DIR NAMES nccl.h
            HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME PATH_SUFFIXES include)
  find_library(MINIGRAD_NCCL_LIBRARY NAMES nccl
               HINTS ${CUDAToolkit_LIBRARY_DIR} ENV NCCL_HOME PATH_SUFFIXES lib lib64)
  if(MINIGRAD_NCCL_INCLUDE_DIR AND MINIGRAD_NCCL_LIBRARY)
    add_library(minigrad_nccl INTERFACE)
    target_include_directories(minigrad_nccl INTERFACE ${MINIGRAD_NCCL_INCLUDE_DIR})
    target_link_libraries(minigrad_nccl INTERFACE ${MINIGRAD_NCCL_LIBRARY})
    set(MINIGRAD_WITH_NCCL ON)
    message(STATUS "minigrad: NCCL: ${MINIGRAD_NCCL_LIBRARY} (nccl.h in ${MINIGRAD_NCCL_INCLUDE_DIR})")
  elseif(MINIGRAD_NCCL STREQUAL "ON")
    message(FATAL_ERROR "minigrad: MINIGRAD_NCCL=ON but nccl.h/libnccl were not found (set NCCL_HOME)")
  else()
    message(STATUS "minigrad: NCCL: not found, multi-GPU collectives use host copies")
  endif()
elseif(NOT MINIGRAD_WITH_CUDA)
  message(STATUS "minigrad: NCCL: skipped (no CUDA backend)")
else()
  message(STATUS "minigrad: NCCL: off (MINIGRAD_NCCL=OFF)")
endif()

# ---- Gloo (CPU process groups for DistributedDataParallel) ----
set(MINIGRAD_WITH_GLOO OFF)
if(NOT MINIGRAD_GLOO STREQUAL "OFF")
  find_path(MINIGRAD_GLOO_INCLUDE_DIR NAMES gloo/allreduce.h)
  find_library(MINIGRAD_GLOO_LIBRARY NAMES gloo)
  if(MINIGRAD_GLOO_INCLUDE_DIR AND MINIGRAD_GLOO_LIBRARY)
    add_library(minigrad_gloo INTERFACE)
    target_include_directories(minigrad_gloo INTERFACE ${MINIGRAD_GLOO_INCLUDE_DIR})
    target_link_libraries(minigrad_gloo INTERFACE ${MINIGRAD_GLOO_LIBRARY})
    set(MINIGRAD_WITH_GLOO ON)
    message(STATUS "minigrad: Gloo: ${MINIGRAD_GLOO_LIBRARY}")
  elseif(MINIGRAD_GLOO STREQUAL "ON")
    message(FATAL_ERROR "minigrad: MINIGRAD_GLOO=ON but Gloo was not found (apt-get install libgloo-dev)")
  else()
    message(STATUS "minigrad: Gloo: not found, CPU process groups unavailable")
  endif()
endif()
