# Configures, builds and tests kqlora with -DKQLORA_ENABLE_MPI=OFF -DKQLORA_ENABLE_HDF5=OFF
# (and the NCCL backend when WITH_NCCL), then checks that kqlora-train trains and refuses
# checkpoints plainly. It builds the library, every app and the tests of what the switches
# change (the communicator choice in test_json, the BLAS selection through an app, the
# benchmark, the installed package); the numeric suites, whose code no switch touches, run
# in the main build only (compiling them again was a third of this test's time).
set(tests test_json test_blas_selection)
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SRC} -B ${BIN} -DCMAKE_BUILD_TYPE=Release
                        -DKQLORA_ENABLE_MPI=OFF -DKQLORA_ENABLE_HDF5=OFF
                        -DKQLORA_ENABLE_NCCL=${WITH_NCCL}
                        -DKokkos_DIR=${KOKKOS_DIR} -DKokkosKernels_DIR=${KOKKOSKERNELS_DIR}
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring without MPI and HDF5 failed")
endif()
include(ProcessorCount)
ProcessorCount(jobs)
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BIN} -j ${jobs} --target kqlora-apps ${tests}
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building without MPI and HDF5 failed")
endif()
if(WITH_NCCL AND NOT EXISTS ${BIN}/src/CMakeFiles/kqlora.dir/parallel/nccl_communicator.cpp.o)
  message(FATAL_ERROR "the NCCL backend was not built without MPI")
endif()
list(JOIN tests "|" tests_regex)
execute_process(COMMAND ${CMAKE_CTEST_COMMAND} --output-on-failure --no-tests=error -j ${jobs}
                        -R "^(${tests_regex}|bench_smoke|install_tree|install_consumer)$"
                WORKING_DIRECTORY ${BIN} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tests without MPI and HDF5 failed")
endif()
execute_process(COMMAND ${BIN}/bin/kqlora-train ${SRC}/input/seed.in RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "no checkpoint written: this kqlora was built without HDF5")
  message(FATAL_ERROR "kqlora-train without HDF5: exit ${rc}\n${out}${err}")
endif()
execute_process(COMMAND ${BIN}/bin/kqlora-train ${SRC}/input/seed.in checkpoint_every=1
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "built without HDF5: it has no checkpoints")
  message(FATAL_ERROR "kqlora-train without HDF5 did not refuse a checkpoint: exit ${rc}\n${err}")
endif()
message(STATUS "without MPI and HDF5 (NCCL backend: ${WITH_NCCL}): built, tested, trained, "
               "refused checkpoints plainly")
