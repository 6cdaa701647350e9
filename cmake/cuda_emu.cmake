# The CUDA backend on the CPU emulation of a device (SPB_CUDA_EMU=ON,
# docs/EMULATION.md): every common/cuda/*.cu translated (launch syntax) and
# compiled by the host C++ compiler with common/cuda/emu/spb_emu.h forced in,
# linked against the emulation's runtime, tensor-core product, cuBLAS(Lt)
# and NCCL stand-ins instead of NVIDIA's libraries.  NVIDIA's headers are
# still needed (the types, bf16/fp16 conversions and declarations).
enable_language(CXX)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
find_package(Python3 COMPONENTS Interpreter REQUIRED)
find_path(SPB_EMU_CUDA_INCLUDE cuda_runtime_api.h
          HINTS ${CUDAToolkit_ROOT} $ENV{CUDA_HOME} /usr/local/cuda PATH_SUFFIXES include)
if(NOT SPB_EMU_CUDA_INCLUDE)
  message(FATAL_ERROR "SPB_CUDA_EMU: NVIDIA's CUDA headers (cuda_runtime_api.h) not found")
endif()
set(spb_emu_dir ${CMAKE_SOURCE_DIR}/common/cuda/emu)
set(spb_emu_nccl OFF)
if(EXISTS ${spb_emu_dir}/emu_nccl.cc AND EXISTS ${SPB_EMU_CUDA_INCLUDE}/nccl.h)
  set(spb_emu_nccl ON)
endif()

# Races between blocks, and between a block's threads in shared memory
# (emu_race.cc): every load and store of the
# translated sources reported to the emulator, through gcc's ThreadSanitizer
# instrumentation (the emulator defines its entry points; no sanitizer
# runtime is linked, and -g1 gives the reports their source lines).  Two
# sanitizers' instrumentations do not mix: a build has this or
# AddressSanitizer.
option(SPB_EMU_RACECHECK "CUDA emulation: check every launch for races between its blocks and, in shared memory, its threads (instead of ASan)" OFF)
set(spb_emu_race_flags)
if(SPB_EMU_RACECHECK)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    message(FATAL_ERROR "SPB_EMU_RACECHECK needs g++ (its -fsanitize=thread instrumentation)")
  endif()
  set(spb_emu_race_flags -fsanitize=thread --param=tsan-instrument-func-entry-exit=0 -g1)
endif()

