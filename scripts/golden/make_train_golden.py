#!/usr/bin/env python3
"""Make the training goldens under models/testdata/{gpt2-tiny,gptj-tiny,llama-tiny}/ and check HF exports.

Run by a developer (not by CI), from anywhere, with the venv of scripts/golden/requirements.txt:

    python3 scripts/golden/make_train_golden.py                     # writes train_golden.{safetensors,json}
    python3 scripts/golden/make_train_golden.py --check-export DIR  # only check_hf_export(DIR), any number of DIRs

It shares its helpers (versions, JSON layout, golden writer, id generator) with make_model_golden.py by
importing it. It reads the committed tiny checkpoints (model.safetensors, config.json) and never rewrites them.

What it records, per model (see models/testdata/README.md, "Training goldens"):
  - 10 steps of torch.optim.AdamW(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1, foreach=False,
    fused=False) on 10 fixed batches of 2 x 16 random ids (a different batch per step), labels = input ids;
  - the loss at each step, from a float32 run (HF's own loss, as a user gets it) and a float64 run;
  - the gradient of every parameter at step 1 (float64 run, stored f32), by HF name;
  - the weights after 10 steps (float64 run, stored f32);
  - a second run where biases and LayerNorm weights get no weight decay (losses + a few final weights).

Model set-up: from_pretrained(dir, attn_implementation="sdpa", attn_pdrop=0, resid_pdrop=0, embd_pdrop=0),
then model.train(): training mode, but with every dropout probability 0 the forward equals eval mode (checked).
The float64 run is model.double() and its loss is computed here (F.cross_entropy in float64) because HF's
loss upcasts with logits.float() -- a float32 loss even for a float64 model.

Deterministic: one CPU thread, torch.use_deterministic_algorithms(True); running twice gives identical bytes.
"""

import argparse
import copy
import hashlib
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_model_golden as mmg  # noqa: E402  (sets the HF offline environment before transformers loads)

import numpy as np  # noqa: E402
import safetensors.torch  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

COMMAND = "python3 scripts/golden/make_train_golden.py"
STEPS, B, T = 10, 2, 16
HP = {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.1}
# seeds of the batch streams (the checkpoints used 2002/2003 and 6006/6007)
MODELS = {"gpt2-tiny": 2012, "gptj-tiny": 6016, "llama-tiny": 8018}
# final weights of the no-decay variant kept in the file (a LayerNorm weight and bias, a bias, a matrix)
VARIANT_KEEP = {
    "gpt2-tiny": ["transformer.h.0.ln_1.weight", "transformer.h.0.ln_1.bias", "transformer.h.2.mlp.c_fc.bias",
                  "transformer.h.2.mlp.c_proj.weight", "transformer.ln_f.weight"],
    "gptj-tiny": ["transformer.h.0.ln_1.weight", "transformer.h.0.ln_1.bias", "transformer.h.2.mlp.fc_in.bias",
                  "transformer.h.2.mlp.fc_out.weight", "transformer.ln_f.weight", "lm_head.bias"],
    "llama-tiny": ["model.layers.0.input_layernorm.weight", "model.layers.2.mlp.down_proj.weight",
                   "model.layers.1.self_attn.k_proj.weight", "model.norm.weight"],
}
# final weights left out of the file (size): GPT-J's lm_head.weight is a dense matrix like the others
FINAL_SKIP = {"gptj-tiny": ["lm_head.weight"], "llama-tiny": ["lm_head.weight"]}
NO_DECAY = ("bias", "ln_")  # names containing these get no decay in the variant (aspen's AdamWOptions.no_decay)

ADAMW_ALGORITHM = (
    "torch.optim.AdamW, single-tensor path (foreach=False, fused=False, amsgrad=False, maximize=False, "
    "capturable=False). Per parameter p with gradient g, at update number t = 1, 2, ... (state['step'] is "
    "incremented first, so the first update uses t = 1): "
    "p *= 1 - lr*weight_decay  (decoupled decay, applied to p before the moment updates); "
    "m = lerp(m, g, 1-beta1) = beta1*m + (1-beta1)*g;  v = beta2*v + (1-beta2)*g*g;  "
    "bc1 = 1 - beta1**t;  bc2 = 1 - beta2**t  (Python doubles);  "
    "denom = sqrt(v)/sqrt(bc2) + eps;  p -= (lr/bc1) * m/denom.  "
    "m and v start at zero and have the parameter's dtype. The lr is constant (no schedule), no clipping"
)
LOSS_DEF = (
    "HF's causal-LM loss with labels = input_ids: mean cross-entropy of logits[:, :-1] against input_ids[:, 1:] "
    f"over all B*(T-1) = {B * (T - 1)} shifted targets (HF pads labels with -100 = ignore_index on the right and "
    "shifts; no target is ignored here since there is no padding); natural log; reduction mean"
)


