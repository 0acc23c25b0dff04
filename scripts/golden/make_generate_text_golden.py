#!/usr/bin/env python3
"""Golden text for `aspen generate` on the tiny GPT-2 and GPT-J checkpoints.

Copies the byte-level BPE of io/testdata/bpe1k (1000 tokens, the tiny models'
vocabulary size) into models/testdata/{gpt2,gptj}-tiny so each directory is a
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
NEW_TOKENS = 32


def main():
    torch.manual_seed(0)
    src = os.path.join(ROOT, "io", "testdata", "bpe1k")
    for name in ("gpt2-tiny", "gptj-tiny"):
        d = os.path.join(ROOT, "models", "testdata", name)
        for f in ("vocab.json", "merges.txt", "tokenizer.json"):
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
