# The Python package (python/): built when Python 3's development files and pybind11 are found
# (ASYNCCKPT_PYTHON=AUTO) or demanded (ON).
#
# The interpreter is /usr/bin/python3 when it exists and Python3_EXECUTABLE is not given: Debian's
# python3-torch, python3-numpy and python3-pytest belong to it, and a python3 found first on PATH
# (pyenv, a virtual environment) usually cannot import them. Pass -DPython3_EXECUTABLE=... to
# build for another interpreter.
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
    if(NOT Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
      set(Python3_EXECUTABLE /usr/bin/python3 CACHE FILEPATH
          "The Python interpreter the asyncckpt package is built for")
    endif()
    find_package(Python3 COMPONENTS Interpreter Development.Module QUIET)
    if(Python3_FOUND)
      find_package(pybind11 CONFIG QUIET)
    endif()
    if(Python3_FOUND AND pybind11_FOUND)
      set(ASYNCCKPT_WITH_PYTHON ON)
      asyncckpt_python_install_dir()
      message(STATUS "asyncckpt: Python package for ${Python3_EXECUTABLE} "
                     "(${Python3_VERSION}, pybind11 ${pybind11_VERSION}), installed into "
                     "<prefix>/${ASYNCCKPT_PYTHON_INSTALL_DIR}")
    elseif(ASYNCCKPT_PYTHON STREQUAL "ON")
      message(FATAL_ERROR "ASYNCCKPT_PYTHON=ON but Python 3 development files or pybind11 were "
                          "not found (apt install python3-dev pybind11-dev)")
    else()
      message(STATUS "asyncckpt: Python 3 development files or pybind11 not found; Python "
                     "package disabled (apt install python3-dev pybind11-dev)")
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
