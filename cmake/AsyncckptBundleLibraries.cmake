# Run by `cmake --install` in a wheel build (python/CMakeLists.txt): copies the shared libraries
# that ASYNCCKPT_MODULE loads and a Linux system does not provide (oneTBB, liburing, zstd,
# xxhash, and cudart in a CUDA build) into <prefix>/ASYNCCKPT_PACKAGE_DIR, each as a plain file
# under the soname the module asks for (a wheel holds no symbolic links), and each one's license
# text into ASYNCCKPT_LICENSE_DIR: the copyright file of the Debian package that holds it, or
# for cudart the license of the CUDA toolkit's runtime. A library whose license is not found is
# not bundled: the install fails, naming it.
file(GET_RUNTIME_DEPENDENCIES
     LIBRARIES "${ASYNCCKPT_MODULE}"
     RESOLVED_DEPENDENCIES_VAR asyncckpt_resolved
     UNRESOLVED_DEPENDENCIES_VAR asyncckpt_unresolved
     PRE_INCLUDE_REGEXES "^lib(tbb|uring|zstd|xxhash|cudart)[.-]"
     PRE_EXCLUDE_REGEXES ".*")
if(asyncckpt_unresolved)
  message(FATAL_ERROR "asyncckpt wheel: cannot find ${asyncckpt_unresolved}, which the module loads")
endif()

# The license text of `real` (a library's file) into `out`.
function(asyncckpt_license_of real out)
  if(real MATCHES "/libcudart[.]")
    get_filename_component(lib_dir "${real}" DIRECTORY)
    file(GLOB_RECURSE candidates
         "${lib_dir}/../../../dist-info/nvidia_cuda_runtime-*/licenses/*"
         "${lib_dir}/../../dist-info/nvidia_cuda_runtime-*/licenses/*"
         "${lib_dir}/../dist-info/nvidia_cuda_runtime-*/licenses/*"
         "${lib_dir}/../EULA.txt")
  else()
    execute_process(COMMAND dpkg-query -S "${real}" OUTPUT_VARIABLE owner
                    RESULT_VARIABLE failed ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
    set(candidates "")
    if(NOT failed)
      string(REGEX REPLACE "[:].*" "" package "${owner}")
      if(EXISTS "/usr/share/doc/${package}/copyright")
        set(candidates "/usr/share/doc/${package}/copyright")
      endif()
    endif()
  endif()
  list(LENGTH candidates found)
  if(found EQUAL 0)
    message(FATAL_ERROR "asyncckpt wheel: no license text found for ${real}; it is not bundled "
                        "without one")
  endif()
  list(GET candidates 0 license)
  file(COPY_FILE "${license}" "${out}")
endfunction()

set(asyncckpt_destination "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}/${ASYNCCKPT_PACKAGE_DIR}")
file(MAKE_DIRECTORY "${ASYNCCKPT_LICENSE_DIR}")
foreach(library ${asyncckpt_resolved})
  get_filename_component(soname "${library}" NAME)
  get_filename_component(real "${library}" REALPATH)
  message(STATUS "asyncckpt wheel: bundling ${soname} (${real})")
  file(COPY_FILE "${real}" "${asyncckpt_destination}/${soname}")
  asyncckpt_license_of("${real}" "${ASYNCCKPT_LICENSE_DIR}/${soname}.txt")
endforeach()
