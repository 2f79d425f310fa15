# `cmake --install` lays out the public headers under include/minigrad/<layer>/, the
# library, a package config so that find_package(minigrad) + minigrad::minigrad work
# elsewhere, and (with MINIGRAD_BUILD_SAMPLES) the programs a user runs, in bin/.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The public headers: <minigrad/minigrad.h>, the headers README.md and docs/*.md name
# (as minigrad/<layer>/<file>.h, <layer>/<file>.h or, when unique, <file>.h), and everything those include from
# minigrad, transitively, so the installed tree is closed under its own includes. The
# rest (the CPU backend's loops, the CUDA backend's cuBLAS, stream and kernel helpers,
# the worker pool, sockets) is internal and stays in the source tree.
function(minigrad_public_headers out_var)
  set(queue minigrad/minigrad.h)
  file(GLOB docs ${PROJECT_SOURCE_DIR}/docs/*.md)
  foreach(doc IN LISTS docs ITEMS ${PROJECT_SOURCE_DIR}/README.md)
    file(READ ${doc} text)
    string(REGEX MATCHALL "[a-z_/]*[a-z_]+/[a-z_0-9]+\\.h" named "${text}")
    foreach(path IN LISTS named)
      string(REGEX MATCH "[a-z_]+/[a-z_/0-9]*\\.h$" path "${path}")
      string(REGEX REPLACE "^minigrad/" "" path "${path}")
      if(path AND EXISTS ${PROJECT_SOURCE_DIR}/minigrad/${path})
        list(APPEND queue minigrad/${path})
      endif()
    endforeach()
    # A header named by its file name alone ("sharded_state.h") counts when exactly one
    # header under minigrad/ has that name and it is not one of the backends' internals
    # (a name an internal header shares is ambiguous: "widen.h" means core/cpu's or
    # cuda's). The name must end there: "transformer.h.0.attn" is a parameter's name, not a
    # header.
    string(REGEX MATCHALL "[^a-z_/.][a-z_0-9]+\\.h([^a-z_0-9.]|$)" bare "${text}")
    foreach(name IN LISTS bare)
      string(REGEX REPLACE "^[^a-z_]" "" name "${name}")
      string(REGEX REPLACE "\\.h.*$" ".h" name "${name}")
      file(GLOB_RECURSE found RELATIVE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/minigrad/*/${name})
      list(LENGTH found count)
      list(FILTER found EXCLUDE REGEX "^minigrad/(cuda/kernels|core/cpu)/")
      list(LENGTH found public)
      if(count EQUAL 1 AND public EQUAL 1)
        list(APPEND queue ${found})
      endif()
    endforeach()
  endforeach()
  set(seen)
  while(queue)
    list(POP_FRONT queue header)
    if(header IN_LIST seen)
      continue()
    endif()
    list(APPEND seen ${header})
    file(STRINGS ${PROJECT_SOURCE_DIR}/${header} includes REGEX "^[ \t]*#[ \t]*include <minigrad/")
    foreach(line IN LISTS includes)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include <(minigrad/[^>]+)>.*$" "\\1" included "${line}")
      if(NOT EXISTS ${PROJECT_SOURCE_DIR}/${included})
        message(FATAL_ERROR "minigrad: ${header} includes <${included}>, which does not exist")
      endif()
      list(APPEND queue ${included})
    endforeach()
  endwhile()
  list(SORT seen)
  set(${out_var} ${seen} PARENT_SCOPE)
endfunction()

minigrad_public_headers(MINIGRAD_PUBLIC_HEADERS)
foreach(header IN LISTS MINIGRAD_PUBLIC_HEADERS)
  get_filename_component(dir ${header} DIRECTORY)
  install(FILES ${PROJECT_SOURCE_DIR}/${header} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/${dir})
endforeach()

set_target_properties(minigrad PROPERTIES EXPORT_NAME minigrad
                      INSTALL_RPATH "$ORIGIN")
install(TARGETS minigrad EXPORT minigradTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT minigradTargets NAMESPACE minigrad::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/minigrad)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/minigradConfig.cmake.in
  ${CMAKE_BINARY_DIR}/minigradConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/minigrad)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/minigradConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/minigradConfig.cmake
              ${CMAKE_BINARY_DIR}/minigradConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/minigrad)

# The programs a user runs: the launcher, the planner, the three trainers, the two tutorials and the
# pipeline with a stage per process. They find libminigrad next door, in ../lib.
set(MINIGRAD_INSTALLED_PROGRAMS minigrad-run minigrad-plan train_fashion_mnist train_minimal train_gpt
                                data_parallel_tutorial model_parallel pipeline_parallel)
if(MINIGRAD_BUILD_SAMPLES)
  foreach(program IN LISTS MINIGRAD_INSTALLED_PROGRAMS)
    set_target_properties(${program} PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
    install(TARGETS ${program} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endforeach()
endif()
