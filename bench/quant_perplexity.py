#!/usr/bin/env python3
"""What quantized weights cost in accuracy (W3.4): perplexity of one model in f32 and in llama.cpp's block
formats, measured by aspen and by llama.cpp on the very same GGUF files.

    python3 bench/quant_perplexity.py --model DIR --text FILE [--ctx 128] [--threads 2]
        [--dtypes f32,q8_0,q4_0,q4_k] [--aspen build/release/tools/aspen] [--json]

DIR is a Hugging Face directory (config.json, model.safetensors, a tokenizer), e.g. the `model/` that
`aspen train` exports; FILE is held-out text. bench/llama_cpp.py makes the GGUF files (its converter, and
`llama-quantize --pure` for the 4-bit formats) and builds `llama-perplexity` once per CPU. Both tools score
the same windows: the tokens cut into windows of --ctx, each window's second half scored (llama-perplexity's
method; aspen's `aspen perplexity`, models/perplexity.h). Each row prints both perplexities and each tool's
change against its own f32 row, which is what the issue's goals compare (Q8_0 within 0.01 of f32; Q4 within
llama.cpp's own change).
"""

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import llama_cpp  # noqa: E402


def llama_perplexity(bin: Path, gguf: Path, a):
    """llama-perplexity's final estimate and its number of windows. Its log is written by a thread that does not
    always flush the last lines before the process exits: the running estimate after the last window (the
    same number) is taken when the final line is missing, and the run is repeated when both are."""
    cmd = [str(bin / "llama-perplexity"), "-m", str(gguf), "-f", a.text, "-c", str(a.ctx), "-b", str(a.ctx),
           "-t", str(a.threads)]
    out = ""
    for _ in range(3):
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out = r.stdout
        if r.returncode != 0:
            break
        chunks = re.search(r"calculating perplexity over (\d+) chunks", out)
        windows = int(chunks.group(1)) if chunks else None
        final = re.search(r"Final estimate: PPL = ([0-9.]+)", out)
        if final:
            return float(final.group(1)), windows
        running = re.findall(r"\[(\d+)\]([0-9.]+)", out)
        if running and windows and int(running[-1][0]) == windows:
            return float(running[-1][1]), windows
    sys.exit(f"quant_perplexity.py: llama-perplexity on {gguf} failed:\n{out[-2000:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtypes", default="f32,q8_0,q4_0,q4_k")
    ap.add_argument("--aspen", default=str(HERE.parent / "build" / "release" / "tools" / "aspen"))
    ap.add_argument("--cache", help="as bench/llama_cpp.py's --cache")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    dtypes = [d for d in a.dtypes.split(",") if d]
    if "f32" not in dtypes:
        dtypes.insert(0, "f32")

    cache = llama_cpp.cache_dir(a.cache)
    llama = llama_cpp.source_tree(cache, llama_cpp.VERSION, None)
    bin = llama_cpp.build(cache, llama_cpp.VERSION, llama)
    rows = []
    for d in dtypes:
        gguf = llama_cpp.convert(cache / "gguf", llama, Path(a.model), d, bin)
        r = subprocess.run([a.aspen, "perplexity", "--model", str(gguf), "--text", a.text, "--ctx", str(a.ctx),
                            "--threads", str(a.threads), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
        if r.returncode != 0:
            sys.exit(f"quant_perplexity.py: aspen perplexity on {gguf} failed:\n{r.stderr[-2000:]}")
        ours = json.loads(r.stdout.strip().splitlines()[-1])
        ppl, windows = llama_perplexity(bin, gguf, a)
        rows.append({"dtype": d, "gguf": str(gguf), "aspen": ours["perplexity"], "aspen_scored": ours["scored"],
                     "llama_cpp": ppl, "llama_cpp_windows": windows,
                     "aspen_windows": ours["windows"]})
    base = rows[0]
    for row in rows:
        row["aspen_delta"] = row["aspen"] - base["aspen"]
        row["llama_cpp_delta"] = row["llama_cpp"] - base["llama_cpp"]
        if a.json:
            print(json.dumps({"bench": "quant_perplexity", "ctx": a.ctx, **row}), flush=True)
    if not a.json:
        print(f"# {a.model} on {a.text}, windows of {a.ctx} tokens, second halves scored "
              f"({base['aspen_windows']} windows aspen, {base['llama_cpp_windows']} llama.cpp)")
        print(f"{'dtype':<6} | {'aspen':>10} {'delta':>8} | {'llama.cpp':>10} {'delta':>8}")
        for row in rows:
            print(f"{row['dtype']:<6} | {row['aspen']:10.4f} {row['aspen_delta']:+8.4f} | "
                  f"{row['llama_cpp']:10.4f} {row['llama_cpp_delta']:+8.4f}")


if __name__ == "__main__":
    main()
