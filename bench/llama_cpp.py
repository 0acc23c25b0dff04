#!/usr/bin/env python3
"""llama.cpp peer for `aspen bench generate` (W2.2): llama-bench's pp and tg rows on the same weights.

How aspen's bench calls it (after its own rows, when this script can run):

    python3 bench/llama_cpp.py --json --model DIR --threads T --new-tokens N --prefill P --dtypes f32,bf16

and reads one JSON object per line from stdout (progress and errors go to stderr):

    {"bench": "generate_llama_cpp", "phase": "prefill"|"decode", "batch": 1|8, "dtype": "f32"|"bf16",
     "tokens_per_s": float, "test": "pp256"|"tg32"|"b8 pp8 tg32", "threads": T, "llama_cpp": "<version>"}

What it does, each step cached under --cache (default $ASPEN_CACHE_DIR/llama.cpp, else
~/.cache/aspen/llama.cpp) so that only the first run is slow:
  1. the source: llama.cpp as vendored by the PyPI source distribution of llama-cpp-python (--version,
     default the one measured here); `pip download --no-binary :all:` fetches it unless --sdist names the
     tarball;
  2. the build: `llama-bench`, `llama-batched-bench`, `llama-quantize`, `llama-perplexity` and `llama-tokenize`
     (the golden scripts' oracle) only, Release,
     -DGGML_NATIVE=ON (tuned for this CPU: the build folder's name carries a digest of the CPU's model name and
     flags, so a different machine builds its own), static, no networking; about 10 minutes on 2 cores; the log
     is kept in the build folder;
  3. the model: the directory is converted to GGUF (f32, bf16, f16, q8_0) by the converter that ships beside it
     (`convert_hf_to_gguf.py`, which needs torch and the vendored gguf-py). aspen's bench writes config.json
     and model.safetensors only; for a directory without a tokenizer this script writes a byte-level BPE
     tokenizer of the model's vocabulary size (256 bytes, merges of byte pairs, <|endoftext|>) into a
     staging copy, and a pre-tokenizer that the converter does not recognise is taken as GPT-2's. llama-bench
     feeds random token ids and never tokenizes text, so neither changes what is timed. The GGUF files are
     keyed by the directory's path, size and modification times. q4_0 and q4_k: `llama-quantize --pure` of the
     f32 file (every matrix in that block type). `--gguf-only` prints {"dtype": D, "gguf": PATH} per dtype and
     runs nothing: aspen's bench runs its own rows on the very files llama.cpp is timed on.
  4. the runs: batch 1, `llama-bench -m FILE -t T -p P -n N -r R -o jsonl` (defaults otherwise: flash
     attention auto, repacking on): tokens/s is llama-bench's mean over its R repetitions; batch B > 1
     (--batches), `llama-batched-bench -npp 8 -ntg N -npl B` (B sequences, each its own 8-token prompt, as
     aspen's bench runs them), the best speed_tg (B * N / the time of the N steps) of R runs.

Exit status 2 with a message on stderr when something it needs is missing (cmake, a compiler, network for
the first download, torch for the conversion); 1 on other errors.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "0.3.36"  # llama-cpp-python's sdist that W2.2 was measured against (vendors llama.cpp ggml 0.25.3)


def log(*a):
    print("llama_cpp.py:", *a, file=sys.stderr, flush=True)


def missing(what):
    log(what)
    sys.exit(2)


def cpu_digest():
    name, flags = "", ""
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8", errors="replace"):
            if line.startswith("model name") and not name:
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return hashlib.sha256((name + "|" + flags).encode()).hexdigest()[:12]


def cache_dir(given: str | None) -> Path:
    """--cache, else $ASPEN_CACHE_DIR/llama.cpp, else ~/.cache/aspen/llama.cpp; made if missing."""
    root = Path(os.environ.get("ASPEN_CACHE_DIR") or Path.home() / ".cache/aspen")
    cache = Path(given) if given else root / "llama.cpp"
    cache.mkdir(parents=True, exist_ok=True)
    return cache


def source_tree(cache: Path, version: str, sdist: str | None) -> Path:
    src = cache / f"llama-cpp-python-{version}"
    vendored = src / "vendor" / "llama.cpp"
    if (vendored / "CMakeLists.txt").exists():
        return vendored
    tarball = Path(sdist) if sdist else cache / f"llama_cpp_python-{version}.tar.gz"
    if not tarball.exists():
        log(f"downloading llama-cpp-python {version} (source distribution) into {cache}")
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                            f"llama-cpp-python=={version}", "-d", str(cache)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0 or not tarball.exists():
            missing(f"cannot download llama-cpp-python=={version} with pip ({r.stderr.strip()[-300:]}); "
                    "pass --sdist PATH to a llama_cpp_python-*.tar.gz")
    tmp = Path(tempfile.mkdtemp(dir=cache))
    with tarfile.open(tarball) as t:
        t.extractall(tmp, filter="data")
    tops = [p for p in tmp.iterdir() if p.is_dir()]
    if len(tops) != 1 or not (tops[0] / "vendor" / "llama.cpp" / "CMakeLists.txt").exists():
        shutil.rmtree(tmp)
        sys.exit(f"llama_cpp.py: {tarball} is not a llama-cpp-python source distribution "
                 "(expected one folder with vendor/llama.cpp/CMakeLists.txt)")
    shutil.rmtree(src, ignore_errors=True)
    tops[0].rename(src)
    shutil.rmtree(tmp)
    return vendored


TARGETS = ("llama-bench", "llama-batched-bench", "llama-quantize", "llama-perplexity", "llama-tokenize")
# The weight types: the converter writes the float ones and Q8_0 itself; llama-quantize makes the 4-bit ones
# from the f32 file, `--pure` (every matrix in that one type, no k-quant mixture: Q4_K_M would put some in Q6_K),
# so that aspen and llama.cpp are compared on one format per row.
CONVERTED = ("f32", "bf16", "f16", "q8_0")
QUANTIZED = {"q4_0": "Q4_0", "q4_k": "Q4_K"}


def build(cache: Path, version: str, llama: Path) -> Path:
    """The folder holding the TARGETS' executables, built if any is missing."""
    out = cache / f"build-{version}-{cpu_digest()}"
    if all((out / "bin" / t).exists() for t in TARGETS):
        return out / "bin"
    for tool in ("cmake", "c++"):
        if not shutil.which(tool):
            missing(f"'{tool}' is not installed; it is needed to build llama-bench once")
    out.mkdir(parents=True, exist_ok=True)
    logfile = out / "build.log"
    log(f"building {' and '.join(TARGETS)} once for this CPU (about 10 minutes on 2 cores); log: {logfile}")
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_OPENSSL=OFF",
             "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
             "-DLLAMA_BUILD_APP=OFF"]
    with open(logfile, "w") as f:
        for cmd in (["cmake", "-S", str(llama), "-B", str(out)] + gen + flags,
                    ["cmake", "--build", str(out), "--target", *TARGETS, "-j", str(os.cpu_count() or 2)]):
            f.write("$ " + " ".join(cmd) + "\n")
            f.flush()
            if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode != 0:
                sys.exit(f"llama_cpp.py: building llama.cpp's benches failed; see {logfile}")
    for t in TARGETS:
        if not (out / "bin" / t).exists():
            sys.exit(f"llama_cpp.py: the build finished but {out / 'bin' / t} is missing; see {logfile}")
    return out / "bin"


