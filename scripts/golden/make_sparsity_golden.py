#!/usr/bin/env python3
"""Writes kernels/testdata/sparsity_layouts.txt: DeepSpeed's block-sparse attention layouts, the
goldens of kernels/attention_layout_test.cc (run by a developer, not by CI).

The oracle is deepspeed/ops/sparse_attention/sparsity_config.py of DeepSpeed 0.14.4 (later
versions deleted it). It needs only torch and random, so the file is imported on its own by path,
without installing DeepSpeed or building its ops:

    pip download "deepspeed==0.14.4" --no-deps --no-binary :all: -d /tmp/ds
    tar -xzf /tmp/ds/deepspeed-0.14.4.tar.gz -C /tmp/ds
    python3 scripts/golden/make_sparsity_golden.py \
        [--sparsity-config /tmp/ds/deepspeed-0.14.4/deepspeed/ops/sparse_attention/sparsity_config.py]

Made with python 3.11.7 and torch 2.15.0 (CPU); the layouts do not depend on the torch version.

The file, one record a line ('#' starts a comment line):

    layout NAME kind=K seq_len=N FIELD=VALUE ... bits=B
    random NAME kind=K seq_len=N FIELD=VALUE ... candidates=C bits=B
    error  NAME kind=K seq_len=N FIELD=VALUE ...

kind is aspen's name of the DeepSpeed class (dense, fixed, variable, bigbird, bslongformer,
local_sliding_window). The FIELD=VALUE pairs are exactly the constructor arguments passed to
DeepSpeed (num_heads always); every other argument keeps DeepSpeed's default, so the test builds the
config from aspen's factory for the kind and checks the defaults too. Values: integers, true/false,
the attention string as given, lists as [1,2,3] (no spaces).

bits is make_layout(seq_len) flattened in [num_heads, blocks, blocks] order, one '0' or '1' per
block. Python's random.sample cannot be reproduced, so a `random` record holds the layout DeepSpeed
makes with num_random_blocks=0, and the rule aspen must follow instead: every row of every layout
head adds R distinct random blocks among the candidates C (R: the record's num_random_blocks, or the
kind's default, 1 for bigbird), `all` (columns 0..blocks-1) or `causal`
(columns 0..row). The script checks that rule against DeepSpeed's own random layouts for several
Python seeds. An `error` record is a config DeepSpeed rejects (it raises, sometimes by accident:
ZeroDivisionError, IndexError, ...); the comment line above it quotes DeepSpeed's exception.

Deterministic: running the script twice writes identical bytes.
"""

import argparse
import hashlib
import importlib.util
import random
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "kernels" / "testdata" / "sparsity_layouts.txt"
DEFAULT_CONFIG = Path("/tmp/ds/deepspeed-0.14.4/deepspeed/ops/sparse_attention/sparsity_config.py")
COMMAND = "python3 scripts/golden/make_sparsity_golden.py"

CLASSES = {
    "dense": "DenseSparsityConfig",
    "fixed": "FixedSparsityConfig",
    "variable": "VariableSparsityConfig",
    "bigbird": "BigBirdSparsityConfig",
    "bslongformer": "BSLongformerSparsityConfig",
    "local_sliding_window": "LocalSlidingWindowSparsityConfig",
}