# .cu -> .cc (translate.py), then one C++ source each
function(spb_emu_translate cu out_var)
  get_filename_component(name ${cu} NAME_WE)
  get_filename_component(dir ${cu} DIRECTORY)
  set(out ${CMAKE_BINARY_DIR}/emu/${name}.cc)
  # the .cuh beside it: translate.py inlines those that hold kernels
  file(GLOB parts CONFIGURE_DEPENDS ${dir}/*.cuh)
  add_custom_command(OUTPUT ${out}
    COMMAND ${Python3_EXECUTABLE} ${spb_emu_dir}/translate.py ${cu} ${out}
    DEPENDS ${cu} ${parts} ${spb_emu_dir}/translate.py
    COMMENT "CUDA emulation: translating ${name}.cu")
  set_source_files_properties(${out} PROPERTIES
    COMPILE_OPTIONS "-include;${spb_emu_dir}/spb_emu.h;-fno-strict-aliasing;-Wno-subobject-linkage;-Wno-unused-parameter;${spb_emu_race_flags}")
  set(${out_var} ${out} PARENT_SCOPE)
endfunction()

set(spb_emu_sources)
foreach(cu ${SPB_CUDA_SOURCES})
  get_filename_component(name ${cu} NAME_WE)
  if(name MATCHES "^nccl_" AND NOT spb_emu_nccl)
    continue()
  endif()
  spb_emu_translate(${cu} out)
  list(APPEND spb_emu_sources ${out})
endforeach()
# swapcontext returns twice as far as the compiler knows; the scheduler
# holds nothing across it that the fiber could change
set_source_files_properties(${spb_emu_dir}/emu_launch.cc PROPERTIES COMPILE_OPTIONS -Wno-clobbered)
add_library(spbcuda STATIC ${spb_emu_sources}
  ${spb_emu_dir}/emu_launch.cc ${spb_emu_dir}/emu_runtime.cc ${spb_emu_dir}/emu_mma.cc ${spb_emu_dir}/emu_wgmma.cc ${spb_emu_dir}/emu_async_copy.cc ${spb_emu_dir}/emu_bulk_copy.cc
  ${spb_emu_dir}/emu_tma.cc
  ${spb_emu_dir}/emu_streams.cc ${spb_emu_dir}/emu_race.cc ${spb_emu_dir}/emu_cublas.cc
  ${CMAKE_SOURCE_DIR}/common/cuda/gpu_util.c ${CMAKE_SOURCE_DIR}/common/cuda/cudnn_attention.c)
set(SPB_EMU_NCCL ${spb_emu_nccl} CACHE INTERNAL "the NCCL stand-in is in the emulation build")
if(spb_emu_nccl)
  target_sources(spbcuda PRIVATE ${spb_emu_dir}/emu_nccl.cc)
  target_compile_definitions(spbcuda PUBLIC SPB_HAVE_NCCL=1)
endif()
# AddressSanitizer on the CUDA sources: device memory is host memory here,
# so a kernel's access past a device allocation aborts with its .cu line
# (on a GPU it reads garbage or faults somewhere else).  The CPU reference
# (spbcore) stays uninstrumented, for speed.
option(SPB_EMU_ASAN "CUDA emulation: AddressSanitizer on the CUDA sources and the emulator" ON)
if(SPB_EMU_ASAN AND NOT SPB_EMU_RACECHECK)
  include(CheckCXXSourceCompiles)
  set(CMAKE_REQUIRED_FLAGS -fsanitize=address)
  set(CMAKE_REQUIRED_LINK_OPTIONS -fsanitize=address)
  check_cxx_source_compiles("int main() { return 0; }" SPB_EMU_HAVE_ASAN)
  unset(CMAKE_REQUIRED_FLAGS)
  unset(CMAKE_REQUIRED_LINK_OPTIONS)
  if(SPB_EMU_HAVE_ASAN)
    target_compile_options(spbcuda PRIVATE -fsanitize=address -fno-omit-frame-pointer)
    target_link_options(spbcuda PUBLIC -fsanitize=address)
    # compiled into every program that links spbcuda: its ASan defaults
    target_sources(spbcuda INTERFACE ${spb_emu_dir}/emu_asan_options.c)
  else()
    message(STATUS "spbench CUDA emulation: no AddressSanitizer in this compiler (SPB_EMU_ASAN left off)")
  endif()
endif()
target_include_directories(spbcuda PUBLIC ${CMAKE_SOURCE_DIR}/common/cuda ${SPB_COMMON_INCLUDE_DIRS} ${spb_emu_dir} ${SPB_EMU_CUDA_INCLUDE})
target_compile_definitions(spbcuda PUBLIC SPB_CUDA_EMU=1)
if(SPB_EMU_RACECHECK)
  target_compile_definitions(spbcuda PUBLIC SPB_EMU_RACECHECK=1)
  target_link_libraries(spbcuda PUBLIC ${CMAKE_DL_LIBS})
endif()
target_link_libraries(spbcuda PUBLIC MPI::MPI_C)
target_link_libraries(spbcuda INTERFACE spbcore) # spbcuda calls back into spbcore (spb_die, ...)
target_link_libraries(spbcore PUBLIC spbcuda)
target_compile_definitions(spbcore PUBLIC SPB_HAVE_CUDA=1)
target_sources(spbcore PRIVATE ${CMAKE_SOURCE_DIR}/common/cuda/backend_bf16_cuda.c)
message(STATUS "spbench CUDA backend: CPU emulation (NCCL stand-in: ${spb_emu_nccl}, AddressSanitizer: ${SPB_EMU_HAVE_ASAN}, race check: ${SPB_EMU_RACECHECK})")

# The GPU check programs on the emulation (their tests: cuda_emu_targets.cmake)
foreach(spb_gpu_program check layer)
  spb_emu_translate(${CMAKE_SOURCE_DIR}/experiments/gpu_${spb_gpu_program}.cu src)
  set(t spbench-gpu-${spb_gpu_program})
  add_executable(${t} ${src})
  add_dependencies(${t} spb_version)
  target_include_directories(${t} PRIVATE ${CMAKE_BINARY_DIR}/generated ${CMAKE_SOURCE_DIR}/experiments)
  target_compile_definitions(${t} PRIVATE SPB_GPU_CHECK_HAVE_CORE=1)
  target_link_libraries(${t} PRIVATE spbcore spbcuda)
endforeach()
