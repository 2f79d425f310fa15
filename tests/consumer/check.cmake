# Installs the built minigrad into a scratch prefix, then configures, builds and runs
# tests/consumer against it. Fails loudly at the first step that does not work:
#   - the public headers are installed and closed under their own includes: one file
#     including every installed header compiles against the prefix alone;
#   - the consumer's program links minigrad::minigrad and runs one gradient step;
#   - with EXPECT_PROGRAMS, the programs a user runs are in bin/ and run from there
#     (train_gpt trains on a tiny corpus, saves, and samples from the checkpoint alone).
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
  foreach(program minigrad-run minigrad-plan train_fashion_mnist train_minimal train_gpt data_parallel_tutorial
                  model_parallel pipeline_parallel)
    if(NOT EXISTS ${prefix}/bin/${program})
      message(FATAL_ERROR "cmake --install did not install bin/${program}")
    endif()
  endforeach()
  # Run from the prefix: the programs find the installed libminigrad.
  run_step(${prefix}/bin/data_parallel_tutorial --replicas 2)
  run_step(${prefix}/bin/minigrad-plan --model gpt2 --devices 2 --device l4)
  execute_process(COMMAND ${prefix}/bin/train_minimal /nowhere 0 RESULT_VARIABLE rc
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "usage: train_minimal")
    message(FATAL_ERROR "installed train_minimal: exit code ${rc}, said: ${err}")
  endif()
  execute_process(COMMAND ${prefix}/bin/pipeline_parallel --help RESULT_VARIABLE rc OUTPUT_VARIABLE out)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "a stage per process")
    message(FATAL_ERROR "installed pipeline_parallel --help: exit code ${rc}, said: ${out}")
  endif()
  # train_gpt: two steps on a tiny corpus, a checkpoint, and the same sample from the
  # checkpoint alone (its vocabulary travels in it), with the corpus gone.
  string(REPEAT "A fortune a day keeps the doctor away.\n%\n" 60 fortunes)
  file(WRITE ${WORK_DIR}/fortunes/wisdom "${fortunes}")
  set(tiny --n-layer 1 --n-head 2 --n-embd 16 --block-size 16 --batch-size 4 --eval-iters 1
           --sample-chars 30)
  execute_process(COMMAND ${prefix}/bin/train_gpt ${tiny} --iters 2 --eval-interval 2 --data-dir
                          ${WORK_DIR}/fortunes --save ${WORK_DIR}/gpt.safetensors
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "installed train_gpt: exit code ${rc}\n${out}\n${err}")
  endif()
  string(REGEX REPLACE ".*---- a sample" "" trained "${out}")
  file(REMOVE_RECURSE ${WORK_DIR}/fortunes)
  execute_process(COMMAND ${prefix}/bin/train_gpt ${tiny} --resume ${WORK_DIR}/gpt.safetensors
                          --sample-only
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "installed train_gpt --sample-only: exit code ${rc}\n${out}\n${err}")
  endif()
  string(REGEX REPLACE ".*---- a sample" "" alone "${out}")
  if(trained STREQUAL "" OR NOT trained STREQUAL alone)
    message(FATAL_ERROR "installed train_gpt: the sample after training\n${trained}\nis not the "
                        "checkpoint's alone\n${alone}")
  endif()
endif()