# ----------------------------------------------------------------------------- models and runs


def load(d, dtype=torch.float32):
    """The tiny checkpoint, dropout probabilities 0, sdpa attention, training mode."""
    model_type = json.loads((d / "config.json").read_text())["model_type"]
    dropout = (dict(attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0) if model_type in ("gpt2", "gptj")
               else dict(attention_dropout=0.0))
    model = AutoModelForCausalLM.from_pretrained(str(d), attn_implementation="sdpa", dtype=torch.float32, **dropout)
    if dtype == torch.float64:
        model = model.double()
    model.train()
    return model


def params_by_name(model):
    """Named parameters, tied ones once (GPT-2's lm_head.weight is transformer.wte.weight)."""
    return dict(model.named_parameters())  # named_parameters() drops duplicates


def make_optimizer(model, decay_all):
    named = params_by_name(model)
    if decay_all:
        groups = [{"params": list(named.values())}]
    else:
        nd = [p for n, p in named.items() if any(s in n for s in NO_DECAY)]
        dd = [p for n, p in named.items() if not any(s in n for s in NO_DECAY)]
        groups = [{"params": dd}, {"params": nd, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, **HP, foreach=False, fused=False)


def loss_of(model, ids):
    """f32: HF's own loss (labels=ids). f64: the same formula computed here in float64."""
    if next(model.parameters()).dtype == torch.float32:
        return model(ids, labels=ids).loss
    logits = model(ids).logits
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def run(d, batches, dtype, decay_all):
    model = load(d, dtype)
    opt = make_optimizer(model, decay_all)
    losses, grads1 = [], None
    for k in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = loss_of(model, batches[k])
        loss.backward()
        if k == 0:
            grads1 = {n: p.grad.detach().clone() for n, p in params_by_name(model).items()}
        opt.step()
        losses.append(loss.item())
    final = {n: p.detach().clone() for n, p in params_by_name(model).items()}
    after = loss_of(model, batches[0]).item()
    return losses, grads1, final, after


def maxdiff(a, b):
    return {n: (a[n].double() - b[n].double()).abs().max().item() for n in a}


# ----------------------------------------------------------------------------- goldens


def make(name, out):
    d = out / name
    seed = MODELS[name]
    rng = np.random.Generator(np.random.PCG64(seed))
    batches = mmg.ids(rng, (STEPS, B, T))

    # the set-up: dropout 0 in train mode equals eval mode; the f64 loss formula equals HF's loss
    m32 = load(d)
    with torch.no_grad():
        tr = m32(batches[0], labels=batches[0]).loss.item()
        ev = m32.eval()(batches[0], labels=batches[0]).loss.item()
        m64 = copy.deepcopy(m32).double()
        mine = loss_of(m64, batches[0]).item()
        hf64 = m64(batches[0], labels=batches[0]).loss.item()
    assert tr == ev, (tr, ev)
    assert abs(mine - hf64) < 1e-5, (mine, hf64)
    tied = name == "gpt2-tiny"
    if tied:
        assert m32.lm_head.weight is m32.transformer.wte.weight

    L64, G64, W64, after64 = run(d, batches, torch.float64, decay_all=True)
    L32, G32, W32, after32 = run(d, batches, torch.float32, decay_all=True)
    V64, _, VW64, vafter64 = run(d, batches, torch.float64, decay_all=False)
    V32, _, VW32, _ = run(d, batches, torch.float32, decay_all=False)
    gdiff, wdiff, vwdiff = maxdiff(G32, G64), maxdiff(W32, W64), maxdiff(VW32, VW64)

    Tn, M = {}, {}
    Tn["input_ids"] = batches
    M["input_ids"] = {"meaning": f"[step, batch, seq]: the batch of step k (0-based) is input_ids[k]; labels = input_ids; "
                      f"numpy PCG64({seed}) integers in [0,{mmg.VOCAB})"}
    Tn["loss_f32"] = torch.tensor(L32, dtype=torch.float32)
    M["loss_f32"] = {"meaning": "loss at each step (before that step's update), float32 model, HF's own loss "
                     "(model(ids, labels=ids).loss)"}
    # The float64 losses live in the JSON only (loss_f64): safetensors readers that take
    # model dtypes (aspen's among them) need not read F64.
    for n, g in G64.items():
        Tn["grad." + n] = mmg.f32(g)
        M["grad." + n] = {"meaning": "gradient at step 1 (initial weights, batch input_ids[0]), float64 run",
                          "max_abs": round(g.abs().max().item(), 8),
                          "f32_run_max_abs_diff": float(f"{gdiff[n]:.3g}")}
    if tied:
        M["grad.transformer.wte.weight"]["meaning"] += (
            "; wte is tied to lm_head.weight (one parameter), so this is the SUM of the embedding-lookup "
            "gradient and the output-projection gradient")
    for n, w in W64.items():
        if n in FINAL_SKIP.get(name, []):
            continue
        Tn["final." + n] = mmg.f32(w)
        M["final." + n] = {"meaning": "weights after 10 AdamW steps, decay on all parameters, float64 run",
                           "f32_run_max_abs_diff": float(f"{wdiff[n]:.3g}")}
    Tn["nodecay.loss_f32"] = torch.tensor(V32, dtype=torch.float32)
    M["nodecay.loss_f32"] = {"meaning": "as loss_f32, for the variant with no decay on biases and LayerNorm weights"}
    for n in VARIANT_KEEP[name]:
        Tn["nodecay.final." + n] = mmg.f32(VW64[n])
        M["nodecay.final." + n] = {"meaning": "weights after 10 steps of the no-decay variant, float64 run",
                                   "f32_run_max_abs_diff": float(f"{vwdiff[n]:.3g}")}

    nd_names = sorted(n for n in W64 if any(s in n for s in NO_DECAY))
    meta = {
        "model": name,
        "checkpoint": f"models/testdata/{name}/model.safetensors (sha256 "
        f"{hashlib.sha256((d / 'model.safetensors').read_bytes()).hexdigest()[:16]}...), unchanged",
        "made_by": COMMAND,
        "versions": mmg.versions(),
        "setup": "AutoModelForCausalLM.from_pretrained(dir, attn_implementation='sdpa', attn_pdrop=0, resid_pdrop=0, "
        "embd_pdrop=0, dtype=float32), model.train() (dropout probabilities all 0, so train mode = eval mode; "
        "checked); float64 run: the same then model.double(); one CPU thread, deterministic algorithms",
        "loss": LOSS_DEF + ". The float32 run uses HF's loss; the float64 run computes the same formula with "
        "F.cross_entropy in float64 (HF's loss would upcast only to float32)",
        "optimizer": {"class": "torch.optim.AdamW", **{k: list(v) if isinstance(v, tuple) else v for k, v in HP.items()},
                      "foreach": False, "fused": False, "amsgrad": False, "algorithm": ADAMW_ALGORITHM},
        "weight_decay_main": "applied to ALL parameters (one param group), embeddings, biases and LayerNorm included"
        + ("; GPT-2's tied wte/lm_head is one parameter, decayed and updated once per step" if tied else ""),
        "weight_decay_nodecay_variant": f"weight_decay 0 for parameters whose name contains any of {list(NO_DECAY)} "
        f"(biases and LayerNorm weights; aspen's AdamWOptions.no_decay), 0.1 for the rest: {nd_names}",
        "steps": f"{STEPS} updates; step k (1-based) runs forward+backward on input_ids[k-1] with the weights after "
        "k-1 updates, records that loss, then updates (AdamW t = k). final.* are the weights after update 10. "
        "zero_grad(set_to_none=True) before each step: gradients do not accumulate across steps",
        "batch": {"B": B, "T": T, "targets_per_step": B * (T - 1)},
        "precision": "grad.* and final.* come from the float64 run, stored float32; the f32_run_max_abs_diff of each "
        "says how far PyTorch's own float32 run is from it",
        "loss_f32": L32,
        "loss_f64": L64,
        "loss_after_10_steps_on_batch_0_f64": after64,
        "loss_after_10_steps_on_batch_0_f32": after32,
        "nodecay_loss_f32": V32,
        "nodecay_loss_f64": V64,
        "nodecay_loss_after_10_steps_on_batch_0_f64": vafter64,
        "final_weights_left_out": FINAL_SKIP.get(name, []),
        "tolerances": {
            "loss_f32_vs_loss_f64_abs": 5e-5,
            "grad_f32_abs": 1e-5,
            "final_f32_abs": 2e-3,
            "final_f32_fraction_over_1e-4": 1e-3,
            "why": "PyTorch's own float32 run is within 1e-5 (loss), 1.3e-6 (step-1 gradients) and 5e-4 (final weights; "
            "Adam's m/sqrt(v) magnifies rounding in elements with tiny gradients, so a few elements move by up to "
            "~lr*0.05; at most 134 of 181k elements differ by > 1e-5 and 2 by > 1e-4) of the float64 reference",
        },
        "input_ids": batches.tolist(),
        "tensors": M,
    }
    if tied:
        meta["zero_true_gradient"] = (
            "the key part of every c_attn.bias (columns n_embd..2*n_embd) has a mathematically zero gradient "
            "(adding q.b_k to all scores of a query leaves the softmax unchanged): exactly ~0 in float64, rounding "
            "noise in float32, which Adam normalizes to updates of up to lr per step. Compare those 48 entries per "
            "layer of final.*c_attn.bias loosely (or skip them); see f32_run_max_abs_diff")
    mmg.write_golden(d, Tn, meta, stem="train_golden")
    size = (d / "train_golden.safetensors").stat().st_size
    assert size < 1_500_000, size
    print(f"{name}: loss f32 {L32[0]:.5f} -> {L32[-1]:.5f}, f64 {L64[0]:.5f} -> {L64[-1]:.5f}; "
          f"max |f32-f64| loss {max(abs(a - b) for a, b in zip(L32, L64)):.2e}, "
          f"grad {max(gdiff.values()):.2e}, final {max(wdiff.values()):.2e} "
          f"(worst {max(wdiff, key=wdiff.get)}); nodecay loss {V64[-1]:.5f}")
    return meta


# ----------------------------------------------------------------------------- export check


def check_hf_export(d, input_ids=None, atol=1e-4):
    """Load a directory written by aspen (config.json + model.safetensors) with
    transformers.AutoModelForCausalLM.from_pretrained, as a user would, and run a forward.

    Fails (AssertionError) if a file is missing, if loading reports missing, unexpected or mismatched
    tensors (a missing tensor would otherwise be silently random-initialized), if the logits are not
    [B, T, vocab] and finite, or -- when the directory has a golden.safetensors from make_model_golden.py --
    if the logits of its input_ids differ from the golden by more than atol. Returns a dict of what it saw."""
    d = Path(d)
    for f in ("config.json", "model.safetensors"):
        assert (d / f).is_file(), f"{d}: no {f}"
    model, info = AutoModelForCausalLM.from_pretrained(str(d), output_loading_info=True, dtype=torch.float32)
    model.eval()
    bad = {k: sorted(v) for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    assert not bad, f"{d}: loading reported {bad}"
    cfg = model.config
    golden = None
    if input_ids is None and (d / "golden.safetensors").is_file():
        golden = safetensors.torch.load_file(str(d / "golden.safetensors"))
        input_ids = golden.get("input_ids")
    if input_ids is None:
        rng = np.random.Generator(np.random.PCG64(0))
        input_ids = mmg.ids(rng, (2, min(8, cfg.max_position_embeddings)), high=cfg.vocab_size)
    with torch.no_grad():
        logits = model(input_ids).logits
    assert logits.shape == (*input_ids.shape, cfg.vocab_size), logits.shape
    assert torch.isfinite(logits).all(), f"{d}: non-finite logits"
    res = {"dir": str(d), "class": type(model).__name__, "params": sum(p.numel() for p in model.parameters()),
           "logits_shape": list(logits.shape), "max_abs_logit": logits.abs().max().item()}
    if golden is not None and "logits" in golden:
        err = (logits - golden["logits"]).abs().max().item()
        res["golden_max_abs_diff"] = err
        assert err <= atol, f"{d}: logits differ from golden.safetensors by {err}"
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=mmg.OUT)
    ap.add_argument("--check-export", nargs="+", type=Path, metavar="DIR",
                    help="only run check_hf_export on these directories")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if args.check_export:
        for d in args.check_export:
            print(json.dumps(check_hf_export(d)))
        return
    mmg.check_versions()
    for name in MODELS:
        make(name, args.out)
    for name in MODELS:
        print(json.dumps(check_hf_export(args.out / name)))
    for name in MODELS:
        for f in ("train_golden.safetensors", "train_golden.json"):
            p = args.out / name / f
            print(f"{p.stat().st_size:9d}  {hashlib.sha256(p.read_bytes()).hexdigest()[:16]}  {p.relative_to(mmg.ROOT)}")


if __name__ == "__main__":
    main()
