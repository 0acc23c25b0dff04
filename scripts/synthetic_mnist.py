#!/usr/bin/env python3
"""Synthetic MNIST and FashionMNIST files in torchvision's format, for running PopTorch programs (Graphcore's
tutorials, W3.3's acceptance suite) on a machine that cannot download the real ones.

    python3 scripts/synthetic_mnist.py [ROOT] [--train 60000] [--test 10000] [--seed 0]

ROOT (default ~/.torch/datasets, where the tutorials look) receives MNIST/raw and FashionMNIST/raw with the
four idx files each (train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-...), which
torchvision.datasets.MNIST / FashionMNIST(ROOT, download=True) then find and read without downloading.
Each class is a template (smooth random blobs, 28x28) shifted by up to 2 pixels, scaled in contrast and
covered in noise: a small CNN learns it to well over 90 %, a linear model less well, so a tutorial's printed
accuracy says whether training worked. The same seed writes the same bytes.
"""

import argparse
import os
import struct

import numpy as np


def templates(rng, classes=10, size=28):
    """Smooth random patterns: a few Gaussian blobs per class, in [0, 1]."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    out = np.zeros((classes, size, size), np.float32)
    for c in range(classes):
        for _ in range(4):
            cy, cx = rng.uniform(6, size - 6, 2)
            s = rng.uniform(2.0, 4.5)
            out[c] += rng.uniform(0.5, 1.0) * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * s * s))
        out[c] /= out[c].max()
    return out


def samples(rng, tmpl, n):
    labels = rng.integers(0, len(tmpl), n).astype(np.uint8)
    images = np.empty((n, 28, 28), np.uint8)
    for i in range(0, n, 4096):
        k = min(4096, n - i)
        lab = labels[i:i + k]
        base = tmpl[lab]
        dy, dx = rng.integers(-2, 3, (2, k))
        shifted = np.stack([np.roll(np.roll(b, y, 0), x, 1) for b, y, x in zip(base, dy, dx)])
        contrast = rng.uniform(0.6, 1.0, (k, 1, 1)).astype(np.float32)
        img = shifted * contrast * 255.0 + rng.normal(0.0, 40.0, (k, 28, 28))
        images[i:i + k] = np.clip(img, 0, 255).astype(np.uint8)
    return images, labels


def write_idx(path, array):
    magic = 0x00000803 if array.ndim == 3 else 0x00000801
    with open(path, "wb") as f:
        f.write(struct.pack(">I", magic))
        f.write(struct.pack(">" + "I" * array.ndim, *array.shape))
        f.write(array.tobytes())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root", nargs="?", default="~/.torch/datasets")
    ap.add_argument("--train", type=int, default=60000)
    ap.add_argument("--test", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.train < 1 or a.test < 1:
        raise SystemExit(f"--train and --test: expected >= 1, found {a.train} and {a.test}")
    root = os.path.expanduser(a.root)
    for k, name in enumerate(["MNIST", "FashionMNIST"]):
        rng = np.random.default_rng(a.seed + k)
        tmpl = templates(rng)
        raw = os.path.join(root, name, "raw")
        os.makedirs(raw, exist_ok=True)
        for split, n in (("train", a.train), ("t10k", a.test)):
            images, labels = samples(rng, tmpl, n)
            write_idx(os.path.join(raw, f"{split}-images-idx3-ubyte"), images)
            write_idx(os.path.join(raw, f"{split}-labels-idx1-ubyte"), labels)
        print(f"{name}: {a.train} training and {a.test} test images in {raw}")


if __name__ == "__main__":
    main()
