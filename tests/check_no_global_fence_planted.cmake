# The no_global_fence check against planted code (ctest no_global_fence_planted): a tree
# with device-wide synchronisations (a 2-argument deep_copy over three lines, one whose
# first argument holds commas inside a template, one into a view named like an instance,
# create_mirror_view_and_copy, a marked Kokkos::fence, a marker too far above) must fail naming exactly their lines; the same
# tree's instance-ordered, marked and commented-out copies must not be named, and a tree
# of those alone must pass.
#   cmake -DCHECK=tests/check_no_global_fence.cmake -DWORK=<scratch dir> -P this file
cmake_minimum_required(VERSION 3.18)
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/bad/src" "${WORK}/good/src")
set(good [==[
void fine(const Exec& exec, View dst, View src) {
  Kokkos::deep_copy(exec, dst, src);
  Kokkos::deep_copy(
      this->exec_, dst,
      src);
  Kokkos::deep_copy(Kokkos::DefaultHostExecutionSpace(), dst, src);
  Kokkos::deep_copy(dst, src);  // device-wide: set-up
  // device-wide: checkpoint
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), src);
  // Kokkos::deep_copy(dst, src) in a comment
  kqlora::fence(exec, "label");
  exec.fence();
}
]==])
# (line numbers of the bad file: 2, 6, 7, 9, 12, 13)
set(bad [==[
void planted(View dst, View src) {
  Kokkos::deep_copy(
      dst,
      src);
  Kokkos::deep_copy(exec, dst, src);
  Kokkos::deep_copy(Kokkos::View<float*, Kokkos::HostSpace>(p, n), src);
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), src);
  // device-wide: a marker does not excuse a global fence
  Kokkos::fence();
  // device-wide: too far above
  int unrelated = 0;
  Kokkos::deep_copy(dst, 0.0f);
  Kokkos::deep_copy(exec_staging, src);
}
]==])
file(WRITE "${WORK}/good/src/good.cpp" "${good}")
file(WRITE "${WORK}/bad/src/good.cpp" "${good}")
file(WRITE "${WORK}/bad/src/bad.cpp" "${bad}")

execute_process(COMMAND ${CMAKE_COMMAND} -DROOT=${WORK}/good -DMIN_FILES=1 -P ${CHECK}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the clean tree failed the check:\n${out}${err}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -DROOT=${WORK}/bad -DMIN_FILES=1 -P ${CHECK}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "the planted tree passed the check:\n${out}${err}")
endif()
set(all "${out}${err}")
foreach(line 2 6 7 9 12 13)
  if(NOT all MATCHES "src/bad.cpp:${line}:")
    message(FATAL_ERROR "planted line ${line} not reported:\n${all}")
  endif()
endforeach()
string(REGEX MATCHALL "src/[a-z]+\\.cpp:[0-9]+:" named "${all}")
list(LENGTH named n)
if(NOT n EQUAL 6)
  message(FATAL_ERROR "expected exactly the 6 planted lines, got ${n}: ${named}\n${all}")
endif()
message(STATUS "no_global_fence_planted: the 6 planted synchronisations reported, nothing else")
