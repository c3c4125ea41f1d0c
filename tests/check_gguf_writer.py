#!/usr/bin/env python3
"""kqlora's GGUF writer read by the gguf Python package (ctest gguf_reader, after
test_safetensors_and_hdf5's Gguf.WritesTheFileTheGgufPackageReads wrote the file):

    python3 tests/check_gguf_writer.py DIR        # DIR/writer.gguf and DIR/values.f32

Every metadata key and value; each tensor's name, shape and type; and its bytes equal
to the package's own encoders (gguf.quants: F16 as NumPy's float16, BF16, Q8_0 as ggml)
applied to the float32 values the file was made from. Exit 77 (ctest: skipped) when
gguf or numpy cannot be imported.
"""
import os
import sys

try:
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, quants
except ImportError as e:
    print("SKIPPED: %s (pip install gguf to run this test)" % e)
    sys.exit(77)


def main():
    d = sys.argv[1]
    r = GGUFReader(os.path.join(d, "writer.gguf"))
    values = np.fromfile(os.path.join(d, "values.f32"), dtype=np.float32)
    want = {"general.architecture": "llama", "general.name": "kqlora test",
            "llama.block_count": 2, "test.i32": -7, "llama.rope.freq_base": 10000.0,
            "tokenizer.ggml.add_bos_token": True,
            "tokenizer.ggml.tokens": ["<s>", "hello", "w\u00f6rld", ""],
            "tokenizer.ggml.token_type": [3, 1, 1, 1],
            "tokenizer.ggml.scores": [0.0, -1.5, -2.25, 0.0],
            "gemma3.attention.sliding_window_pattern": [True, False, True]}
    fails = []
    got_keys = [k for k in r.fields if not k.startswith("GGUF.")]
    if got_keys != list(want):
        fails.append("keys %s" % got_keys)
    for k, v in want.items():
        got = r.fields[k].contents()
        if got != v:
            fails.append("%s = %r, expected %r" % (k, got, v))
    tensors = [("t.f32", (3, 64), GGMLQuantizationType.F32),
               ("t.f16", (2, 64), GGMLQuantizationType.F16),
               ("t.bf16", (64,), GGMLQuantizationType.BF16),
               ("t.q8_0", (4, 64), GGMLQuantizationType.Q8_0)]
    if [t.name for t in r.tensors] != [t[0] for t in tensors]:
        fails.append("tensors %s" % [t.name for t in r.tensors])
    at = 0
    for t, (name, shape, qtype) in zip(r.tensors, tensors):
        n = int(np.prod(shape))
        src = values[at:at + n].reshape(shape)
        at += n
        if tuple(int(x) for x in reversed(t.shape.tolist())) != shape or t.tensor_type != qtype:
            fails.append("%s: shape %s type %s" % (name, t.shape.tolist(), t.tensor_type.name))
            continue
        ref = quants.quantize(src, qtype)
        if ref.tobytes() != np.asarray(t.data).tobytes():
            fails.append("%s: bytes differ from gguf.quants" % name)
        back = quants.dequantize(np.asarray(t.data), qtype).reshape(shape)
        print("%s %s %s: bytes = gguf.quants; max |dequantized - source| %.3g"
              % (name, shape, qtype.name, float(np.nanmax(np.abs(np.where(np.isinf(back), 0, back - src))))))
    if at != values.size:
        fails.append("values.f32 holds %d values, the tensors %d" % (values.size, at))
    for f in fails:
        print("FAILED: " + f)
    print("Failed!" if fails else "Passed!")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
