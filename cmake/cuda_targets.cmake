# CUDA backend targets (included by the top-level CMakeLists.txt after the
# spbcuda library is defined): cuBLASLt and NCCL for spbcuda, the host
# helpers, the check program spbench-gpu-check and its tests.  A build for
# the CPU emulation has its own (cuda_emu.cmake, cuda_emu_tests.cmake).
if(SPB_CUDA_EMU AND TARGET spbcuda)
  include(${CMAKE_SOURCE_DIR}/cmake/cuda_emu_tests.cmake)
  return()
endif()
if(SPB_HAVE_CUDA AND TARGET spbcuda)
  set_target_properties(spbcuda PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON POSITION_INDEPENDENT_CODE ON)
  target_sources(spbcuda PRIVATE ${CMAKE_SOURCE_DIR}/common/cuda/gpu_util.c)
  # cuBLASLt for the bf16 kernels, cuBLAS (cublasSgemm) for the fp32 device
  # table of the GPT core (common/cuda/cuda_backend.cu).
  target_link_libraries(spbcuda PUBLIC CUDA::cublasLt CUDA::cublas)
  # spbcuda calls back into spbcore (spb_die, spb_mem_category_name): a cycle
  # of static libraries, which CMake resolves by repeating them on the link
  # line.  INTERFACE: spbcuda's own compilation is unchanged.
  target_link_libraries(spbcuda INTERFACE spbcore)
  # ptxas warnings about register spills of the SIMPLE attention kernels are expected.
  target_compile_options(spbcuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)

  # NCCL ships no CMake config: look for the header and the library.
  find_path(SPB_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include /usr/local/include)
  find_library(SPB_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/lib/x86_64-linux-gnu /usr/local/lib)
  if(SPB_NCCL_INCLUDE_DIR AND SPB_NCCL_LIBRARY)
    message(STATUS "spbench NCCL: ${SPB_NCCL_LIBRARY}")
    target_include_directories(spbcuda PUBLIC ${SPB_NCCL_INCLUDE_DIR})
    target_link_libraries(spbcuda PUBLIC ${SPB_NCCL_LIBRARY})
    target_compile_definitions(spbcuda PUBLIC SPB_HAVE_NCCL=1)
  else()
    # The glob put the NCCL sources into spbcuda: take them out again.
    get_target_property(spb_cuda_srcs spbcuda SOURCES)
    list(FILTER spb_cuda_srcs EXCLUDE REGEX "nccl_(device_)?comm\\.cu$")
    set_property(TARGET spbcuda PROPERTY SOURCES ${spb_cuda_srcs})
    message(STATUS "spbench NCCL: not found, common/cuda/nccl_comm.cu and nccl_device_comm.cu left out")
  endif()

  # cuDNN (optional): the second attention backend, --attention cudnn.  In the
  # toolkit, under SPB_CUDNN_ROOT, or in a Python install's nvidia-cudnn
  # wheel (which ships libcudnn.so.9 without the unversioned link).
  set(SPB_CUDNN_ROOT "" CACHE PATH "Where cuDNN 9 is (include/, lib/), if not in the CUDA toolkit")
  set(spb_cudnn_hints ${SPB_CUDNN_ROOT})
  find_program(SPB_PYTHON3 python3)
  if(SPB_PYTHON3)
    # the folder above include/cudnn_graph.h in an installed nvidia package
    execute_process(COMMAND ${SPB_PYTHON3} -c
                    "import glob, os, nvidia; h = [p for r in nvidia.__path__ for p in glob.glob(os.path.join(r, '**', 'include', 'cudnn_graph.h'), recursive=True)]; print(os.path.dirname(os.path.dirname(h[0])) if h else '')"
                    OUTPUT_VARIABLE spb_py_cudnn OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(spb_py_cudnn)
      list(APPEND spb_cudnn_hints ${spb_py_cudnn})
    endif()
  endif()
  find_path(SPB_CUDNN_INCLUDE_DIR cudnn_graph.h HINTS ${spb_cudnn_hints} ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include)
  find_library(SPB_CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 HINTS ${spb_cudnn_hints} ${CUDAToolkit_LIBRARY_DIR}
               PATH_SUFFIXES lib lib64)
  target_sources(spbcuda PRIVATE ${CMAKE_SOURCE_DIR}/common/cuda/cudnn_attention.c)
  if(SPB_CUDNN_INCLUDE_DIR AND SPB_CUDNN_LIBRARY)
    message(STATUS "spbench cuDNN: ${SPB_CUDNN_LIBRARY}")
    target_include_directories(spbcuda PUBLIC ${SPB_CUDNN_INCLUDE_DIR})
    target_link_libraries(spbcuda PUBLIC ${SPB_CUDNN_LIBRARY})
    target_compile_definitions(spbcuda PUBLIC SPB_HAVE_CUDNN=1)
  else()
    message(STATUS "spbench cuDNN: not found, --attention cudnn left out (SPB_CUDNN_ROOT=<dir> to point at one)")
  endif()

  # spbench-gpu-check: every kernel against the CPU reference, the 7B-shape
  # timings.  spbench-gpu-layer: the device transformer layer
  # (common/cuda/cuda_layer.cu) against the CPU layer, a 2-layer GPT step
  # against the GPT core, and the 7B layer timings.
  foreach(spb_gpu_program check layer)
    set(t spbench-gpu-${spb_gpu_program})
    add_executable(${t} ${CMAKE_SOURCE_DIR}/experiments/gpu_${spb_gpu_program}.cu)
    set_target_properties(${t} PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
    add_dependencies(${t} spb_version)
    target_include_directories(${t} PRIVATE ${CMAKE_BINARY_DIR}/generated)
    target_compile_definitions(${t} PRIVATE SPB_GPU_CHECK_HAVE_CORE=1)
    target_link_libraries(${t} PRIVATE spbcore spbcuda CUDA::cudart)
  endforeach()

  if(BUILD_TESTING)
    # The device layer and GPT step against the CPU; SKIPPED (77) without a GPU.
    add_test(NAME gpu_layer COMMAND spbench-gpu-layer --check-only)
    set_tests_properties(gpu_layer PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
    # Kernels against the CPU reference; SKIPPED (77) where no GPU is visible.
    add_test(NAME gpu_check COMMAND spbench-gpu-check --check-only)
    set_tests_properties(gpu_check PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
    if(SPB_HAVE_CHECK)
      # Host arithmetic of the layer timings (no GPU needed): FLOP counts,
      # strategy shapes at P, attention pairs, the peak table.
      add_executable(test_layer_plan ${CMAKE_SOURCE_DIR}/tests/gpu/test_layer_plan.c)
      target_include_directories(test_layer_plan PRIVATE ${CMAKE_SOURCE_DIR}/common/cuda ${SPB_COMMON_INCLUDE_DIRS})
      target_link_libraries(test_layer_plan PRIVATE PkgConfig::CHECK ${MATH_LIBRARY})
      add_test(NAME gpu_layer_plan COMMAND test_layer_plan)
      set_tests_properties(gpu_layer_plan PROPERTIES ENVIRONMENT "CK_FORK=no" TIMEOUT 120)
      # Host logic of the GPU code (no GPU needed): layouts, tolerances, CSV.
      add_executable(test_gpu_util ${CMAKE_SOURCE_DIR}/tests/gpu/test_gpu_util.c ${CMAKE_SOURCE_DIR}/common/cuda/gpu_util.c)
      target_include_directories(test_gpu_util PRIVATE ${CMAKE_SOURCE_DIR}/common/cuda)
      target_link_libraries(test_gpu_util PRIVATE PkgConfig::CHECK ${MATH_LIBRARY})
      add_test(NAME gpu_util COMMAND test_gpu_util)
      set_tests_properties(gpu_util PROPERTIES ENVIRONMENT "CK_FORK=no" TIMEOUT 120)
      if(SPB_CUDNN_INCLUDE_DIR AND SPB_CUDNN_LIBRARY)
        # cuDNN attention's graphs: every descriptor finalizes in cuDNN (no GPU needed).
        add_executable(test_cudnn_graph ${CMAKE_SOURCE_DIR}/tests/gpu/test_cudnn_graph.c
                                        ${CMAKE_SOURCE_DIR}/common/cuda/cudnn_attention.c)
        target_include_directories(test_cudnn_graph PRIVATE ${CMAKE_SOURCE_DIR}/common/cuda ${SPB_COMMON_INCLUDE_DIRS}
                                                            ${SPB_CUDNN_INCLUDE_DIR})
        target_compile_definitions(test_cudnn_graph PRIVATE SPB_HAVE_CUDNN=1)
        target_link_libraries(test_cudnn_graph PRIVATE PkgConfig::CHECK ${SPB_CUDNN_LIBRARY} CUDA::cudart ${MATH_LIBRARY})
        add_test(NAME cudnn_graph COMMAND test_cudnn_graph)
        set_tests_properties(cudnn_graph PROPERTIES ENVIRONMENT "CK_FORK=no" TIMEOUT 120)
      endif()
    else()
      spb_left_out(test_layer_plan test_gpu_util) # Check-based
    endif()
  endif()
endif()
