# Installs the built minigrad into a scratch prefix, then configures, builds and runs
# tests/consumer against it. Fails loudly at the first step that does not work:
#   - the public headers are installed and closed under their own includes: one file
#     including every installed header compiles against the prefix alone;
#   - the consumer's program links minigrad::minigrad and runs one gradient step;
#   - with EXPECT_PROGRAMS, the programs a user runs are in bin/ and run from there.
cmake_minimum_required(VERSION 3.24)  # a -P script: the policies of this CMake
function(run_step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed: ${ARGN}\n${out}\n${err}")
  endif()
  message("${out}")
endfunction()
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
run_step(${CMAKE_COMMAND} --install ${BINARY_DIR} --prefix ${prefix})

file(GLOB_RECURSE headers RELATIVE ${prefix}/include ${prefix}/include/minigrad/*.h)
list(LENGTH headers count)
if(count LESS 20 OR NOT "minigrad/minigrad.h" IN_LIST headers)
  message(FATAL_ERROR "the install has ${count} headers under include/minigrad: ${headers}")
endif()
set(all "// Every installed header: the tree needs nothing outside the prefix.\n")
foreach(header IN LISTS headers)
  string(APPEND all "#include <${header}>\n")
endforeach()
file(WRITE ${WORK_DIR}/all_headers.cpp "${all}")

run_step(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build
         -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release
         -DALL_HEADERS=${WORK_DIR}/all_headers.cpp)
run_step(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run_step(${WORK_DIR}/build/app)

if(EXPECT_PROGRAMS)
  foreach(program minigrad-run train_fashion_mnist train_minimal data_parallel_tutorial
                  model_parallel)
    if(NOT EXISTS ${prefix}/bin/${program})
      message(FATAL_ERROR "cmake --install did not install bin/${program}")
    endif()
  endforeach()
  # Run from the prefix: the programs find the installed libminigrad.
  run_step(${prefix}/bin/data_parallel_tutorial --replicas 2)
  execute_process(COMMAND ${prefix}/bin/train_minimal /nowhere 0 RESULT_VARIABLE rc
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "usage: train_minimal")
    message(FATAL_ERROR "installed train_minimal: exit code ${rc}, said: ${err}")
  endif()
endif()
