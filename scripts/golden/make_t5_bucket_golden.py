#!/usr/bin/env python3
"""T5's relative position buckets, from transformers itself (run by a developer, not CI).

  pip install torch transformers
  python3 scripts/golden/make_t5_bucket_golden.py

Writes kernels/testdata/t5_buckets.txt: the first line is RANGE; then per
configuration a line "bidirectional num_buckets max_distance" (bidirectional
0 or 1) and a line with the bucket of every relative position from -RANGE to
RANGE (key position minus query position), as
transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket
computes it (f32 logarithms on the CPU).
"""
import pathlib

import torch
from transformers.models.t5.modeling_t5 import T5Attention

OUT = pathlib.Path(__file__).resolve().parents[2] / "kernels" / "testdata" / "t5_buckets.txt"
RANGE = 3000
CONFIGS = [(True, 32, 128), (False, 32, 128), (True, 64, 256), (False, 8, 20), (True, 4, 5), (False, 128, 2048)]


def main():
    rel = torch.arange(-RANGE, RANGE + 1, dtype=torch.long)
    lines = [str(RANGE)]
    for bidirectional, num_buckets, max_distance in CONFIGS:
        b = T5Attention._relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets,
                                                  max_distance=max_distance)
        lines.append(f"{int(bidirectional)} {num_buckets} {max_distance}")
        lines.append(" ".join(str(x) for x in b.tolist()))
    OUT.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
