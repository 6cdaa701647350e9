# The performance model (docs/MODEL.md): spbench-model, spbench-calibrate and
# the model's test.  Included from the top-level CMakeLists.txt.
add_library(spbmodel STATIC ${CMAKE_SOURCE_DIR}/common/model/perf_model.c)
target_link_libraries(spbmodel PUBLIC spbcore)

add_executable(spbench-model ${CMAKE_SOURCE_DIR}/experiments/spbench_model.c)
add_dependencies(spbench-model spb_version)
target_include_directories(spbench-model PRIVATE ${CMAKE_BINARY_DIR}/generated)
target_link_libraries(spbench-model PRIVATE spbmodel)

add_executable(spbench-calibrate ${CMAKE_SOURCE_DIR}/experiments/spbench_calibrate.c)
add_dependencies(spbench-calibrate spb_version)
target_include_directories(spbench-calibrate PRIVATE ${CMAKE_BINARY_DIR}/generated)
target_link_libraries(spbench-calibrate PRIVATE spbmodel)

if(BUILD_TESTING AND NOT SPB_HAVE_CHECK)
  spb_left_out(test_perf_model)
elseif(BUILD_TESTING)
  add_executable(test_perf_model ${CMAKE_SOURCE_DIR}/tests/test_perf_model.c)
  target_link_libraries(test_perf_model PRIVATE spbmodel PkgConfig::CHECK)
  add_test(NAME perf_model_mpi4
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_PREFLAGS} -np 4 $<TARGET_FILE:test_perf_model>
                   ${CMAKE_SOURCE_DIR}/profiles)
  set_tests_properties(perf_model_mpi4 PROPERTIES
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1"
    TIMEOUT 300 PROCESSORS 4) # 4 ranks: alone under scripts/test's ctest -j (tests/CMakeLists.txt)
endif()
# the model against published multi-GPU training measurements (median |error| <= 15%), and its refusal of
# rates above the peak
if(BUILD_TESTING)
  add_test(NAME model_published COMMAND ${CMAKE_SOURCE_DIR}/tests/model_published.sh ${CMAKE_SOURCE_DIR}
                                        $<TARGET_FILE:spbench-model>)
  # 55 points with every term ablated: about a minute and a quarter; scripts/test --full (CI)
  set_tests_properties(model_published PROPERTIES TIMEOUT 300 LABELS full)
endif()
