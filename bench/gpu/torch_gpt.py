#!/usr/bin/env python3
"""PyTorch peer of `make bench-gpu`: a GPT-2 of megatron_c's shape, trained on one GPU.

The model is megatron_c's: pre-LN GPT-2 with learned position embeddings, LayerNorm (eps 1e-5),
GELU (tanh approximation), biases on every linear layer, causal attention through
F.scaled_dot_product_attention, the LM head tied to the token embedding, dropout 0, and the
vocabulary padded to a multiple of 128 (50257 -> 50304) as Megatron pads it. Mixed precision as
usual in PyTorch: fp32 parameters (the master weights), bf16 autocast for the forward, fp32 loss,
AdamW (fused=True; betas 0.9/0.95, eps 1e-8, weight decay 0.1 on matrices and embeddings, 0 on
biases and LayerNorm) and gradient clipping at 1.0 as Megatron's default.

    python3 bench/gpu/torch_gpt.py --model 124M                  # eager
    python3 bench/gpu/torch_gpt.py --model 350M --compile        # torch.compile
    python3 bench/gpu/torch_gpt.py --model 124M --compile --batch 64 --json
    python3 bench/gpu/torch_gpt.py --cpu-check [--compile]       # tiny logic check, no GPU

Output: one BENCH line (peer_common.py describes the fields), impl=torch-eager, torch-compile or
(--compile-scope blocks) torch-compile-regional.
"""

import contextlib
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common as pc  # noqa: E402

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as exc:  # the GPU machine has torch; say so clearly where it is missing
    sys.stderr.write(f"error: torch_gpt.py: cannot import torch ({exc})\n")
    sys.exit(2)


class CausalSelfAttention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x):
        b, t, h = x.shape                                   # x: [b, t, h]
        qkv = self.qkv(x).view(b, t, 3, self.heads, h // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)      # each [b, heads, t, h/heads]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [b, heads, t, h/heads]
        return self.proj(y.transpose(1, 2).reshape(b, t, h))         # [b, t, h]


class Mlp(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x):                                   # x: [b, t, h]
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden, eps=1e-5)
        self.attn = CausalSelfAttention(hidden, heads)
        self.ln2 = nn.LayerNorm(hidden, eps=1e-5)
        self.mlp = Mlp(hidden)

    def forward(self, x):                                   # x: [b, t, h]
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def lm_head_loss(x, ln_f, emb_weight, labels):
    """Final LayerNorm, the tied LM head and the mean token cross entropy in fp32."""
    logits = F.linear(ln_f(x), emb_weight)                 # [b, t, V]
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


class Gpt(nn.Module):
    def __init__(self, layers, hidden, heads, vocab, seq):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, hidden)          # [V, h], also the LM head
        self.pos_emb = nn.Embedding(seq, hidden)            # [T, h]
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden, eps=1e-5)
        self.register_buffer("positions", torch.arange(seq), persistent=False)
        self.head_loss = lm_head_loss                       # replaced by a compiled one per region
        self._init_weights(layers)

    def _init_weights(self, layers, std=0.02):
        # GPT-2 / Megatron: N(0, 0.02) everywhere, the two projections that write into the
        # residual stream scaled by 1/sqrt(2L), biases 0, LayerNorm weight 1.
        for name, p in self.named_parameters():
            if p.dim() == 1:
                continue                                    # biases 0, LN weights 1 (defaults)
            scaled = name.endswith("attn.proj.weight") or name.endswith("mlp.fc2.weight")
            nn.init.normal_(p, 0.0, std / math.sqrt(2 * layers) if scaled else std)
        for block in self.blocks:
            for lin in (block.attn.qkv, block.attn.proj, block.mlp.fc1, block.mlp.fc2):
                nn.init.zeros_(lin.bias)

    def forward(self, tokens, labels):                      # tokens, labels: [b, t]
        t = tokens.shape[1]
        x = self.tok_emb(tokens) + self.pos_emb(self.positions[:t])  # [b, t, h]
        for block in self.blocks:
            x = block(x)
        return self.head_loss(x, self.ln_f, self.tok_emb.weight, labels)


