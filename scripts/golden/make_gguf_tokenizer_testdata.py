#!/usr/bin/env python3
"""Writes io/testdata/gguf/gpt2-tiny-vocab.gguf for io/gguf_tokenizer_test.cc: the tokenizer (and config) of
models/testdata/gpt2-tiny as llama.cpp's own converter (convert_hf_to_gguf.py --vocab-only, from the
llama-cpp-python source distribution bench/llama_cpp.py fetches) writes it into a GGUF file. The test checks that
aspen's tokenizer rebuilt from the file gives the ids the Hugging Face files give.

    python3 scripts/golden/make_gguf_tokenizer_testdata.py [--sdist llama_cpp_python-X.tar.gz]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import llama_cpp  # noqa: E402  (bench/llama_cpp.py: source_tree, VERSION)

ap = argparse.ArgumentParser()
ap.add_argument("--sdist", help="a llama_cpp_python-*.tar.gz to use instead of downloading one")
a = ap.parse_args()
cache = Path(os.environ.get("ASPEN_CACHE_DIR", Path.home() / ".cache" / "aspen")) / "llama.cpp"
cache.mkdir(parents=True, exist_ok=True)
llama = llama_cpp.source_tree(cache, llama_cpp.VERSION, a.sdist)
model = ROOT / "models" / "testdata" / "gpt2-tiny"
out = ROOT / "io" / "testdata" / "gguf" / "gpt2-tiny-vocab.gguf"
with tempfile.TemporaryDirectory() as tmp:
    stage = Path(tmp)
    for p in model.iterdir():
        if p.is_file() and p.name != "config.json":
            (stage / p.name).symlink_to(p.resolve())
    config = json.loads((model / "config.json").read_text())
    config.setdefault("n_ctx", config["n_positions"])  # the converter's name for GPT-2's context length
    (stage / "config.json").write_text(json.dumps(config))
    worker = (
        "import sys\n"
        f"sys.path[:0] = [{str(llama)!r}, {str(llama / 'gguf-py')!r}]\n"
        "import conversion.base as base\n"
        "known = base.TextModel.get_vocab_base_pre\n"
        "def pre(self, tokenizer):\n"  # the tiny vocabulary has no known hash: it is GPT-2's split
        "    try:\n"
        "        return known(self, tokenizer)\n"
        "    except NotImplementedError:\n"
        "        return 'gpt-2'\n"
        "base.TextModel.get_vocab_base_pre = pre\n"
        "import convert_hf_to_gguf as c\n"
        f"sys.argv = ['convert_hf_to_gguf.py', {str(stage)!r}, '--vocab-only', '--outfile', {str(out)!r}]\n"
        "c.main()\n")
    subprocess.run([sys.executable, "-c", worker], check=True, stdout=subprocess.DEVNULL)
print(out, out.stat().st_size, "bytes")
