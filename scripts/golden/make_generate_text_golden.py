#!/usr/bin/env python3
"""Golden text for `aspen generate` on the tiny checkpoints of every causal family.

Copies a 1000-token tokenizer of the model's family (MODELS: the tiny models'
vocabulary size) into models/testdata/<model> so each directory is a
complete model directory (config, weights, tokenizer), then records what
Hugging Face prints for a fixed prompt: the prompt's ids, the 32 greedy new
ids and their decoded text, in <dir>/generate_text.json.

Run by a developer (not CI), with the venv of scripts/golden/requirements.txt:
    python scripts/golden/make_generate_text_golden.py
The random tiny models were made with eos = pad = 999 while the tokenizer's
<|endoftext|> is id 0: generation stops at 999 (never drawn here) in both.
"""
import json
import os
import shutil

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPT = "ROMEO:\nBut soft, what light"
# Each tiny model with a tokenizer of its family and 1000 tokens (io/testdata; the Llama family's from
# make_llama_tokenizer_golden.py): Llama 3's byte-level BPE, Mistral's SentencePiece conversion, Qwen2's.
MODELS = [("gpt2-tiny", "bpe1k"), ("gptj-tiny", "bpe1k"), ("llama-tiny", "llama3_bpe"),
          ("mistral-tiny", "spm_metaspace"), ("qwen2-tiny", "qwen2_bpe")]
NEW_TOKENS = 32


def main():
    torch.manual_seed(0)
    for name, tokenizer in MODELS:
        src = os.path.join(ROOT, "io", "testdata", tokenizer)
        d = os.path.join(ROOT, "models", "testdata", name)
        for f in ("vocab.json", "merges.txt", "tokenizer.json"):
            if os.path.exists(os.path.join(src, f)):
                shutil.copyfile(os.path.join(src, f), os.path.join(d, f))
        tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(d, "tokenizer.json"))
        model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
        ids = tok(PROMPT)["input_ids"]
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=999)
        new = out[0, len(ids):].tolist()
        text = tok.decode(new)
        with open(os.path.join(d, "generate_text.json"), "w") as f:
            json.dump({"prompt": PROMPT, "prompt_ids": ids, "new_ids": new, "text": text,
                       "max_new_tokens": NEW_TOKENS, "greedy": True}, f, indent=1, ensure_ascii=False)
            f.write("\n")
        print(name, repr(text))


if __name__ == "__main__":
    main()
