# Installs the built tree into a fresh prefix, then configures, builds and runs the project in
# tests/e2e/consumer against that prefix alone, and checks the installed CLI on what it wrote.
# Proves that find_package(asyncckpt) and the asyncckpt::asyncckpt target work for a user.
#
#   cmake -DBINARY_DIR=<asyncckpt build dir> -DSOURCE_DIR=<asyncckpt source dir>
#         -DGENERATOR=<CMake generator> -DWORK_DIR=<scratch dir, wiped first>
#         [-DMAKE_PROGRAM=<ninja/make>] [-DCXX_COMPILER=<c++>] [-DCONFIG=<build type>]
#         [-DEXTRA_FLAGS=<compile and link flags, e.g. sanitizers>] [-DCUDA_ROOT=<toolkit>]
#         -P install_consumer_test.cmake
#
# The scratch directory is removed after a success and kept after a failure, for a look.

cmake_minimum_required(VERSION 3.25)

foreach(required BINARY_DIR SOURCE_DIR GENERATOR WORK_DIR)
  if(NOT DEFINED ${required} OR "${${required}}" STREQUAL "")
    message(FATAL_ERROR "install_consumer_test: -D${required}=... is required")
  endif()
endforeach()

set(prefix "${WORK_DIR}/prefix")
set(build "${WORK_DIR}/build")
set(checkpoints "${WORK_DIR}/checkpoints")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

# Runs a command; on failure stops with `what`, the command and everything it printed.
function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT code EQUAL 0)
    list(JOIN ARGN " " command)
    message(FATAL_ERROR "install_consumer_test: ${what} failed (${code}); "
                        "scratch kept in ${WORK_DIR}\n$ ${command}\n${out}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

# 1. Install.
set(config_args "")
if(DEFINED CONFIG AND NOT CONFIG STREQUAL "")
  set(config_args --config "${CONFIG}")
endif()
run_step("cmake --install" "${CMAKE_COMMAND}" --install "${BINARY_DIR}" --prefix "${prefix}"
         ${config_args})
foreach(installed include/asyncckpt/saver_hook.h include/asyncckpt/reader.h bin/asyncckpt)
  if(NOT EXISTS "${prefix}/${installed}")
    message(FATAL_ERROR "install_consumer_test: the install lacks ${installed}")
  endif()
endforeach()
file(GLOB_RECURSE package_config "${prefix}/*/asyncckptConfig.cmake")
if(NOT package_config)
  message(FATAL_ERROR "install_consumer_test: the install lacks asyncckptConfig.cmake")
endif()

# 2. Configure and build the consumer against the prefix, and nothing else of ours.
set(configure_args
    -S "${SOURCE_DIR}/tests/e2e/consumer" -B "${build}" -G "${GENERATOR}"
    "-DCMAKE_PREFIX_PATH=${prefix}"
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
if(DEFINED CONFIG AND NOT CONFIG STREQUAL "")
  list(APPEND configure_args "-DCMAKE_BUILD_TYPE=${CONFIG}")
endif()
if(DEFINED MAKE_PROGRAM AND NOT MAKE_PROGRAM STREQUAL "")
  list(APPEND configure_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(DEFINED CXX_COMPILER AND NOT CXX_COMPILER STREQUAL "")
  list(APPEND configure_args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
if(DEFINED EXTRA_FLAGS AND NOT EXTRA_FLAGS STREQUAL "")
  list(APPEND configure_args "-DCMAKE_CXX_FLAGS=${EXTRA_FLAGS}"
       "-DCMAKE_EXE_LINKER_FLAGS=${EXTRA_FLAGS}")
endif()
if(DEFINED CUDA_ROOT AND NOT CUDA_ROOT STREQUAL "")
  list(APPEND configure_args "-DCUDAToolkit_ROOT=${CUDA_ROOT}")
endif()
run_step("configuring the consumer" "${CMAKE_COMMAND}" ${configure_args})
file(STRINGS "${build}/CMakeCache.txt" found_dir REGEX "^asyncckpt_DIR:")
string(REGEX REPLACE "^asyncckpt_DIR:[A-Z]+=" "" found_dir "${found_dir}")
cmake_path(IS_PREFIX prefix "${found_dir}" NORMALIZE found_in_prefix)
if(NOT found_in_prefix)
  message(FATAL_ERROR "install_consumer_test: the consumer found asyncckpt in '${found_dir}', "
                      "not in the install prefix ${prefix}")
endif()
run_step("building the consumer" "${CMAKE_COMMAND}" --build "${build}" ${config_args})

# 3. Run it: one checkpoint saved and read back through the installed library.
set(consumer "${build}/consumer")
if(NOT EXISTS "${consumer}" AND EXISTS "${build}/${CONFIG}/consumer")
  set(consumer "${build}/${CONFIG}/consumer")
endif()
run_step("running the consumer" "${consumer}" "${checkpoints}")
message(STATUS "${step_output}")
# The MPI coordinator, when the install has asyncckpt::mpi (one process, MPI's singleton start).
foreach(candidate "${build}/mpi_consumer" "${build}/${CONFIG}/mpi_consumer")
  if(EXISTS "${candidate}")
    run_step("running the MPI consumer" "${candidate}")
    message(STATUS "${step_output}")
    break()
  endif()
endforeach()

# 4. The installed CLI finds and verifies what the consumer wrote.
run_step("asyncckpt latest" "${prefix}/bin/asyncckpt" latest "${checkpoints}")
string(STRIP "${step_output}" latest)
if(NOT latest STREQUAL "${checkpoints}/model.ckpt-0")
  message(FATAL_ERROR "install_consumer_test: asyncckpt latest printed '${latest}', "
                      "expected ${checkpoints}/model.ckpt-0")
endif()
run_step("asyncckpt verify" "${prefix}/bin/asyncckpt" verify "${latest}")

file(REMOVE_RECURSE "${WORK_DIR}")
message(STATUS "install_consumer_test: OK")
