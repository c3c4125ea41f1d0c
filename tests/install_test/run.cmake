# Configures, builds and runs the consumer project against the install prefix. The
# installed target must not pass -march=native on (the library keeps its flags private).
file(GLOB _targets ${PREFIX}/lib*/cmake/kqlora/kqloraTargets*.cmake)
foreach(f IN LISTS _targets)
  file(READ ${f} _text)
  if(_text MATCHES "march=")
    message(FATAL_ERROR "${f} passes -march on to consumers")
  endif()
endforeach()
file(REMOVE_RECURSE ${BIN})
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SRC} -B ${BIN} -DCMAKE_PREFIX_PATH=${PREFIX}
                        -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Release
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the consumer against ${PREFIX} failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BIN} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building the consumer failed")
endif()
execute_process(COMMAND ${BIN}/consumer RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the consumer failed (${rc})")
endif()
