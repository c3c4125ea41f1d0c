#pragma once
// An HDF5 file driver for laying out a new file before ranks fill it in parallel: POSIX
// I/O like HDF5's sec2 driver, except that a write of nothing but zero bytes past
// everything written so far is left as a hole (the file is extended to its end-of-address
// when it closes, and a hole reads as zeros: the same bytes).
//
// Why: HDF5 allocates every chunk of a filtered dataset when a parallel file creates it
// and writes a filler into each (zeros, whose Fletcher32 checksum is zero) -- a pass over
// the whole checkpoint through the page cache before the real one. Laid out with this
// driver, the chunks get their addresses and sizes in the file's index but cost no I/O;
// the ranks then write every chunk themselves.

#include <hdf5.h>

namespace kqlora::h5 {

/// A file access property list selecting the layout driver (registered on first use).
hid_t layout_fapl();

}  // namespace kqlora::h5