def bytes_to_unicode():
    """GPT-2's printable stand-ins for the 256 byte values (the byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def write_tokenizer(stage: Path, vocab_size: int):
    """A valid byte-level BPE tokenizer with exactly vocab_size entries (see the module's note)."""
    alphabet = bytes_to_unicode()
    vocab = {t: i for i, t in enumerate(alphabet)}
    merges = []
    for a in alphabet:
        for b in alphabet:
            if len(vocab) >= vocab_size - 1:
                break
            if a + b not in vocab:
                vocab[a + b] = len(vocab)
                merges.append(f"{a} {b}")
    vocab["<|endoftext|>"] = len(vocab)
    if len(vocab) != vocab_size:
        sys.exit(f"llama_cpp.py: cannot make a tokenizer of {vocab_size} entries (made {len(vocab)})")
    (stage / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (stage / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    (stage / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>", "model_max_length": 1 << 30}))


def model_key(model: Path) -> str:
    h = hashlib.sha256(str(model.resolve()).encode())
    for p in sorted(model.iterdir()):
        if p.is_file():
            st = p.stat()
            h.update(f"{p.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()[:16]


def stage_model(model: Path, stage: Path) -> dict:
    """`model`'s files linked into `stage`, with the config the converter reads; returns that config."""
    for p in model.iterdir():
        if p.is_file() and p.name != "config.json":
            (stage / p.name).symlink_to(p.resolve())
    config = json.loads((model / "config.json").read_text())
    # The converter reads GPT-2's context length from n_ctx, which newer configs spell n_positions.
    if "n_ctx" not in config and "n_positions" in config:
        config["n_ctx"] = config["n_positions"]
    (stage / "config.json").write_text(json.dumps(config))
    return config


def converter(llama: Path, stage: Path, out: Path, *args, pre: str = "gpt-2") -> list:
    """The command that runs llama.cpp's convert_hf_to_gguf.py on `stage` into `out` with `args`. A vocabulary
    whose pre-tokenizer hash the converter does not know (our random ones) is taken as `pre`'s split (GPT-2's
    unless told: "llama-bpe" for a tokenizer with Llama 3's split)."""
    worker = (
        "import sys\n"
        f"sys.path[:0] = [{str(llama)!r}, {str(llama / 'gguf-py')!r}]\n"
        "import conversion.base as base\n"
        "known = base.TextModel.get_vocab_base_pre\n"
        "def pre(self, tokenizer):\n"
        "    try:\n"
        "        return known(self, tokenizer)\n"
        "    except NotImplementedError:\n"
        f"        return {pre!r}\n"
        "base.TextModel.get_vocab_base_pre = pre\n"
        "import convert_hf_to_gguf as c\n"
        f"sys.argv = ['convert_hf_to_gguf.py', {str(stage)!r}, *{list(args)!r}, '--outfile', {str(out)!r}]\n"
        "c.main()\n")
    return [sys.executable, "-c", worker]


def convert(gguf_dir: Path, llama: Path, model: Path, dtype: str, bin: Path | None) -> Path:
    out = gguf_dir / f"{model_key(model)}-{dtype}.gguf"
    if out.exists():
        return out
    if dtype in QUANTIZED:
        source = convert(gguf_dir, llama, model, "f32", bin)
        partial = out.with_suffix(".partial")
        log(f"quantizing {source.name} to {dtype} (llama-quantize --pure)")
        r = subprocess.run([str(bin / "llama-quantize"), "--pure", str(source), str(partial), QUANTIZED[dtype]],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0 or not partial.exists():
            sys.exit(f"llama_cpp.py: llama-quantize to {dtype} failed:\n{r.stderr[-2000:]}")
        partial.rename(out)
        return out
    try:
        import torch  # noqa: F401  (the converter imports it)
    except ImportError:
        missing("the GGUF converter needs torch (pip install torch), which is not installed")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        stage = Path(tmp)
        config = stage_model(model, stage)
        if not any((stage / n).exists() for n in ("tokenizer.json", "vocab.json", "tokenizer.model")):
            write_tokenizer(stage, int(config["vocab_size"]))
        partial = out.with_suffix(".partial")
        log(f"converting {model} to GGUF ({dtype})")
        r = subprocess.run(converter(llama, stage, partial, "--outtype", dtype), stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
        if r.returncode != 0 or not partial.exists():
            sys.exit(f"llama_cpp.py: converting {model} to GGUF ({dtype}) failed:\n{r.stderr[-2000:]}")
        partial.rename(out)
    return out


def json_lines(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"llama_cpp.py: {' '.join(cmd)} failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
    rows = []
    for line in r.stdout.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    if not rows:
        sys.exit(f"llama_cpp.py: {' '.join(cmd)} printed no JSON rows:\n{r.stdout[-1000:]}{r.stderr[-1000:]}")
    return rows


def batch1(bin: Path, gguf: Path, a):
    """(phase, test, tokens/s) of llama-bench's ppP and tgN rows."""
    cmd = [str(bin / "llama-bench"), "-m", str(gguf), "-t", str(a.threads), "-p", str(a.prefill),
           "-n", str(a.new_tokens), "-r", str(a.reps), "-o", "jsonl"]
    for row in json_lines(cmd):
        n_prompt, n_gen = int(row.get("n_prompt", 0)), int(row.get("n_gen", 0))
        if n_gen == 0:
            yield "prefill", f"pp{n_prompt}", float(row["avg_ts"])
        else:
            yield "decode", f"tg{n_gen}", float(row["avg_ts"])


def batched(bin: Path, gguf: Path, a, batch: int):
    """speed_tg of `batch` sequences (8-token prompts, N steps each), the best of --reps runs."""
    ctx = batch * (8 + a.new_tokens) + 16
    cmd = [str(bin / "llama-batched-bench"), "-m", str(gguf), "-t", str(a.threads), "-tb", str(a.threads),
           "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", "8", "-ntg", str(a.new_tokens), "-npl", str(batch),
           "--output-format", "jsonl"]
    best = 0.0
    for _ in range(a.reps):
        for row in json_lines(cmd):
            if int(row.get("pl", 0)) == batch:
                best = max(best, float(row["speed_tg"]))
    if best <= 0:
        sys.exit(f"llama_cpp.py: {' '.join(cmd)} gave no row for {batch} sequences")
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="Hugging Face directory (config.json, model.safetensors)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=128, help="llama-bench -n (tgN)")
    ap.add_argument("--prefill", type=int, default=256, help="llama-bench -p (ppN)")
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--batches", default="1,8", help="decode batches: 1 by llama-bench, more by llama-batched-bench")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--version", default=VERSION, help="llama-cpp-python's version (its sdist vendors llama.cpp)")
    ap.add_argument("--sdist", help="a llama_cpp_python-*.tar.gz to use instead of downloading one")
    ap.add_argument("--cache", help="cache folder (default $ASPEN_CACHE_DIR/llama.cpp or ~/.cache/aspen/llama.cpp)")
    ap.add_argument("--gguf-dir", help="where the converted models go (default CACHE/gguf; a model that is "
                    "deleted after the run, such as aspen's random bench model, should not fill the cache)")
    ap.add_argument("--build-only", action="store_true", help="fetch and build llama-bench, then stop")
    ap.add_argument("--gguf-only", action="store_true",
                    help="make the GGUF file of each dtype, print {\"dtype\", \"gguf\"} per line, run nothing")
    ap.add_argument("--json", action="store_true", help="one JSON object per line (otherwise a table)")
    a = ap.parse_args()

    cache = cache_dir(a.cache)
    model = Path(a.model)
    if not a.build_only and not (model / "config.json").exists():
        sys.exit(f"llama_cpp.py: --model {model}: expected a Hugging Face directory with config.json")
    dtypes = [d for d in a.dtypes.split(",") if d]
    for d in dtypes:
        if d not in CONVERTED and d not in QUANTIZED:
            sys.exit(f"llama_cpp.py: --dtypes: expected some of {', '.join(CONVERTED + tuple(QUANTIZED))}, "
                     f"found '{d}'")

    try:
        batches = sorted({int(b) for b in a.batches.split(",") if b})
    except ValueError:
        sys.exit(f"llama_cpp.py: --batches: expected numbers separated by commas, found '{a.batches}'")

    llama = source_tree(cache, a.version, a.sdist)
    # The converter alone makes the float and Q8_0 files: --gguf-only builds llama.cpp only for llama-quantize.
    needs_build = not a.gguf_only or any(d in QUANTIZED for d in dtypes)
    bin = build(cache, a.version, llama) if needs_build else None
    if a.build_only:
        print(bin)
        return

    def emit(phase, batch, d, test, tokens_per_s):
        out = {"bench": "generate_llama_cpp", "phase": phase, "batch": batch, "dtype": d,
               "tokens_per_s": tokens_per_s, "test": test, "threads": a.threads, "llama_cpp": a.version}
        if a.json:
            print(json.dumps(out), flush=True)
        else:
            print(f"{phase:<8} {batch:>5} {d:>5} {test:>12} {tokens_per_s:10.1f} tokens/s", flush=True)

    gguf_dir = Path(a.gguf_dir) if a.gguf_dir else cache / "gguf"
    if a.gguf_only:
        for d in dtypes:
            print(json.dumps({"dtype": d, "gguf": str(convert(gguf_dir, llama, model, d, bin))}), flush=True)
        return
    for d in dtypes:
        gguf = convert(gguf_dir, llama, model, d, bin)
        for phase, test, tps in batch1(bin, gguf, a):
            if phase == "prefill" or 1 in batches:
                emit(phase, 1, d, test, tps)
        for b in batches:
            if b > 1:
                emit("decode", b, d, f"b{b} pp8 tg{a.new_tokens}", batched(bin, gguf, a, b))


if __name__ == "__main__":
    main()
