# Install rules and the exported CMake package (docs/architecture.md §2).
#
#   cmake --install build --prefix PREFIX
#
# installs PREFIX/bin/autopar-tune and the launchers (autopar-mpirun, autopar-srun as a symlink to
# it, autopar-train), and the pure core as a CMake package: its static libraries, its public headers
# (include/autopar/{common,spec,space,perf,search}/ and the generated autopar/version.h) and
# PREFIX/lib/cmake/autopar-tune/autopar-tuneConfig.cmake with imported targets autopar-tune::spec,
# ::space, ::perf and ::search. The coordinator, the CLI and the trial runner stay inside the
# binary: their libraries carry build-tree protobuf headers and MPI, which a package would have to
# export too. tests/unit/install_package_test.py installs into a scratch prefix and builds a
# consumer against it.
include(CMakePackageConfigHelpers)

set(autopar_package_dir ${CMAKE_INSTALL_LIBDIR}/cmake/autopar-tune)
set(autopar_core spec space perf search)

install(TARGETS autopar-tune RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(PROGRAMS ${CMAKE_SOURCE_DIR}/launcher/autopar-mpirun ${CMAKE_SOURCE_DIR}/launcher/autopar-train
        DESTINATION ${CMAKE_INSTALL_BINDIR})
# autopar-srun is autopar-mpirun under another name (it picks srun by its own name).
install(CODE "file(CREATE_LINK autopar-mpirun
                   \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/autopar-srun\"
                   SYMBOLIC)")

foreach(module ${autopar_core})
  set_target_properties(autopar_${module} PROPERTIES EXPORT_NAME ${module})
  install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/autopar/${module}
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/autopar)
endforeach()
install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/autopar/common
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/autopar)
install(FILES ${AUTOPAR_GENERATED_INCLUDE}/autopar/version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/autopar)
list(TRANSFORM autopar_core PREPEND autopar_ OUTPUT_VARIABLE autopar_core_targets)
set_target_properties(autopar_common PROPERTIES EXPORT_NAME common)
install(TARGETS autopar_common ${autopar_core_targets} EXPORT autopar-tuneTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT autopar-tuneTargets NAMESPACE autopar-tune:: DESTINATION ${autopar_package_dir})

configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/autopar-tuneConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/autopar-tuneConfig.cmake
                              INSTALL_DESTINATION ${autopar_package_dir}
                              PATH_VARS CMAKE_INSTALL_BINDIR)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/autopar-tuneConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/autopar-tuneConfig.cmake
              ${CMAKE_BINARY_DIR}/autopar-tuneConfigVersion.cmake
        DESTINATION ${autopar_package_dir})
