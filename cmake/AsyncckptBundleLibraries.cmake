# Run by `cmake --install` in a wheel build (python/CMakeLists.txt): copies the shared libraries
# that ASYNCCKPT_MODULE loads and a Linux system does not provide (oneTBB, liburing, zstd,
# xxhash, and cudart in a CUDA build) into <prefix>/ASYNCCKPT_PACKAGE_DIR, each as a plain file
# under the soname the module asks for (a wheel holds no symbolic links).
file(GET_RUNTIME_DEPENDENCIES
     LIBRARIES "${ASYNCCKPT_MODULE}"
     RESOLVED_DEPENDENCIES_VAR asyncckpt_resolved
     UNRESOLVED_DEPENDENCIES_VAR asyncckpt_unresolved
     PRE_INCLUDE_REGEXES "^lib(tbb|uring|zstd|xxhash|cudart)[.-]"
     PRE_EXCLUDE_REGEXES ".*")
if(asyncckpt_unresolved)
  message(FATAL_ERROR "asyncckpt wheel: cannot find ${asyncckpt_unresolved}, which the module loads")
endif()
set(asyncckpt_destination "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}/${ASYNCCKPT_PACKAGE_DIR}")
foreach(library ${asyncckpt_resolved})
  get_filename_component(soname "${library}" NAME)
  get_filename_component(real "${library}" REALPATH)
  message(STATUS "asyncckpt wheel: bundling ${soname} (${real})")
  file(COPY_FILE "${real}" "${asyncckpt_destination}/${soname}")
endforeach()
