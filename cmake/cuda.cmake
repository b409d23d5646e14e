# The GPU build (DDILOCO_CUDA=ON): kernels/*.cu and src/gpu/ into the static library
# ddiloco_cuda, linked with cudart, cuBLAS, cuBLASLt, NCCL and (optional) cuDNN 9; tests/gpu/ into
# ddiloco_gpu_tests (label "gpu"). Included from the top-level CMakeLists.txt after ddiloco_core.
#
# Knobs:
#   CMAKE_CUDA_ARCHITECTURES  default 90 (Hopper: H100/H200); e.g. -DCMAKE_CUDA_ARCHITECTURES=80
#   CMAKE_CUDA_COMPILER       default: whatever CMake finds (the preset names /usr/local/cuda)
#   NCCL_ROOT                 where NCCL lives when it is not inside the CUDA toolkit
#   CUDNN_ROOT                where cuDNN 9 lives when it is not inside the CUDA toolkit
#   DDILOCO_CUDNN             OFF: leave the cuDNN attention path out even where cuDNN is found

# Must be set before the language is enabled, or CMake probes the compiler's default arch
# (and CUDA 13 dropped the old defaults CMake 3.25 would otherwise pick).
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
  set(CMAKE_CUDA_ARCHITECTURES 90 CACHE STRING "CUDA SM architectures to compile for")
endif()
enable_language(CUDA)
# C++20 in device code too (the headers we share with the host use it). CMake < 3.26 does not
# know nvcc's C++20 flag (and CUDA targets inherit CXX_STANDARD 20), so tell it.
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_EXTENSIONS OFF)
# CMake 3.25.1 (Debian 12's) sets a property on CUDA::nvToolsExt even where that library does
# not exist, as in CUDA 13, and fails ("set_property could not find TARGET CUDA::nvToolsExt";
# later CMake checks first). An empty target for it to set the property on; nothing links it.
if(CMAKE_VERSION VERSION_LESS 3.26 AND NOT TARGET CUDA::nvToolsExt)
  add_library(CUDA::nvToolsExt INTERFACE IMPORTED)
endif()
find_package(CUDAToolkit REQUIRED)
message(STATUS "CUDA toolkit ${CUDAToolkit_VERSION} at ${CUDAToolkit_BIN_DIR}; "
               "architectures ${CMAKE_CUDA_ARCHITECTURES}")

# ---------------------------------------------------------------- NCCL (imported target)
# NCCL ships no CMake package; look under NCCL_ROOT first, then inside the CUDA toolkit (where
# the pip/NGC layouts and our machines put it), then the system paths.
set(NCCL_ROOT "$ENV{NCCL_ROOT}" CACHE PATH "NCCL install prefix (optional)")
find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS "${NCCL_ROOT}/include" ${CUDAToolkit_INCLUDE_DIRS} "${CUDAToolkit_LIBRARY_ROOT}/include")
find_library(NCCL_LIBRARY nccl
  HINTS "${NCCL_ROOT}/lib" "${NCCL_ROOT}/lib64" "${CUDAToolkit_LIBRARY_DIR}"
        "${CUDAToolkit_LIBRARY_ROOT}/lib64")
if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
  message(FATAL_ERROR "DDILOCO_CUDA=ON needs NCCL: nccl.h / libnccl not found under NCCL_ROOT "
                      "('${NCCL_ROOT}') or the CUDA toolkit (${CUDAToolkit_LIBRARY_DIR}); "
                      "set -DNCCL_ROOT=<prefix>")
endif()
message(STATUS "NCCL: ${NCCL_LIBRARY} (headers ${NCCL_INCLUDE_DIR})")
add_library(NCCL::nccl SHARED IMPORTED)
set_target_properties(NCCL::nccl PROPERTIES
  IMPORTED_LOCATION "${NCCL_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")

