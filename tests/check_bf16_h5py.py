#!/usr/bin/env python3
"""Reads the bfloat16 dataset that test_io wrote (tmp_bf16_for_h5py.h5) with h5py, which
knows nothing of bfloat16 beyond the file's 2-byte float type, and compares it with an
independent NumPy rounding of the float32 source to bfloat16 (nearest even)."""
import sys

import h5py
import numpy as np

with h5py.File(sys.argv[1], "r") as f:
    src = f["source"][...]
    got = f["bf16"][...]
    stored = f["bf16"].id.get_type()
    assert stored.get_size() == 2 and stored.get_class() == h5py.h5t.FLOAT, stored
assert got.dtype == np.float32, got.dtype  # h5py maps the custom float to float32

u = src.astype(np.float32).view(np.uint32).astype(np.uint64)
rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
expected = rounded.astype(np.uint32).view(np.float32)
bad = ~((got == expected) | (np.isnan(got) & np.isnan(expected)))
bad |= np.signbit(got) != np.signbit(expected)
if bad.any():
    i = np.flatnonzero(bad)[0]
    print(f"FAILED: {bad.sum()} values differ, first at {i}: h5py {got.flat[i]!r}, expected {expected.flat[i]!r}")
    sys.exit(1)
print(f"h5py read {got.size} bfloat16 values, all equal to NumPy's rounding")
