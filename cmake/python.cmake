# Python and nanobind for the Python package (python/). Sets PAGEDATTN_HAVE_PYTHON, and
# PAGEDATTN_PYTHON_MISSING to why it is off. When on, every static library is built as
# position-independent code: they are linked into the extension module.
set(PAGEDATTN_HAVE_PYTHON OFF)
set(PAGEDATTN_PYTHON_MISSING "PAGEDATTN_PYTHON=OFF")
if(NOT PAGEDATTN_PYTHON STREQUAL "OFF")
  find_package(Python 3.9 COMPONENTS Interpreter Development.Module)
  set(PAGEDATTN_PYTHON_MISSING "no Python interpreter with its development headers")
  if(Python_FOUND)
    execute_process(COMMAND ${Python_EXECUTABLE} -m nanobind --cmake_dir
                    OUTPUT_VARIABLE nanobind_cmake_dir OUTPUT_STRIP_TRAILING_WHITESPACE
                    RESULT_VARIABLE nanobind_rc ERROR_QUIET)
    set(PAGEDATTN_PYTHON_MISSING
        "nanobind is not importable by ${Python_EXECUTABLE} (scripts/setup.sh installs it)")
    if(nanobind_rc EQUAL 0)
      find_package(nanobind CONFIG PATHS ${nanobind_cmake_dir} NO_DEFAULT_PATH)
    endif()
  endif()
  if(nanobind_FOUND)
    set(PAGEDATTN_HAVE_PYTHON ON)
    set(CMAKE_POSITION_INDEPENDENT_CODE ON)
  elseif(PAGEDATTN_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "PAGEDATTN_PYTHON=ON but ${PAGEDATTN_PYTHON_MISSING}")
  endif()
endif()
message(STATUS "pagedattn: Python package ${PAGEDATTN_HAVE_PYTHON}")

# pip install . starts a fresh build tree: reuse compiled objects through ccache when it is there.
if(PAGEDATTN_LIBS_ONLY AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  find_program(PAGEDATTN_CCACHE ccache)
  if(PAGEDATTN_CCACHE)
    set(CMAKE_CXX_COMPILER_LAUNCHER ${PAGEDATTN_CCACHE})
    set(CMAKE_CUDA_COMPILER_LAUNCHER ${PAGEDATTN_CCACHE})
  endif()
endif()
