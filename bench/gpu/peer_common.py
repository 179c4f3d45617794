"""Shared pieces of the GPU benchmark's PyTorch and Megatron-Core peers (`make bench-gpu`).

Both peers (torch_gpt.py, mcore_gpt.py) train the same GPT-2 shapes as megatron_c on one GPU and
print one line per run:

    BENCH impl=torch-eager model=124M tok_s=350123 mfu=30.21 peak_gib=18.52 ms_step=46.79 \
          steps=20 warmup=5 batch=16 seq=1024 params=124475904 warmup_s=3.1 \
          loss_first=10.9871 loss_last=10.8112 status=ok

Fields: tok_s = trained tokens per second over the timed steps (batch*seq*steps / seconds, the
seconds measured with CUDA events around the timed steps, after a synchronize); mfu = model FLOPs
utilisation in percent (formula in MFU_FORMULA); peak_gib = torch.cuda.max_memory_allocated() over
the whole run (model, optimizer state, activations, compile) in GiB (2^30 bytes); ms_step = ms per
timed step; params = parameters of the model as built (tied embedding counted once, position
embedding included); warmup_s = wall seconds of the untimed warm-up steps (torch.compile's
compilation happens there); loss_first/loss_last = the loss of the first warm-up step and of the
last timed step (random tokens: both near ln(50257) = 10.8). `--json` prints the same record as
one JSON line (or appends it to a file) with the GPU name, library versions and the formula.
"""

import argparse
import json
import math
import os
import sys
import time

# H200 SXM dense bf16 peak (the figure DESIGN.md and the published peers use).
PEAK_FLOPS = 989.4e12

GPT2_VOCAB = 50257  # GPT-2 BPE vocabulary; the data draws tokens from it
VOCAB_MULTIPLE = 128  # Megatron's --make-vocab-size-divisible-by default

# name -> (layers, hidden, heads); the FFN is 4*hidden, the head size hidden/heads.
MODELS = {
    "124M": (12, 768, 12),
    "350M": (24, 1024, 16),
}

MFU_FORMULA = (
    "mfu = tok_s * (6*N + 12*L*h*T) / 989.4e12 (PaLM, appendix B); "
    "N = 12*L*h^2 + V*h (QKV, attention out, FC1, FC2 weights per layer and the tied LM head; "
    "V = padded vocab), i.e. 72*L*h^2 + 12*L*h*T + 6*h*V FLOPs per token"
)


def padded_vocab(vocab=GPT2_VOCAB, multiple=VOCAB_MULTIPLE):
    """Vocabulary rounded up to a multiple, as Megatron pads it (50257 -> 50304)."""
    return (vocab + multiple - 1) // multiple * multiple


def flops_per_token(layers, hidden, seq, vocab):
    """Training FLOPs per token of the PaLM formula (see MFU_FORMULA)."""
    n = 12 * layers * hidden * hidden + vocab * hidden
    return 6 * n + 12 * layers * hidden * seq


def gpt2_param_count(layers, hidden, seq, vocab):
    """Exact parameter count of the pre-LN GPT-2 both peers build (biases everywhere, tied head).

    Per layer: two LayerNorms (4h), QKV (3h^2 + 3h), attention out (h^2 + h), FC1 (4h^2 + 4h),
    FC2 (4h^2 + h) = 12h^2 + 13h. Plus token embedding V*h, position embedding T*h, final LN 2h.
    """
    return layers * (12 * hidden * hidden + 13 * hidden) + vocab * hidden + seq * hidden + 2 * hidden


def base_parser(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", choices=sorted(MODELS), default="124M",
                   help="GPT-2 shape: 124M (L12 h768 12 heads) or 350M (L24 h1024 16 heads)")
    p.add_argument("--batch", type=int, default=16, help="micro-batch size (sequences per step)")
    p.add_argument("--seq", type=int, default=1024, help="sequence length T")
    p.add_argument("--warmup", type=int, default=5, help="untimed warm-up steps")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate (constant)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--batches", type=int, default=4,
                   help="distinct random batches drawn up front and cycled through")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE",
                   help="also print the record as one JSON line (to stdout, or appended to FILE)")
    p.add_argument("--cpu-check", action="store_true",
                   help="check this script's logic on the CPU with a tiny model (no GPU needed); "
                        "prints a CHECK line, not a benchmark")
    return p


def apply_cpu_check(args):
    """Turns a run into the CPU logic check: a tiny model memorising one batch.

    Returns (layers, hidden, heads). One repeated batch and a high learning rate make the loss
    fall well below ln(V) within a few steps if forward, backward and the optimizer are wired
    right; make_record turns a loss that does not fall into status=not-learning.
    """
    args.batch, args.seq, args.warmup, args.steps, args.lr = 2, 64, 1, 6, 1e-2
    args.batches = 1
    args.model = "tiny-L2h64"
    return 2, 64, 4


def check_args(args, parser):
    """Rejects values that would give a meaningless run, naming the flag, the value and the rule."""
    rules = [
        ("--batch", args.batch, args.batch >= 1, "must be >= 1"),
        ("--seq", args.seq, args.seq >= 1, "must be >= 1"),
        ("--warmup", args.warmup, args.warmup >= 1,
         "must be >= 1 (the first step allocates, autotunes and compiles)"),
        ("--steps", args.steps, args.steps >= 1, "must be >= 1"),
        ("--batches", args.batches, args.batches >= 1, "must be >= 1"),
        ("--lr", args.lr, args.lr > 0 and math.isfinite(args.lr), "must be a positive number"),
    ]
    for flag, value, ok, rule in rules:
        if not ok:
            parser.error(f"{flag} {value}: {rule}")


