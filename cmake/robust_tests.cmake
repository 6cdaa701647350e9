# Issue 39, nothing lost, nothing clobbered: spbench's outputs and the
# runner's safety, and bounded, seeded fuzzing of spbench's command line and
# of the sweep files (crashes, hangs and clobbered files counted; 0 allowed).
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND AND BUILD_TESTING)
  set(SPB_ROBUST_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1;MPIEXEC=${MPIEXEC_EXECUTABLE}")
  # the bad-input cases of issue 39 (tests/bad_input.sh's second list), beside bad_input's first
  add_test(NAME bad_input_issue39
           COMMAND ${CMAKE_SOURCE_DIR}/tests/bad_input.sh $<TARGET_FILE:spbench> ${MPIEXEC_EXECUTABLE} issue39)
  add_test(NAME outputs_safety
           COMMAND ${CMAKE_SOURCE_DIR}/tests/outputs_safety.sh $<TARGET_FILE:spbench> ${MPIEXEC_EXECUTABLE})
  add_test(NAME runner_robust
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/runner/test_robust.py $<TARGET_FILE:spbench>)
  # The fuzzers: 40 s each under scripts/test --full (label full), a 10 s twin
  # with another seed in the quick mode (label quick).
  foreach(budget 40 10)
    if(budget EQUAL 40)
      set(suffix "")
      set(seed 39)
      set(mode full)
    else()
      set(suffix "_quick")
      set(seed 139)
      set(mode quick)
    endif()
    add_test(NAME fuzz_spbench_args${suffix}
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/fuzz_spbench.py $<TARGET_FILE:spbench>
                     ${MPIEXEC_EXECUTABLE} --seed ${seed} --seconds ${budget})
    add_test(NAME fuzz_runner_sweeps${suffix}
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/runner/fuzz_sweeps.py $<TARGET_FILE:spbench>
                     --seed ${seed} --seconds ${budget})
    set_tests_properties(fuzz_spbench_args${suffix} fuzz_runner_sweeps${suffix}
                         PROPERTIES ENVIRONMENT "${SPB_ROBUST_ENV}" TIMEOUT 300 LABELS "robust;${mode}")
  endforeach()
  set_tests_properties(bad_input_issue39 outputs_safety runner_robust
                       PROPERTIES ENVIRONMENT "${SPB_ROBUST_ENV}" TIMEOUT 300 LABELS robust)
endif()
