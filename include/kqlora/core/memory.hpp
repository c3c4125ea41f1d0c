#pragma once
// Memory accounting: every Kokkos allocation (all of kqlora's device and host buffers are
// Kokkos Views) through Kokkos' tools callbacks, and the process's resident set.

#include <cstdint>

namespace kqlora {

/// Starts counting Kokkos allocations (after Kokkos::initialize); idempotent.
void track_kokkos_allocations();
/// The peak of the bytes held since tracking started (or since reset_tracked_peak).
int64_t tracked_peak_bytes();
/// The bytes held now.
int64_t tracked_bytes();
/// Starts the peak again from the bytes held now (tests: the peak of one phase).
void reset_tracked_peak();

/// Resident set size now, and the process's peak (VmHWM), in bytes; 0 where unknown.
int64_t rss_bytes();
int64_t peak_rss_bytes();
/// Minor page faults of the process so far (pages first touched or mapped again: fresh
/// allocations the kernel zero-fills); 0 where unknown.
int64_t minor_page_faults();

}  // namespace kqlora
