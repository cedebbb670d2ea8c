# Instrumented builds: `make sanitize` (AddressSanitizer + UndefinedBehaviorSanitizer), `make tsan`
# (ThreadSanitizer) and the libFuzzer targets of tests/fuzz (`make fuzz`, and a bounded run of each
# in `make test`). Each lives in a build folder of its own; the flags apply to every target.
set(PAGEDATTN_SANITIZE "" CACHE STRING "Sanitizers for every target: address,undefined or thread")
option(PAGEDATTN_FUZZ "Build the libFuzzer targets of tests/fuzz (clang only)" OFF)

if(PAGEDATTN_SANITIZE)
  if(PAGEDATTN_HAVE_CUDA)
    message(FATAL_ERROR "PAGEDATTN_SANITIZE: configure with -DPAGEDATTN_CUDA=OFF (CPU code only)")
  endif()
  # NOTE: no recovery: a finding aborts the test that made it, so ctest counts it as a failure.
  add_compile_options(-fsanitize=${PAGEDATTN_SANITIZE} -fno-sanitize-recover=all
                      -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${PAGEDATTN_SANITIZE})
  message(STATUS "pagedattn: sanitizers ${PAGEDATTN_SANITIZE}")
endif()

if(PAGEDATTN_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "PAGEDATTN_FUZZ needs clang (libFuzzer): -DCMAKE_CXX_COMPILER=clang++")
  endif()
  # Coverage feedback for the fuzzer in every library; the fuzz targets link the fuzzer's main.
  add_compile_options(-fsanitize=fuzzer-no-link)
  message(STATUS "pagedattn: libFuzzer targets")
endif()