# (name, kind, seq_len, constructor arguments). Every one is deterministic: num_random_blocks is 0
# (given explicitly for bigbird, whose default is 1).
LAYOUTS = [
    ("dense", "dense", 128, dict(num_heads=2)),
    ("dense_block32_per_head", "dense", 256, dict(num_heads=3, block=32, different_layout_per_head=True)),
    ("fixed_default", "fixed", 256, dict(num_heads=2)),
    ("fixed_unidirectional", "fixed", 256, dict(num_heads=2, attention="unidirectional")),
    ("fixed_horizontal", "fixed", 256, dict(num_heads=2, horizontal_global_attention=True)),
    # 18 blocks in windows of 5: a short last window of 3
    ("fixed_short_last_window", "fixed", 288, dict(num_heads=2, num_local_blocks=5)),
    ("fixed_short_last_window_uni_g2", "fixed", 320,
     dict(num_heads=2, num_local_blocks=6, num_global_blocks=2, attention="unidirectional")),
    ("fixed_short_last_window_horizontal", "fixed", 224,
     dict(num_heads=2, num_local_blocks=4, horizontal_global_attention=True)),
    ("fixed_patterns2", "fixed", 256,
     dict(num_heads=4, different_layout_per_head=True, num_different_global_patterns=2)),
    ("fixed_patterns4_horizontal", "fixed", 224,
     dict(num_heads=5, different_layout_per_head=True, num_different_global_patterns=4,
          horizontal_global_attention=True)),
    ("fixed_patterns3_uni_g2", "fixed", 512,
     dict(num_heads=3, block=32, different_layout_per_head=True, num_local_blocks=8, num_global_blocks=2,
          num_different_global_patterns=3, attention="unidirectional")),
    ("fixed_per_head_one_pattern", "fixed", 128, dict(num_heads=3, different_layout_per_head=True)),
    # 3 blocks, fewer than num_global_blocks: DeepSpeed's last-window start is negative and Python's
    # slicing counts it from the end (see NOTE [fixed negative start] in attention_layout.cc)
    ("fixed_fewer_blocks_than_global", "fixed", 48, dict(num_heads=2, num_local_blocks=8, num_global_blocks=4)),
    ("fixed_fewer_blocks_than_global_uni", "fixed", 80,
     dict(num_heads=2, num_local_blocks=8, num_global_blocks=8, attention="unidirectional")),
    ("variable_default", "variable", 256, dict(num_heads=2)),
    ("variable_windows", "variable", 256, dict(num_heads=2, local_window_blocks=[1, 2, 3])),
    ("variable_windows_uni_globals", "variable", 256,
     dict(num_heads=2, local_window_blocks=[2, 4], global_block_indices=[0, 5, 30], attention="unidirectional")),
    ("variable_end_indices_horizontal", "variable", 256,
     dict(num_heads=2, local_window_blocks=[4, 2], global_block_indices=[1, 10], global_block_end_indices=[3, 40],
          horizontal_global_attention=True)),
    ("variable_end_indices_uni", "variable", 384,
     dict(num_heads=3, block=32, different_layout_per_head=True, local_window_blocks=[3],
          global_block_indices=[2, 7], global_block_end_indices=[4, 9], attention="unidirectional")),
    ("variable_windows_past_end", "variable", 128,
     dict(num_heads=2, local_window_blocks=[5, 20, 2], global_block_indices=[3, 9])),
    ("bslongformer_default", "bslongformer", 256, dict(num_heads=2)),
    ("bslongformer_uni", "bslongformer", 256,
     dict(num_heads=2, num_sliding_window_blocks=5, global_block_indices=[0, 9], attention="unidirectional")),
    ("bslongformer_end_indices_even_window", "bslongformer", 512,
     dict(num_heads=2, block=32, num_sliding_window_blocks=4, global_block_indices=[2, 12],
          global_block_end_indices=[4, 100])),
    ("bslongformer_end_indices_uni", "bslongformer", 192,
     dict(num_heads=3, different_layout_per_head=True, global_block_indices=[5, 20], global_block_end_indices=[7, 30],
          attention="unidirectional")),
    ("local_default", "local_sliding_window", 256, dict(num_heads=2)),
    ("local_bidirectional", "local_sliding_window", 256,
     dict(num_heads=2, num_sliding_window_blocks=5, attention="bidirectional")),
    ("local_even_window_bidirectional", "local_sliding_window", 512,
     dict(num_heads=2, block=64, num_sliding_window_blocks=4, attention="bidirectional")),
    ("local_uni_window7", "local_sliding_window", 320, dict(num_heads=2, block=32, num_sliding_window_blocks=7)),
    ("bigbird_no_random", "bigbird", 256, dict(num_heads=2, num_random_blocks=0)),
    ("bigbird_no_random_uni", "bigbird", 256,
     dict(num_heads=2, num_random_blocks=0, num_sliding_window_blocks=5, num_global_blocks=2,
          attention="unidirectional")),
    ("bigbird_no_random_no_global", "bigbird", 128, dict(num_heads=2, num_random_blocks=0, num_global_blocks=0)),
    ("bigbird_no_random_full_row", "bigbird", 128,
     dict(num_heads=2, num_random_blocks=0, num_sliding_window_blocks=8, num_global_blocks=8)),
]

# (name, kind, seq_len, constructor arguments with num_random_blocks > 0).
RANDOM = [
    ("bigbird_default", "bigbird", 256, dict(num_heads=2)),
    ("bigbird_r3_per_head", "bigbird", 512,
     dict(num_heads=4, different_layout_per_head=True, num_random_blocks=3, num_sliding_window_blocks=1)),
    ("bigbird_uni", "bigbird", 256, dict(num_heads=2, num_random_blocks=1, attention="unidirectional")),
    ("bigbird_uni_per_head", "bigbird", 256,
     dict(num_heads=3, different_layout_per_head=True, num_random_blocks=1, num_sliding_window_blocks=1,
          num_global_blocks=0, attention="unidirectional")),
    ("bigbird_random_whole_row", "bigbird", 128, dict(num_heads=2, num_random_blocks=8)),
    ("variable_r2", "variable", 256, dict(num_heads=2, num_random_blocks=2)),
    # unidirectional Variable still draws among all blocks of the row (NOTE [variable random blocks])
    ("variable_r3_uni_per_head", "variable", 256,
     dict(num_heads=3, different_layout_per_head=True, num_random_blocks=3, local_window_blocks=[2],
          attention="unidirectional")),
]