def compile_model(model, mode, scope):
    """torch.compile the whole model, or each block and the head (regional compilation).

    Whole model: one graph, the most fusion, compile time growing with depth. Regions: the
    blocks share one compiled graph (same code, parameters as inputs), so compile time stays that
    of one block plus the head, at the cost of fusing across block boundaries.
    """
    mode = None if mode == "default" else mode
    if scope == "model":
        return torch.compile(model, mode=mode, fullgraph=True)
    for block in model.blocks:
        block.compile(mode=mode, fullgraph=True)
    model.head_loss = torch.compile(lm_head_loss, mode=mode, fullgraph=True)
    return model


def make_optimizer(model, lr, fused):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)


def main():
    parser = pc.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--compile-mode", default="default",
                        choices=["default", "reduce-overhead", "max-autotune",
                                 "max-autotune-no-cudagraphs"],
                        help="torch.compile mode (default: default)")
    parser.add_argument("--compile-scope", default="model", choices=["model", "blocks"],
                        help="compile the whole model as one graph (default), or each "
                             "transformer block and the LM head/loss on their own (regional: "
                             "compile time of one block)")
    parser.add_argument("--sdpa-backend", default="auto",
                        choices=["auto", "flash", "cudnn", "efficient", "math"],
                        help="pin F.scaled_dot_product_attention to one backend (default: "
                             "PyTorch's choice)")
    parser.add_argument("--clip-grad", type=float, default=1.0,
                        help="gradient-norm clip (0: off); Megatron's default is 1.0")
    args = parser.parse_args()
    pc.check_args(args, parser)

    if args.cpu_check:
        device = torch.device("cpu")
        layers, hidden, heads = pc.apply_cpu_check(args)
    else:
        pc.require_cuda(torch, "torch_gpt.py")
        device = torch.device("cuda", torch.cuda.current_device())
        layers, hidden, heads = pc.MODELS[args.model]
    vocab = pc.padded_vocab()
    torch.manual_seed(args.seed)

    model = Gpt(layers, hidden, heads, vocab, args.seq).to(device)
    params = sum(p.numel() for p in model.parameters())
    expected = pc.gpt2_param_count(layers, hidden, args.seq, vocab)
    if params != expected:
        sys.stderr.write(f"error: torch_gpt.py: model has {params} parameters, the shape "
                         f"formula says {expected}\n")
        return 1
    optimizer = make_optimizer(model, args.lr, fused=True)
    forward = compile_model(model, args.compile_mode, args.compile_scope) if args.compile else model

    attention_backend = contextlib.ExitStack()
    if args.sdpa_backend != "auto":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        names = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}
        attention_backend.enter_context(sdpa_kernel(getattr(SDPBackend, names[args.sdpa_backend])))

    def step(tokens, labels):
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            loss = forward(tokens, labels)
        loss.backward()
        if args.clip_grad > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    batches = pc.random_batches(torch, args.batches, args.batch, args.seq, device, args.seed)
    with attention_backend:
        timing = pc.timed_training(torch, step, batches, args.warmup, args.steps, device)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0

    impl = "torch-eager"
    if args.compile:
        impl = "torch-compile" if args.compile_scope == "model" else "torch-compile-regional"
    extra = pc.device_facts(torch, device)
    extra.update({
        "precision": "fp32 params + bf16 autocast", "optimizer": "torch.optim.AdamW(fused=True)",
        "clip_grad": args.clip_grad, "sdpa_backend": args.sdpa_backend,
        "compile_mode": args.compile_mode if args.compile else None,
        "compile_scope": args.compile_scope if args.compile else None,
    })
    rec = pc.make_record(impl, args, layers, hidden, vocab, params, timing, peak, extra)
    return pc.emit(rec, args, tag="CHECK" if args.cpu_check else "BENCH")


if __name__ == "__main__":
    sys.exit(main())
