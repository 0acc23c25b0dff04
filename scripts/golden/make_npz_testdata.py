#!/usr/bin/env python3
"""numpy's own .npz files for io/npz_test.cc: the same three arrays written by numpy.savez (stored
members) and numpy.savez_compressed (deflated members) into io/testdata/npz/, and by numpy.savez with ZIP64 records
(zip64.npz).

    x     float32 [3, 4]  arange(12) / 4
    ids   int64   [3]     [5, -1, 7]
    flag  bool    [3]     [True, False, True]

Run by a developer (numpy from PyPI): python3 scripts/golden/make_npz_testdata.py
"""
import os
import zipfile

import numpy as np

out = os.path.join(os.path.dirname(__file__), "..", "..", "io", "testdata", "npz")
os.makedirs(out, exist_ok=True)
arrays = {
    "x": (np.arange(12, dtype=np.float32) / 4).reshape(3, 4),
    "ids": np.array([5, -1, 7], dtype=np.int64),
    "flag": np.array([True, False, True]),
}
np.savez(os.path.join(out, "savez.npz"), **arrays)
np.savez_compressed(os.path.join(out, "savez_compressed.npz"), **arrays)
# zip64.npz: the same through ZIP64 records (the central directory's widened sizes and offsets, the ZIP64
# end record and its locator), which Python's zipfile writes past 4 GiB: forced here by lowering its limits.
zipfile.ZIP64_LIMIT = 0
zipfile.ZIP_FILECOUNT_LIMIT = 0
np.savez(os.path.join(out, "zip64.npz"), **arrays)
print("wrote", out, "with numpy", np.__version__)
