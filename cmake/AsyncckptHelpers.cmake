# Warnings as errors on every target of ours.
function(asyncckpt_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra)
  if(ASYNCCKPT_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

# The fuzz build (fuzz/, scripts/fuzz) needs clang's libFuzzer. Every target of ours gets the
# coverage instrumentation that guides it, not only the fuzz targets, so that the fuzzer sees
# the branches of the parsers in the library; only the fuzz targets link libFuzzer's main.
macro(asyncckpt_setup_fuzzing)
  if(ASYNCCKPT_FUZZ)
    if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
      message(FATAL_ERROR "ASYNCCKPT_FUZZ needs clang (libFuzzer), not ${CMAKE_CXX_COMPILER_ID}: "
                          "configure with -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang, "
                          "or run scripts/fuzz")
    endif()
    if(ASYNCCKPT_TSAN)
      message(FATAL_ERROR "ASYNCCKPT_FUZZ runs under AddressSanitizer; it cannot be combined with "
                          "ASYNCCKPT_TSAN")
    endif()
    set(ASYNCCKPT_ASAN ON)
    add_compile_options(-fsanitize=fuzzer-no-link)
  endif()
endmacro()

macro(asyncckpt_setup_sanitizers)
  if(ASYNCCKPT_ASAN AND ASYNCCKPT_TSAN)
    message(FATAL_ERROR "ASYNCCKPT_ASAN and ASYNCCKPT_TSAN cannot be combined")
  endif()
  if(ASYNCCKPT_ASAN)
    # vptr checks fire inside oneTBB's own flow-graph headers (a task cast after destruction in
    # _flow_graph_impl.h), which no code of ours can fix.
    add_compile_options(-fsanitize=address,undefined -fno-sanitize=vptr -fno-omit-frame-pointer
                        -fno-sanitize-recover=undefined)
    add_link_options(-fsanitize=address,undefined)
  endif()
  if(ASYNCCKPT_TSAN)
    add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
    add_link_options(-fsanitize=thread)
    # TSan sees only instrumented synchronisation: with Debian's libtbb every flow-graph hand-off
    # between threads is reported as a race. The tsan preset sets TBB_DIR to the oneTBB that
    # scripts/test-sanitizers builds with -DTBB_SANITIZE=thread; a TBB_DIR without a TBBConfig
    # makes find_package fall back to the system libtbb silently, hence this check.
    find_package(TBB REQUIRED)
    get_target_property(_asyncckpt_tbb_lib TBB::tbb LOCATION)
    file(STRINGS "${_asyncckpt_tbb_lib}" _asyncckpt_tbb_tsan REGEX "__tsan_func_entry"
         LIMIT_COUNT 1)
    if(NOT _asyncckpt_tbb_tsan)
      message(WARNING "ASYNCCKPT_TSAN: ${_asyncckpt_tbb_lib} is not built with ThreadSanitizer, "
                      "so TSan will report false races inside oneTBB. Run "
                      "`scripts/test-sanitizers tsan`, which builds an instrumented oneTBB into "
                      "build-tsan-tbb/prefix and uses it.")
    endif()
  endif()
endmacro()

# The CUDA device is built when the toolkit is found (AUTO) or demanded (ON).
macro(asyncckpt_find_cuda)
  set(ASYNCCKPT_WITH_CUDA OFF)
  if(NOT ASYNCCKPT_CUDA STREQUAL "OFF")
    if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
      set(CUDAToolkit_ROOT /usr/local/cuda)
    endif()
    find_package(CUDAToolkit QUIET)
    if(CUDAToolkit_FOUND)
      set(ASYNCCKPT_WITH_CUDA ON)
      message(STATUS "asyncckpt: CUDA device enabled (${CUDAToolkit_VERSION})")
    elseif(ASYNCCKPT_CUDA STREQUAL "ON")
      message(FATAL_ERROR "ASYNCCKPT_CUDA=ON but the CUDA toolkit was not found")
    else()
      message(STATUS "asyncckpt: CUDA toolkit not found; CUDA device disabled")
    endif()
  endif()
endmacro()

# The executable of one *_test.cc file, linked like every test (registered by the caller).
function(asyncckpt_add_test_executable name source)
  add_executable(${name} ${source})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PRIVATE asyncckpt asyncckpt_cli_core TBB::tbb zstd::libzstd_shared
                        PkgConfig::liburing PkgConfig::libxxhash GTest::gtest_main GTest::gmock)
  if(ASYNCCKPT_WITH_CUDA)
    target_compile_definitions(${name} PRIVATE ASYNCCKPT_WITH_CUDA=1)
    target_link_libraries(${name} PRIVATE CUDA::cudart)
  endif()
  asyncckpt_warnings(${name})
endfunction()