def require_cuda(torch, script):
    """Exits with a clear message unless a CUDA device is usable."""
    if torch.cuda.is_available():
        return
    sys.stderr.write(
        f"error: {script}: no CUDA device (torch {torch.__version__}, built for CUDA "
        f"{torch.version.cuda}, torch.cuda.is_available() is False). This benchmark runs only "
        f"on a GPU; --cpu-check runs a tiny logic check on the CPU instead.\n")
    sys.exit(2)


def random_batches(torch, count, batch, seq, device, seed):
    """`count` (tokens, labels) pairs of shape [batch, seq], drawn uniformly from GPT-2's vocab.

    Labels are the tokens shifted by one, as in next-token training. Drawn once, on the device,
    so that the timed loop moves no data.
    """
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    out = []
    for _ in range(count):
        seqs = torch.randint(0, GPT2_VOCAB, (batch, seq + 1), device=device, generator=gen)
        out.append((seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()))
    return out


def timed_training(torch, step, batches, warmup, steps, device):
    """Runs `warmup` untimed steps, then `steps` timed ones; returns the timing and the losses.

    `step(tokens, labels)` trains one step and returns the loss as a 0-d device tensor (so the
    loop does not wait for the GPU). The timed region starts after a synchronize and is measured
    with CUDA events (perf_counter on the CPU).
    """
    losses = []
    t0 = time.perf_counter()
    for i in range(warmup):
        losses.append(step(*batches[i % len(batches)]))
    synchronize(torch, device)
    warmup_s = time.perf_counter() - t0

    on_gpu = device.type == "cuda"
    if on_gpu:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
    t1 = time.perf_counter()
    for i in range(steps):
        losses.append(step(*batches[(warmup + i) % len(batches)]))
    if on_gpu:
        end.record()
    synchronize(torch, device)
    wall_s = time.perf_counter() - t1
    seconds = start.elapsed_time(end) / 1000.0 if on_gpu else wall_s

    values = torch.stack([x.detach().float().reshape(()) for x in losses]).tolist()
    return {"seconds": seconds, "wall_s": wall_s, "warmup_s": warmup_s, "losses": values}


def synchronize(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_record(impl, args, layers, hidden, vocab, params, timing, peak_bytes, extra):
    """The run's record: the BENCH fields plus context for the JSON line."""
    tokens = args.batch * args.seq * args.steps
    tok_s = tokens / timing["seconds"]
    fpt = flops_per_token(layers, hidden, args.seq, vocab)
    finite = all(math.isfinite(x) for x in timing["losses"])
    rec = {
        "impl": impl,
        "model": args.model,
        "tok_s": round(tok_s),
        "mfu": round(100.0 * tok_s * fpt / PEAK_FLOPS, 2),
        "peak_gib": round(peak_bytes / 2**30, 2),
        "ms_step": round(1000.0 * timing["seconds"] / args.steps, 2),
        "steps": args.steps,
        "warmup": args.warmup,
        "batch": args.batch,
        "seq": args.seq,
        "params": params,
        "warmup_s": round(timing["warmup_s"], 1),
        "loss_first": round(timing["losses"][0], 4),
        "loss_last": round(timing["losses"][-1], 4),
        "status": "ok" if finite else "nonfinite-loss",
    }
    if finite and args.cpu_check and not timing["losses"][-1] < timing["losses"][0] - 1.0:
        rec["status"] = "not-learning"
    rec.update({
        "layers": layers, "hidden": hidden, "vocab": vocab,
        "flops_per_token": fpt, "peak_flops": PEAK_FLOPS, "mfu_formula": MFU_FORMULA,
        "timed_wall_s": round(timing["wall_s"], 4), "losses": [round(x, 4) for x in timing["losses"]],
    })
    rec.update(extra)
    return rec


BENCH_KEYS = ("impl", "model", "tok_s", "mfu", "peak_gib", "ms_step", "steps", "warmup", "batch",
              "seq", "params", "warmup_s", "loss_first", "loss_last", "status")


def emit(rec, args, tag="BENCH"):
    """Prints the fixed-format line (and the JSON line when asked); returns the exit status."""
    line = " ".join(f"{k}={rec[k]}" for k in BENCH_KEYS)
    print(f"# {MFU_FORMULA}; {rec['flops_per_token']} FLOPs per token", flush=True)
    print(f"{tag} {line}", flush=True)
    if args.json is not None:
        text = json.dumps(rec, sort_keys=True)
        if args.json == "-":
            print(text, flush=True)
        else:
            with open(args.json, "a", encoding="utf-8") as f:
                f.write(text + "\n")
    if rec["status"] != "ok":
        sys.stderr.write(f"error: {rec['impl']} {rec['model']}: {rec['status']}, losses "
                         f"{rec['losses']}\n")
        return 1
    return 0


def device_facts(torch, device):
    facts = {"torch": torch.__version__, "device": str(device)}
    if device.type == "cuda":
        facts["gpu"] = torch.cuda.get_device_name(device)
        facts["cuda"] = torch.version.cuda
    facts["host_cpus"] = os.cpu_count()
    return facts
