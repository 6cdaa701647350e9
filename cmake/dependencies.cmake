# What the build stands on, each with a built-in stand-in so that a machine
# with only a C compiler and CMake (a GPU machine without network) still
# builds spbench and runs it on several ranks (docs/BUILD.md):
#
#   SPB_MPI        AUTO | SYSTEM | SHM   MPI::MPI_C and MPIEXEC_EXECUTABLE: the
#                                        system MPI, or the shm MPI and spbrun
#   SPB_BLAS       AUTO | OPENBLAS | FALLBACK
#                                        spb_blas: OpenBLAS, or a plain-C sgemm
#   SPB_WITH_CHECK ON | OFF              the Check-based test programs (when
#                                        libcheck is found): SPB_HAVE_CHECK
#
# Included by the top-level CMakeLists.txt before any target uses them.

set(SPB_MPI AUTO CACHE STRING "MPI: AUTO (the system MPI when found, else the built-in shm MPI), SYSTEM or SHM")
set_property(CACHE SPB_MPI PROPERTY STRINGS AUTO SYSTEM SHM)
set(SPB_BLAS AUTO CACHE STRING "BLAS: AUTO (OpenBLAS when pkg-config finds it, else a plain-C sgemm), OPENBLAS or FALLBACK")
set_property(CACHE SPB_BLAS PROPERTY STRINGS AUTO OPENBLAS FALLBACK)
option(SPB_WITH_CHECK "Build the Check-based test programs (needs libcheck)" ON)

find_package(PkgConfig)

# --- the shm MPI and its launcher: always built, so every CI run tests them.
add_library(spb_shm_mpi STATIC
  common/shm_mpi/shm_mpi.c common/shm_mpi/shm_collectives.c common/shm_mpi/shm_p2p.c
  common/shm_mpi/shm_segment.c)
# BEFORE: whoever links the shm MPI gets its mpi.h, never a system one.
target_include_directories(spb_shm_mpi BEFORE PUBLIC ${CMAKE_SOURCE_DIR}/common/shm_mpi)
add_executable(spbrun common/shm_mpi/spbrun.c common/shm_mpi/shm_segment.c)
set_target_properties(spbrun PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})

if(NOT SPB_MPI MATCHES "^(AUTO|SYSTEM|SHM)$")
  message(FATAL_ERROR "SPB_MPI=${SPB_MPI}: want AUTO, SYSTEM or SHM")
endif()
set(SPB_MPI_KIND shm)
if(SPB_MPI STREQUAL "SYSTEM")
  find_package(MPI REQUIRED COMPONENTS C)
  set(SPB_MPI_KIND system)
elseif(SPB_MPI STREQUAL "AUTO")
  find_package(MPI COMPONENTS C)
  if(MPI_C_FOUND)
    set(SPB_MPI_KIND system)
  endif()
endif()
if(SPB_MPI_KIND STREQUAL "shm")
  if(TARGET MPI::MPI_C)
    # AUTO without a system MPI: FindMPI's failed try leaves its imported
    # target behind, so no alias of that name; point the target at the shm MPI.
    set_target_properties(MPI::MPI_C PROPERTIES INTERFACE_LINK_LIBRARIES spb_shm_mpi INTERFACE_INCLUDE_DIRECTORIES ""
                                                INTERFACE_COMPILE_OPTIONS "" INTERFACE_COMPILE_DEFINITIONS ""
                                                INTERFACE_LINK_OPTIONS "")
  else()
    add_library(MPI::MPI_C ALIAS spb_shm_mpi)
  endif()
  # Normal variables: they hide what an earlier SYSTEM configure cached.
  set(MPIEXEC_EXECUTABLE ${CMAKE_BINARY_DIR}/spbrun)
  set(MPIEXEC_PREFLAGS "")
  message(STATUS "spbench MPI: built-in shm MPI (common/shm_mpi), ranks started by ${MPIEXEC_EXECUTABLE} (SPB_MPI=${SPB_MPI})")
else()
  message(STATUS "spbench MPI: system MPI ${MPI_C_VERSION}, ${MPIEXEC_EXECUTABLE} (SPB_MPI=${SPB_MPI}); the shm MPI and spbrun are built and tested beside it")
endif()

# The launcher this build's programs need, for experiments/run.
file(WRITE ${CMAKE_BINARY_DIR}/mpiexec.path "${MPIEXEC_EXECUTABLE}\n")

# --- BLAS ---------------------------------------------------------------
if(NOT SPB_BLAS MATCHES "^(AUTO|OPENBLAS|FALLBACK)$")
  message(FATAL_ERROR "SPB_BLAS=${SPB_BLAS}: want AUTO, OPENBLAS or FALLBACK")
endif()
set(OPENBLAS_FOUND OFF)
if(NOT SPB_BLAS STREQUAL "FALLBACK")
  if(SPB_BLAS STREQUAL "OPENBLAS")
    if(NOT PKG_CONFIG_FOUND)
      message(FATAL_ERROR "SPB_BLAS=OPENBLAS needs pkg-config to find openblas")
    endif()
    pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
  elseif(PKG_CONFIG_FOUND)
    pkg_check_modules(OPENBLAS IMPORTED_TARGET openblas)
  endif()
endif()
if(OPENBLAS_FOUND)
  add_library(spb_blas INTERFACE)
  target_link_libraries(spb_blas INTERFACE PkgConfig::OPENBLAS)
  message(STATUS "spbench BLAS: OpenBLAS ${OPENBLAS_VERSION}")
else()
  # Its cblas.h stands in for OpenBLAS's (and tells ops_cpu.c so).
  add_library(spb_blas STATIC common/blas_fallback/sgemm.c)
  target_include_directories(spb_blas PUBLIC ${CMAKE_SOURCE_DIR}/common/blas_fallback)
  message(STATUS "spbench BLAS: OpenBLAS not used (SPB_BLAS=${SPB_BLAS}): plain-C fallback sgemm, slow "
                 "(common/blas_fallback); CPU timings from this build are not comparable")
endif()

# --- Check ----------------------------------------------------------------
set(SPB_HAVE_CHECK OFF)
if(SPB_WITH_CHECK AND PKG_CONFIG_FOUND)
  pkg_check_modules(CHECK IMPORTED_TARGET check)
  if(CHECK_FOUND)
    set(SPB_HAVE_CHECK ON)
  endif()
endif()
# Check-based tests left out are collected in the global property
# SPB_TESTS_LEFT_OUT (spb_left_out) and listed once at the end.
function(spb_left_out)
  set_property(GLOBAL APPEND PROPERTY SPB_TESTS_LEFT_OUT ${ARGN})
endfunction()
if(SPB_HAVE_CHECK)
  message(STATUS "spbench Check: ${CHECK_VERSION}")
elseif(SPB_WITH_CHECK)
  message(STATUS "spbench Check: libcheck not found: the Check-based test programs are not built")
else()
  message(STATUS "spbench Check: SPB_WITH_CHECK=OFF: the Check-based test programs are not built")
endif()
