# The Python package (python/): built when Python 3's development files and pybind11 are found
# (ASYNCCKPT_PYTHON=AUTO) or demanded (ON).
#
# The interpreter: Python3_EXECUTABLE when given (scikit-build-core gives it for `pip install .`;
# scripts/setup.sh gives .venv/bin/python), else the project's environment .venv/ when it exists,
# else the python3 that CMake finds first. pybind11 comes from CMake's search paths, else from
# that interpreter (`python -m pybind11 --cmakedir`: the pybind11 of requirements.txt, or of the
# build's isolated environment).
#
# Sets ASYNCCKPT_WITH_PYTHON and, when ON, ASYNCCKPT_PYTHON_INSTALL_DIR (relative to the install
# prefix).
macro(asyncckpt_find_python)
  set(ASYNCCKPT_WITH_PYTHON OFF)
  if(ASYNCCKPT_PYTHON STREQUAL "OFF")
    message(STATUS "asyncckpt: Python package disabled (ASYNCCKPT_PYTHON=OFF)")
  elseif(ASYNCCKPT_ASAN OR ASYNCCKPT_TSAN)
    # An instrumented extension cannot be loaded into an uninstrumented interpreter.
    message(STATUS "asyncckpt: Python package off in sanitizer builds")
  else()
    if(NOT Python3_EXECUTABLE AND EXISTS ${PROJECT_SOURCE_DIR}/.venv/bin/python)
      set(Python3_EXECUTABLE ${PROJECT_SOURCE_DIR}/.venv/bin/python CACHE FILEPATH
          "The Python interpreter the asyncckpt package is built for")
    endif()
    find_package(Python3 COMPONENTS Interpreter Development.Module QUIET)
    if(Python3_FOUND)
      asyncckpt_find_pybind11()
    endif()
    if(Python3_FOUND AND pybind11_FOUND)
      set(ASYNCCKPT_WITH_PYTHON ON)
      asyncckpt_python_install_dir()
      message(STATUS "asyncckpt: Python package for ${Python3_EXECUTABLE} "
                     "(${Python3_VERSION}, pybind11 ${pybind11_VERSION}), installed into "
                     "<prefix>/${ASYNCCKPT_PYTHON_INSTALL_DIR}")
    elseif(ASYNCCKPT_PYTHON STREQUAL "ON")
      message(FATAL_ERROR "ASYNCCKPT_PYTHON=ON but Python 3 development files or pybind11 were "
                          "not found (scripts/setup.sh makes .venv/ with both)")
    else()
      message(STATUS "asyncckpt: Python 3 development files or pybind11 not found; Python "
                     "package disabled (scripts/setup.sh makes .venv/ with both)")
    endif()
  endif()
endmacro()

# pybind11's CMake package: from CMake's search paths, else the one the interpreter can import.
macro(asyncckpt_find_pybind11)
  find_package(pybind11 CONFIG QUIET)
  if(NOT pybind11_FOUND)
    execute_process(COMMAND ${Python3_EXECUTABLE} -m pybind11 --cmakedir
                    OUTPUT_VARIABLE _asyncckpt_pybind11_dir OUTPUT_STRIP_TRAILING_WHITESPACE
                    RESULT_VARIABLE _asyncckpt_pybind11_failed ERROR_QUIET)
    if(NOT _asyncckpt_pybind11_failed)
      find_package(pybind11 CONFIG QUIET PATHS ${_asyncckpt_pybind11_dir} NO_DEFAULT_PATH)
    endif()
  endif()
endmacro()

# Where under the install prefix the package goes, unless ASYNCCKPT_PYTHON_INSTALL_DIR is given:
# the entry of the interpreter's sys.path that lies under CMAKE_INSTALL_PREFIX (on Debian with the
# default prefix /usr/local: lib/python3.X/dist-packages, so that `cmake --install` makes
# `import asyncckpt` work), else the prefix scheme's site-packages (add it to PYTHONPATH).
function(asyncckpt_python_install_dir)
  if(ASYNCCKPT_PYTHON_INSTALL_DIR)
    return()
  endif()
  if(ASYNCCKPT_PYTHON_WHEEL)
    set(ASYNCCKPT_PYTHON_INSTALL_DIR . CACHE STRING "The wheel's platlib is the install prefix")
    return()
  endif()
  set(script [=[
import os, sys, sysconfig
prefix = os.path.realpath(sys.argv[1])
for entry in sys.path:
    entry = os.path.realpath(entry) if entry else ""
    if entry.startswith(prefix + os.sep) and entry.endswith(("site-packages", "dist-packages")):
        print(os.path.relpath(entry, prefix))
        break
else:
    print(os.path.normpath(sysconfig.get_path("platlib", "posix_prefix",
                                              vars={"base": ".", "platbase": "."})))
]=])
  execute_process(COMMAND ${Python3_EXECUTABLE} -c "${script}" ${CMAKE_INSTALL_PREFIX}
                  OUTPUT_VARIABLE dir OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE failed)
  if(failed OR dir STREQUAL "")
    set(dir "lib/python3/dist-packages")
  endif()
  set(ASYNCCKPT_PYTHON_INSTALL_DIR ${dir} CACHE STRING
      "Where `cmake --install` puts the asyncckpt Python package, relative to the prefix")
endfunction()