# (name, kind, seq_len, constructor arguments) that DeepSpeed rejects, in the constructor or in make_layout.
ERRORS = [
    ("seq_len_not_multiple", "fixed", 100, dict(num_heads=2)),
    ("seq_len_negative", "dense", -32, dict(num_heads=2)),
    ("block_zero", "dense", 128, dict(num_heads=2, block=0)),
    ("fixed_heads_zero", "fixed", 128, dict(num_heads=0)),
    ("fixed_local_not_multiple", "fixed", 256, dict(num_heads=2, num_local_blocks=4, num_global_blocks=3)),
    ("fixed_local_zero", "fixed", 256, dict(num_heads=2, num_local_blocks=0)),
    ("fixed_global_zero", "fixed", 256, dict(num_heads=2, num_global_blocks=0)),
    ("fixed_bad_attention", "fixed", 256, dict(num_heads=2, attention="causal")),
    ("fixed_horizontal_uni", "fixed", 256,
     dict(num_heads=2, attention="unidirectional", horizontal_global_attention=True)),
    ("fixed_patterns_single_layout", "fixed", 256, dict(num_heads=2, num_different_global_patterns=2)),
    ("fixed_patterns_too_many", "fixed", 256,
     dict(num_heads=2, different_layout_per_head=True, num_local_blocks=4, num_global_blocks=2,
          num_different_global_patterns=3)),
    ("fixed_patterns_zero", "fixed", 256,
     dict(num_heads=2, different_layout_per_head=True, num_different_global_patterns=0)),
    ("variable_bad_attention", "variable", 256, dict(num_heads=2, attention="Bidirectional")),
    ("variable_horizontal_uni", "variable", 256,
     dict(num_heads=2, attention="unidirectional", horizontal_global_attention=True)),
    ("variable_end_indices_length", "variable", 256,
     dict(num_heads=2, global_block_indices=[0, 4], global_block_end_indices=[2])),
    ("variable_end_index_not_after_start", "variable", 256,
     dict(num_heads=2, global_block_indices=[0, 4], global_block_end_indices=[2, 4])),
    ("variable_random_more_than_blocks", "variable", 256, dict(num_heads=2, num_random_blocks=17)),
    ("variable_random_negative", "variable", 256, dict(num_heads=2, num_random_blocks=-1)),
    ("variable_no_windows", "variable", 256, dict(num_heads=2, local_window_blocks=[])),
    ("variable_last_window_zero", "variable", 256, dict(num_heads=2, local_window_blocks=[2, 0])),
    ("bigbird_bad_attention", "bigbird", 256, dict(num_heads=2, attention="causal")),
    ("bigbird_random_more_than_blocks", "bigbird", 128, dict(num_heads=2, num_random_blocks=9)),
    ("bigbird_random_negative", "bigbird", 128, dict(num_heads=2, num_random_blocks=-1)),
    ("bigbird_uni_random2", "bigbird", 256, dict(num_heads=2, num_random_blocks=2, attention="unidirectional")),
    ("bigbird_window_more_than_blocks", "bigbird", 128,
     dict(num_heads=2, num_random_blocks=0, num_sliding_window_blocks=9)),
    ("bigbird_global_more_than_blocks", "bigbird", 128, dict(num_heads=2, num_random_blocks=0, num_global_blocks=9)),
    ("bslongformer_end_indices_length", "bslongformer", 256,
     dict(num_heads=2, global_block_indices=[1], global_block_end_indices=[2, 3])),
    ("bslongformer_end_index_not_after_start", "bslongformer", 256,
     dict(num_heads=2, global_block_indices=[5], global_block_end_indices=[3])),
    ("bslongformer_window_more_than_blocks", "bslongformer", 128, dict(num_heads=2, num_sliding_window_blocks=9)),
    ("local_window_more_than_blocks", "local_sliding_window", 128, dict(num_heads=2, num_sliding_window_blocks=9)),
]

RANDOM_SEEDS = range(8)  # Python seeds the candidate rule is checked under


