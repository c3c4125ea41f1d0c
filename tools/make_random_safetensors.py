#!/usr/bin/env python3
"""Writes a safetensors file of float32 randn tensors with the Python standard library only
(no NumPy or torch), for demos on a bare machine.
    python3 tools/make_random_safetensors.py OUT.safetensors NAME=ROWSxCOLS [NAME=N ...]
"""
import json
import random
import struct
import sys


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    rng = random.Random(42)
    header, blobs, offset = {}, [], 0
    for spec in sys.argv[2:]:
        name, shape_text = spec.split("=")
        shape = [int(d) for d in shape_text.split("x")]
        n = 1
        for d in shape:
            n *= d
        blob = struct.pack(f"<{n}f", *(rng.gauss(0.0, 1.0) for _ in range(n)))
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(sys.argv[1], "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


if __name__ == "__main__":
    main()
