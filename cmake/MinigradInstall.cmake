# `cmake --install` lays out headers under include/minigrad/<layer>/, the library, and a
# package config so that find_package(minigrad) + minigrad::minigrad work elsewhere.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set_target_properties(minigrad PROPERTIES EXPORT_NAME minigrad
                      INSTALL_RPATH "$ORIGIN")
install(TARGETS minigrad EXPORT minigradTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
foreach(layer IN LISTS MINIGRAD_LAYERS ITEMS cuda)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/minigrad/${layer}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/minigrad/${layer}
          FILES_MATCHING PATTERN "*.h")
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/minigrad/minigrad.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/minigrad)
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
