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
                          "configure with -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_C_COMPILER=clang-14, "
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
