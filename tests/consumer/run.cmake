# Installs the built library into a scratch prefix, then configures, builds and runs a
# separate project against it. Invoked by CTest with -DBUILD_DIR, -DSOURCE_DIR, -DWORK_DIR;
# optional -DPROJECT_DIR (default: this consumer project) and -DEXECUTABLE (default: consumer)
# build and run another project the same way (the custom-kernel example).
if(NOT PROJECT_DIR)
  set(PROJECT_DIR ${SOURCE_DIR}/tests/consumer)
endif()
if(NOT EXECUTABLE)
  set(EXECUTABLE consumer)
endif()
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "install failed: ${rc}")
endif()
# the project is compiled afresh each run; ccache, where present, keeps that cheap
set(launchers)
find_program(CCACHE_PROGRAM ccache)
if(CCACHE_PROGRAM)
  set(launchers -DCMAKE_CXX_COMPILER_LAUNCHER=${CCACHE_PROGRAM} -DCMAKE_CUDA_COMPILER_LAUNCHER=${CCACHE_PROGRAM})
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${PROJECT_DIR} -B ${WORK_DIR}/build -G Ninja
                        -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release ${launchers}
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring ${PROJECT_DIR} failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building ${PROJECT_DIR} failed: ${rc}")
endif()
# the installed library must be found through the package's RPATH-free layout
execute_process(COMMAND ${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${WORK_DIR}/prefix/lib
                        ${WORK_DIR}/build/${EXECUTABLE} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "${out}${err}")
if(rc)
  message(FATAL_ERROR "${EXECUTABLE} returned ${rc}")
endif()
