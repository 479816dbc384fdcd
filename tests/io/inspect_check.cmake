# strata-inspect on a good file (written by strata) and a bad one: exit codes and output.
#   cmake -DINSPECT=... -DHELPER=... -DWORK_DIR=... -P inspect_check.cmake
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
function(helper mode)  # the safetensors interop helper writes the test files
  execute_process(COMMAND ${HELPER} ${mode} ${WORK_DIR} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "helper ${mode} failed: ${rc}")
  endif()
endfunction()
helper(write)

execute_process(COMMAND ${INSPECT} ${WORK_DIR}/strata_all.safetensors
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT err STREQUAL "")
  message(FATAL_ERROR "strata-inspect on a good file: exit ${rc}, stderr: ${err}")
endif()
foreach(want "written_by: strata" "float16.T +F16 +\\[4, 3\\] +24 +[0-9a-f]+" "scalar +F64 +\\[\\] +8 "
             "empty +I32 +\\[0, 3\\] +0 +ef46db3751d8e999")
  if(NOT out MATCHES "${want}")
    message(FATAL_ERROR "strata-inspect output lacks '${want}':\n${out}")
  endif()
endforeach()

file(WRITE ${WORK_DIR}/bad.safetensors "this is not a safetensors file")
execute_process(COMMAND ${INSPECT} ${WORK_DIR}/bad.safetensors ${WORK_DIR}/missing.safetensors
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 1)
  message(FATAL_ERROR "strata-inspect on bad files: exit ${rc}, expected 1")
endif()
foreach(want "strata-inspect: ${WORK_DIR}/bad.safetensors: \\[safetensors\\] header length [0-9]+ exceeds"
             "strata-inspect: ${WORK_DIR}/missing.safetensors: cannot open")
  if(NOT err MATCHES "${want}")
    message(FATAL_ERROR "strata-inspect stderr lacks '${want}':\n${err}")
  endif()
endforeach()
# a FIFO is refused at once, not waited on for a writer that never comes
execute_process(COMMAND mkfifo ${WORK_DIR}/pipe RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "mkfifo failed: ${rc}")
endif()
execute_process(COMMAND ${INSPECT} ${WORK_DIR}/pipe TIMEOUT 20
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 1 OR NOT err MATCHES "not a regular file")
  message(FATAL_ERROR "strata-inspect on a FIFO: exit ${rc}, stderr: ${err}")
endif()
# names and metadata from the file are shown escaped: a newline cannot forge a line
helper(write_odd_names)
execute_process(COMMAND ${INSPECT} ${WORK_DIR}/odd_names.safetensors
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "two\\\\x0alines +F32" OR NOT out MATCHES "note: a\\\\x1b\\[31mred\\\\\\\\b")
  message(FATAL_ERROR "strata-inspect did not escape names and metadata: exit ${rc}\n${out}${err}")
endif()
# --help anywhere on the line; a listing that cannot be written is an error
execute_process(COMMAND ${INSPECT} ${WORK_DIR}/strata_all.safetensors --help RESULT_VARIABLE rc OUTPUT_VARIABLE out)
if(NOT rc EQUAL 0 OR NOT out MATCHES "^usage: strata-inspect")
  message(FATAL_ERROR "strata-inspect FILE --help: exit ${rc}\n${out}")
endif()
if(EXISTS /dev/full)
  execute_process(COMMAND ${INSPECT} ${WORK_DIR}/strata_all.safetensors OUTPUT_FILE /dev/full
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 1 OR NOT err MATCHES "cannot write to standard output")
    message(FATAL_ERROR "strata-inspect > /dev/full: exit ${rc}, stderr: ${err}")
  endif()
endif()
message(STATUS "strata-inspect checks passed")