def load_sparsity_config(path):
    spec = importlib.util.spec_from_file_location("deepspeed_sparsity_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make(ds, kind, seq_len, kwargs):
    return getattr(ds, CLASSES[kind])(**kwargs).make_layout(seq_len)


def value_text(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ",".join(str(int(x)) for x in v) + "]"
    return str(v)


def fields_text(kind, seq_len, kwargs):
    return " ".join([f"kind={kind}", f"seq_len={seq_len}"] + [f"{k}={value_text(v)}" for k, v in kwargs.items()])


def bits_text(layout):
    assert layout.dtype == torch.int64 and layout.dim() == 3
    flat = layout.flatten().tolist()
    assert set(flat) <= {0, 1}
    return "".join("1" if x else "0" for x in flat)


def check_random_rule(ds, name, kind, seq_len, kwargs, base, candidates):
    """DeepSpeed's random layouts = base + per row R distinct random blocks among the candidates."""
    r = getattr(ds, CLASSES[kind])(**kwargs).num_random_blocks  # the kind's default when not given
    assert r > 0, name
    heads, blocks = base.shape[0], base.shape[1]
    above_diagonal = False
    for s in RANDOM_SEEDS:
        random.seed(1000 + s)
        full = make(ds, kind, seq_len, kwargs)
        assert full.shape == base.shape, name
        assert bool(((full == 1) | (base == 0)).all()), f"{name}: a base block is missing"
        extra = (full == 1) & (base == 0)
        for h in range(heads):
            for row in range(blocks):
                cols = extra[h, row].nonzero().flatten().tolist()
                assert len(cols) <= r, f"{name}: row {row} has {len(cols)} random blocks, more than {r}"
                if candidates == "causal":
                    assert all(c <= row for c in cols), f"{name}: a random block past row {row}"
                above_diagonal |= any(c > row for c in cols)
        if not kwargs.get("different_layout_per_head", False):
            assert bool((full == full[0]).all()), f"{name}: heads differ with one layout for all heads"
    if candidates == "all" and kwargs.get("attention") == "unidirectional":
        assert above_diagonal, f"{name}: expected random blocks past the diagonal"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sparsity-config", type=Path, default=DEFAULT_CONFIG,
                        help="DeepSpeed 0.14.4's deepspeed/ops/sparse_attention/sparsity_config.py")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if not args.sparsity_config.is_file():
        sys.exit(f"{args.sparsity_config}: not found; see this script's docstring for how to get it")
    ds = load_sparsity_config(args.sparsity_config)
    digest = hashlib.sha256(args.sparsity_config.read_bytes()).hexdigest()

    lines = [
        f"# Made by {COMMAND}; do not edit.",
        "# The oracle: DeepSpeed 0.14.4 deepspeed/ops/sparse_attention/sparsity_config.py",
        f"#   sha256 {digest}",
        "# Format: see the script's docstring.",
    ]
    names = set()
    for name, kind, seq_len, kwargs in LAYOUTS:
        assert name not in names
        names.add(name)
        assert kind != "bigbird" or kwargs.get("num_random_blocks") == 0, name
        layout = make(ds, kind, seq_len, kwargs)
        again = make(ds, kind, seq_len, kwargs)
        assert torch.equal(layout, again), f"{name}: not deterministic"
        lines.append(f"layout {name} {fields_text(kind, seq_len, kwargs)} bits={bits_text(layout)}")
    for name, kind, seq_len, kwargs in RANDOM:
        assert name not in names
        names.add(name)
        base_kwargs = dict(kwargs, num_random_blocks=0)
        base = make(ds, kind, seq_len, base_kwargs)
        unidirectional = kwargs.get("attention") == "unidirectional"
        candidates = "causal" if kind == "bigbird" and unidirectional else "all"
        check_random_rule(ds, name, kind, seq_len, kwargs, base, candidates)
        lines.append(f"random {name} {fields_text(kind, seq_len, kwargs)} candidates={candidates} "
                     f"bits={bits_text(base)}")
    for name, kind, seq_len, kwargs in ERRORS:
        assert name not in names
        names.add(name)
        random.seed(0)
        try:
            make(ds, kind, seq_len, kwargs)
        except Exception as e:  # noqa: BLE001: any exception is DeepSpeed rejecting the config
            message = " ".join(str(e).split())
            lines.append(f"# deepspeed: {type(e).__name__}: {message}")
        else:
            sys.exit(f"{name}: DeepSpeed accepted the config")
        lines.append(f"error {name} {fields_text(kind, seq_len, kwargs)}")

    text = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out.relative_to(REPO) if args.out.is_relative_to(REPO) else args.out}: "
          f"{len(LAYOUTS)} layouts, {len(RANDOM)} random, {len(ERRORS)} errors, {len(text)} bytes")


if __name__ == "__main__":
    main()
