# Tests of the experiment runner (experiments/run, sweeplib.py), the sweep
# files and the plot command (plots/render).  Python 3 standard library and
# gnuplot; the runner test launches the real spbench on tiny models.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND AND BUILD_TESTING)
  set(SPB_RUNNER_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1;MPIEXEC=${MPIEXEC_EXECUTABLE}")
  add_test(NAME runner_sweep_parser
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/runner/test_sweeplib.py)
  add_test(NAME runner_sweeps
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/runner/test_runner.py $<TARGET_FILE:spbench>)
  add_test(NAME runner_render
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/runner/test_render.py)
  # --scale gpu --list on a machine without GPUs (fig4 fitted to 8 and 32 GPUs)
  add_test(NAME runner_gpu_scale_list
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/runner/test_gpu_scale.py)
  set_tests_properties(runner_sweep_parser runner_sweeps runner_render runner_gpu_scale_list
                       PROPERTIES ENVIRONMENT "${SPB_RUNNER_ENV}" TIMEOUT 600 LABELS runner)
endif()
# The check that the emulated GPU check's parts ran every check once
# (tests/emu/gpu_check_parts.py, cmake/cuda_emu_tests.cmake), on made-up parts.
if(Python3_Interpreter_FOUND AND BUILD_TESTING)
  add_test(NAME gpu_check_parts COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/gpu_check_parts_test.py)
  set_tests_properties(gpu_check_parts PROPERTIES TIMEOUT 60)
endif()