# One test executable per *_test.cc file, each test case registered with CTest.
function(asyncckpt_add_test source)
  get_filename_component(name ${source} NAME_WE)
  asyncckpt_add_test_executable(${name} ${source})
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 120
                       PROPERTIES ENVIRONMENT "ASYNCCKPT_CLI=$<TARGET_FILE:asyncckpt_cli>"
                                  LABELS "${ARGN}")
endfunction()

# MPI (asyncckpt::mpi, the MpiCoordinator, and the tests run under mpirun) is built when found,
# unless ASYNCCKPT_MPI is turned off; ON with no MPI is an error. The CXX component, so that a
# C++-only consumer finds it too (the C component needs the C language enabled), without the
# deprecated C++ bindings (libmpi_cxx): only MPI's C API is used.
macro(asyncckpt_find_mpi)
  set(MPI_CXX_SKIP_MPICXX ON)
  find_package(MPI QUIET COMPONENTS CXX)
  option(ASYNCCKPT_MPI "Build asyncckpt::mpi (MpiCoordinator) and its mpirun tests (on when MPI is found)"
         ${MPI_CXX_FOUND})
  set(ASYNCCKPT_WITH_MPI OFF)
  if(ASYNCCKPT_MPI)
    if(NOT MPI_CXX_FOUND)
      message(FATAL_ERROR "ASYNCCKPT_MPI=ON but MPI was not found: install libopenmpi-dev and "
                          "openmpi-bin (scripts/setup.sh does), or configure with -DASYNCCKPT_MPI=OFF")
    endif()
    set(ASYNCCKPT_WITH_MPI ON)
    # Open MPI refuses to run as root and to start more ranks than cores without these flags;
    # another MPI's launcher would reject them.
    set(ASYNCCKPT_MPIEXEC_FLAGS "")
    execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _asyncckpt_mpiexec_version
                    ERROR_QUIET RESULT_VARIABLE _asyncckpt_mpiexec_result)
    if(_asyncckpt_mpiexec_version MATCHES "Open MPI|OpenRTE")
      # Unbound: Open MPI pins each rank to one core by default, which leaves the engine's
      # background threads no core of their own.
      set(ASYNCCKPT_MPIEXEC_FLAGS --oversubscribe --allow-run-as-root --bind-to none)
    endif()
    message(STATUS "asyncckpt: MPI enabled (MPI ${MPI_CXX_VERSION}), tests run by "
                   "${MPIEXEC_EXECUTABLE}")
  else()
    message(STATUS "asyncckpt: MPI disabled; asyncckpt::mpi and the mpi tests are not built")
  endif()
endmacro()

# A test of several processes: one *_mpi_test.cc file linked with the MPI gtest main
# (tests/support/mpi_gtest_main.cc: MPI_Init_thread, gtest, MPI_Finalize; rank 0 prints the
# report, other ranks their failures), registered once per rank count given, as
# `mpirun --oversubscribe --allow-run-as-root -np N <binary>`, label "mpi". Without MPI each
# is registered as a test that reports itself skipped.
function(asyncckpt_add_mpi_test source)
  get_filename_component(name ${source} NAME_WE)
  if(NOT ASYNCCKPT_WITH_MPI)
    foreach(np ${ARGN})
      add_test(NAME ${name}_np${np}
               COMMAND sh -c "echo 'ASYNCCKPT_MPI is off: ${name} needs MPI'; exit 77")
      set_tests_properties(${name}_np${np} PROPERTIES LABELS mpi SKIP_RETURN_CODE 77)
    endforeach()
    return()
  endif()
  add_executable(${name} ${source} ${PROJECT_SOURCE_DIR}/tests/support/mpi_gtest_main.cc)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PRIVATE asyncckpt::mpi asyncckpt asyncckpt_cli_core TBB::tbb
                        zstd::libzstd_shared PkgConfig::liburing PkgConfig::libxxhash GTest::gtest
                        GTest::gmock)
  asyncckpt_warnings(${name})
  foreach(np ${ARGN})
    add_test(NAME ${name}_np${np}
             COMMAND ${MPIEXEC_EXECUTABLE} ${ASYNCCKPT_MPIEXEC_FLAGS} ${MPIEXEC_NUMPROC_FLAG} ${np}
                     ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${name}> ${MPIEXEC_POSTFLAGS})
    # Open MPI's own allocations outlive MPI_Finalize, which LeakSanitizer would report.
    set_tests_properties(${name}_np${np} PROPERTIES
      LABELS mpi TIMEOUT 300 PROCESSORS ${np}
      ENVIRONMENT "ASYNCCKPT_CLI=$<TARGET_FILE:asyncckpt_cli>;ASAN_OPTIONS=detect_leaks=0")
  endforeach()
endfunction()