# ---------------------------------------------------------------- cuDNN 9 (optional)
# cuDNN's fused flash attention (run.gpu_attention: cudnn, src/gpu/cudnn_attention.cpp) through
# its backend graph API (cudnn_graph.h): no cudnn_frontend needed. Looked for under CUDNN_ROOT,
# then inside the CUDA toolkit (where our machines and NVIDIA's images put it), then the
# system paths. Without it, or with DDILOCO_CUDNN=OFF, the cudnn attention path is not built
# and asking for it is a configuration error; our own kernels run either way.
option(DDILOCO_CUDNN "Build run.gpu_attention: cudnn when cuDNN 9 is found" ON)
set(CUDNN_ROOT "$ENV{CUDNN_ROOT}" CACHE PATH "cuDNN install prefix (optional)")
set(DDILOCO_HAVE_CUDNN OFF)
if(DDILOCO_CUDNN)
  find_path(CUDNN_INCLUDE_DIR cudnn_graph.h
    HINTS "${CUDNN_ROOT}/include" ${CUDAToolkit_INCLUDE_DIRS} "${CUDAToolkit_LIBRARY_ROOT}/include")
  find_library(CUDNN_LIBRARY cudnn
    HINTS "${CUDNN_ROOT}/lib" "${CUDNN_ROOT}/lib64" "${CUDAToolkit_LIBRARY_DIR}"
          "${CUDAToolkit_LIBRARY_ROOT}/lib64")
  set(_cudnn_major 0)
  if(CUDNN_INCLUDE_DIR AND EXISTS "${CUDNN_INCLUDE_DIR}/cudnn_version.h")
    file(STRINGS "${CUDNN_INCLUDE_DIR}/cudnn_version.h" _cudnn_version_lines
         REGEX "#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) ")
    foreach(_part MAJOR MINOR PATCHLEVEL)
      string(REGEX REPLACE ".*#define CUDNN_${_part} ([0-9]+).*" "\\1" _cudnn_${_part}
             "${_cudnn_version_lines}")
    endforeach()
    set(_cudnn_major ${_cudnn_MAJOR})
  endif()
  if(CUDNN_INCLUDE_DIR AND CUDNN_LIBRARY AND _cudnn_major GREATER_EQUAL 9)
    set(DDILOCO_HAVE_CUDNN ON)
    message(STATUS "cuDNN ${_cudnn_MAJOR}.${_cudnn_MINOR}.${_cudnn_PATCHLEVEL}: ${CUDNN_LIBRARY} "
                   "(headers ${CUDNN_INCLUDE_DIR}); run.gpu_attention: cudnn is built")
    add_library(CUDNN::cudnn SHARED IMPORTED)
    set_target_properties(CUDNN::cudnn PROPERTIES
      IMPORTED_LOCATION "${CUDNN_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
  else()
    message(STATUS "cuDNN 9 not found (cudnn_graph.h: ${CUDNN_INCLUDE_DIR}, libcudnn: "
                   "${CUDNN_LIBRARY}, major version ${_cudnn_major}); run.gpu_attention: cudnn "
                   "is not built (set -DCUDNN_ROOT=<prefix> to point at it)")
  endif()
else()
  message(STATUS "cuDNN: off (DDILOCO_CUDNN=OFF); run.gpu_attention: cudnn is not built")
endif()

# ---------------------------------------------------------------- warnings for CUDA sources
# ddiloco_warnings is for the host compiler; nvcc forwards them with -Xcompiler. -Wpedantic
# is left out: nvcc's generated host stubs trip it.
add_library(ddiloco_cuda_warnings INTERFACE)
target_compile_options(ddiloco_cuda_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)

# ---------------------------------------------------------------- library
file(GLOB DDILOCO_CUDA_SOURCES CONFIGURE_DEPENDS
  "${CMAKE_CURRENT_SOURCE_DIR}/kernels/*.cu"
  "${CMAKE_CURRENT_SOURCE_DIR}/src/gpu/*.cpp"
  "${CMAKE_CURRENT_SOURCE_DIR}/src/gpu/*.cu")
if(NOT DDILOCO_HAVE_CUDNN)
  list(FILTER DDILOCO_CUDA_SOURCES EXCLUDE REGEX ".*/src/gpu/cudnn_[^/]*$")
endif()
add_library(ddiloco_cuda STATIC ${DDILOCO_CUDA_SOURCES})
target_include_directories(ddiloco_cuda
  PUBLIC "${CMAKE_CURRENT_SOURCE_DIR}/include"
  PRIVATE "${CMAKE_CURRENT_SOURCE_DIR}/src" "${CMAKE_CURRENT_SOURCE_DIR}/kernels")
target_link_libraries(ddiloco_cuda
  PUBLIC ddiloco_core CUDA::cudart CUDA::cublas CUDA::cublasLt NCCL::nccl
  PRIVATE ddiloco_cuda_warnings)
target_compile_definitions(ddiloco_cuda PUBLIC DDILOCO_HAVE_CUDA=1)
if(DDILOCO_HAVE_CUDNN)
  target_link_libraries(ddiloco_cuda PUBLIC CUDNN::cudnn)
  target_compile_definitions(ddiloco_cuda PUBLIC DDILOCO_HAVE_CUDNN=1)
endif()
target_compile_options(ddiloco_cuda PRIVATE
  # Release device code: fast math would change expf/tanhf results the CPU tests compare to,
  # so only the cheap, accuracy-neutral flags. --expt-relaxed-constexpr lets device code call
  # constexpr host helpers (std::numeric_limits); lineinfo keeps profiles readable.
  $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo>)
set_target_properties(ddiloco_cuda PROPERTIES
  CUDA_SEPARABLE_COMPILATION OFF
  POSITION_INDEPENDENT_CODE ON)
