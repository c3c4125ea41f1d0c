# No device-wide synchronisation in the library or the apps. On CUDA Kokkos::fence() is
# cudaDeviceSynchronize, which waits for every stream, the NCCL communication stream too,
# so a dead or stopped peer would hang the job instead of reaching comm_timeout_s; the
# same holds for every 2-argument Kokkos::deep_copy and every
# Kokkos::create_mirror_view_and_copy (they fence all execution spaces, on Kokkos 4 even
# between two host views). Fence the instance the work ran on (kqlora::fence(exec,
# label), core/kokkos_compat.hpp) and copy on it (Kokkos::deep_copy(exec, dst, src)).
#
# Fails, naming every file and line, on:
#   - Kokkos::fence( and fence_all(
#   - create_mirror_view_and_copy(
#   - deep_copy( with two arguments (counted outside brackets, over as many lines as the
#     call takes): the instance-ordered form has three, the execution-space instance first.
# except a call that carries a marker comment `device-wide: WHY` (on one of its lines, or
# on a comment line right above it) saying why a device-wide sync is fine there: outside
# the step (set-up, checkpoint, export, end of run), with no collective in flight.
# Text after // is not scanned. Run by ctest as `no_global_fence`:
#   cmake -DROOT=<source dir> -P tests/check_no_global_fence.cmake
# MIN_FILES (default 50) guards against a wrong ROOT; the negative test sets it to 1.
cmake_minimum_required(VERSION 3.18)
if(NOT DEFINED MIN_FILES)
  set(MIN_FILES 50)
endif()
file(GLOB_RECURSE files "${ROOT}/src/*.cpp" "${ROOT}/src/*.hpp" "${ROOT}/include/*.hpp"
     "${ROOT}/apps/*.cpp" "${ROOT}/apps/*.hpp")
set(bad "")
set(marked 0)
set(instance_copies 0)

foreach(f IN LISTS files)
  file(READ "${f}" text)
  # (CMake lists split at ';' and treat brackets specially: the text is scanned as one
  # string, with both replaced by neutral characters, brackets by parentheses in pairs)
  string(REPLACE ";" "," text "${text}")
  string(REPLACE "[" "(" text "${text}")
  string(REPLACE "]" ")" text "${text}")
  # Comments out, line breaks kept (so line numbers agree with `text`).
  string(REGEX REPLACE "//[^\n]*" "" code "${text}")
  file(RELATIVE_PATH rel "${ROOT}" "${f}")
  set(all_lines "")
  set(rest "${code}")
  set(offset 0)
  while(TRUE)
    string(REGEX MATCH
           "(^|[^A-Za-z0-9_])(Kokkos::fence|fence_all|create_mirror_view_and_copy|deep_copy)[ \t\n]*\\("
           m "${rest}")
    if(NOT m)
      break()
    endif()
    string(FIND "${rest}" "${m}" at)
    string(LENGTH "${m}" mlen)
    math(EXPR start "${offset} + ${at}")
    math(EXPR offset "${offset} + ${at} + ${mlen}")  # just past the '('
    string(SUBSTRING "${code}" ${offset} -1 rest)
    # The call's text up to its closing parenthesis (within 4000 characters), and its
    # top-level commas.
    string(SUBSTRING "${rest}" 0 4000 window)
    string(LENGTH "${window}" wlen)
    set(depth 1)
    set(angle 0)
    set(commas 0)
    set(i 0)
    while(depth GREATER 0 AND i LESS wlen)
      string(SUBSTRING "${window}" ${i} 1 c)
      if(c STREQUAL "(")
        math(EXPR depth "${depth} + 1")
      elseif(c STREQUAL ")")
        math(EXPR depth "${depth} - 1")
      elseif(c STREQUAL "<")
        math(EXPR angle "${angle} + 1")
      elseif(c STREQUAL ">" AND angle GREATER 0)
        math(EXPR angle "${angle} - 1")
      elseif(c STREQUAL "," AND depth EQUAL 1 AND angle EQUAL 0)
        math(EXPR commas "${commas} + 1")
      endif()
      math(EXPR i "${i} + 1")
    endwhile()
    math(EXPR close "${offset} + ${i}")

    set(markable TRUE)
    if(m MATCHES "deep_copy")
      # (three arguments: deep_copy(instance, dst, src); a two-argument call whose first
      # argument happens to be named like an instance is still device-wide)
      if(commas EQUAL 2)
        math(EXPR instance_copies "${instance_copies} + 1")
        continue()
      endif()
    elseif(NOT m MATCHES "create_mirror_view_and_copy")
      set(markable FALSE)  # a global fence: never
    endif()
    # Lines l0..l1 (1-based) of the call.
    string(SUBSTRING "${code}" 0 ${start} before)
    string(REGEX REPLACE "[^\n]" "" nl "${before}")
    string(LENGTH "${nl}" l0)
    string(SUBSTRING "${code}" 0 ${close} before)
    string(REGEX REPLACE "[^\n]" "" nl "${before}")
    string(LENGTH "${nl}" l1)
    if(NOT all_lines)
      string(REGEX MATCHALL "[^\n]*\n" all_lines "${text}\n")
    endif()
    list(LENGTH all_lines nlines)
    # (0-based now: l0 is the call's first line; the marker may be on l0 - 1 if that is a
    # comment line, or on any line of the call)
    set(has_marker FALSE)
    if(markable)
      math(EXPR from "${l0} - 1")
      if(from LESS 0)
        set(from 0)
      endif()
      foreach(k RANGE ${from} ${l1})
        if(k GREATER_EQUAL nlines)
          break()
        endif()
        list(GET all_lines ${k} ln)
        if(k LESS l0 AND NOT ln MATCHES "^[ \t]*//")
          continue()
        endif()
        if(ln MATCHES "device-wide:")
          set(has_marker TRUE)
        endif()
      endforeach()
    endif()
    if(has_marker)
      math(EXPR marked "${marked} + 1")
      continue()
    endif()
    list(GET all_lines ${l0} shown)
    string(STRIP "${shown}" shown)
    math(EXPR shown_line "${l0} + 1")
    string(APPEND bad "\n  ${rel}:${shown_line}: ${shown}")
  endwhile()
endforeach()
list(LENGTH files n)
if(n LESS MIN_FILES)
  message(FATAL_ERROR "no_global_fence: only ${n} source files found under ${ROOT}")
endif()
if(bad)
  message(FATAL_ERROR
          "device-wide synchronisations (copy and fence on the execution-space instance, "
          "Kokkos::deep_copy(exec, dst, src) and kqlora::fence(exec, label), or mark one outside "
          "the step with a `// device-wide: WHY` comment):${bad}")
endif()
message(STATUS "no_global_fence: ${n} files, no Kokkos::fence(), fence_all(), 2-argument "
               "deep_copy or create_mirror_view_and_copy; ${instance_copies} instance-ordered "
               "copies, ${marked} marked device-wide")
