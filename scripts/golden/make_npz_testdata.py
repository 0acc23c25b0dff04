#!/usr/bin/env python3
"""numpy's own .npz files for io/npz_test.cc: the same three arrays written by numpy.savez (stored
members) and numpy.savez_compressed (deflated members) into io/testdata/npz/.

    x     float32 [3, 4]  arange(12) / 4
    ids   int64   [3]     [5, -1, 7]
    flag  bool    [3]     [True, False, True]

Run by a developer (numpy from PyPI): python3 scripts/golden/make_npz_testdata.py
"""
import os

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
print("wrote", out, "with numpy", np.__version__)
