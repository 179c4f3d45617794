#!/usr/bin/env python3
"""Checks that the two peers of `make bench-gpu` train the same network (CPU, fp32, no GPU).

Builds Megatron-Core's GPTModel as mcore_gpt.py does (local spec, tied output layer, learned
positions) and torch_gpt.py's Gpt at a tiny shape, randomises every Megatron parameter (biases
and LayerNorms too, so that a mis-mapped one shows), copies them into the PyTorch model, and
compares the loss and every parameter's gradient on one random batch, with Megatron's two fusions
off and on. Megatron's fused QKV weight is ordered head by head ([q_i; k_i; v_i] for head i); the
PyTorch model's is [q; k; v] over all heads, so the copy reorders it.

    PYTHONPATH=/tmp/site python3 bench/gpu/check_peers_agree.py
Prints one line per case and `N passed, N failed`; exits 1 if any case differs.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common as pc  # noqa: E402
import mcore_gpt  # noqa: E402
import torch_gpt  # noqa: E402
import torch  # noqa: E402

LAYERS, HIDDEN, HEADS, SEQ, BATCH = 2, 64, 4, 32, 3
LOSS_RTOL, GRAD_TOL = 1e-5, 1e-4


def megatron_qkv_to_torch(t, heads):
    """[heads*3*d, ...] ordered (head, q/k/v, d) -> ordered (q/k/v, head, d)."""
    rest = t.shape[1:]
    d = t.shape[0] // (3 * heads)
    return t.reshape(heads, 3, d, *rest).transpose(0, 1).reshape(3 * heads * d, *rest)


def torch_name(mc_name):
    """The torch_gpt.Gpt parameter that holds Megatron's parameter `mc_name`."""
    fixed = {
        "embedding.word_embeddings.weight": "tok_emb.weight",
        "embedding.position_embeddings.weight": "pos_emb.weight",
        "decoder.final_layernorm.weight": "ln_f.weight",
        "decoder.final_layernorm.bias": "ln_f.bias",
    }
    if mc_name in fixed:
        return fixed[mc_name]
    decoder, layers, layer, rest = mc_name.split(".", 3)  # decoder.layers.<i>.<module>.<leaf>
    assert (decoder, layers) == ("decoder", "layers"), mc_name
    sub = {
        "input_layernorm": "ln1", "pre_mlp_layernorm": "ln2",
        "self_attention.linear_qkv": "attn.qkv", "self_attention.linear_proj": "attn.proj",
        "mlp.linear_fc1": "mlp.fc1", "mlp.linear_fc2": "mlp.fc2",
    }
    module, leaf = rest.rsplit(".", 1)
    return f"blocks.{layer}.{sub[module]}.{leaf}"


def run_case(mc, fusions):
    torch.manual_seed(7)
    vocab = pc.padded_vocab()
    config = mcore_gpt.build_config(mc, LAYERS, HIDDEN, HEADS, fusions, on_gpu=False,
                                    dtype=torch.float32)
    ref = mcore_gpt.build_model(mc, config, vocab, SEQ, torch.device("cpu"))
    ours = torch_gpt.Gpt(LAYERS, HIDDEN, HEADS, vocab, SEQ)
    ours_params = dict(ours.named_parameters())
    mapped = set()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            p.normal_(0.0, 0.5 if p.dim() == 1 else 0.05)
            value = megatron_qkv_to_torch(p, HEADS) if "linear_qkv" in name else p
            target = torch_name(name)
            ours_params[target].copy_(value)
            mapped.add(target)
    missing = set(ours_params) - mapped
    if missing:
        return False, f"torch parameters with no Megatron counterpart: {sorted(missing)}"

    seqs = torch.randint(0, pc.GPT2_VOCAB, (BATCH, SEQ + 1))
    tokens, labels = seqs[:, :-1], seqs[:, 1:]
    positions = torch.arange(SEQ).unsqueeze(0).expand(BATCH, -1)
    mask = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1).view(1, 1, SEQ, SEQ)
    loss_ref = ref(tokens, positions, mask, labels=labels).mean()
    loss_ref.backward()
    loss_ours = ours(tokens, labels)
    loss_ours.backward()

    rel = abs(loss_ref.item() - loss_ours.item()) / abs(loss_ref.item())
    worst, worst_name = 0.0, None
    for name, p in ref.named_parameters():
        g_ref = megatron_qkv_to_torch(p.grad, HEADS) if "linear_qkv" in name else p.grad
        g_ours = ours_params[torch_name(name)].grad
        err = ((g_ref - g_ours).abs().max() / g_ref.abs().max().clamp_min(1e-12)).item()
        if err > worst:
            worst, worst_name = err, name
    ok = rel <= LOSS_RTOL and worst <= GRAD_TOL
    return ok, (f"loss megatron {loss_ref.item():.6f} torch {loss_ours.item():.6f} "
                f"(rel {rel:.1e}, tol {LOSS_RTOL:.0e}); largest gradient difference "
                f"{worst:.1e} of max|g| at {worst_name} (tol {GRAD_TOL:.0e})")


def main():
    mc = mcore_gpt.import_megatron()
    mcore_gpt.init_parallel_state(mc, torch.device("cpu"), seed=7)
    passed = failed = 0
    for fusions in (False, True):
        ok, detail = run_case(mc, fusions)
        label = "fusions on " if fusions else "fusions off"
        print(f"{'PASS' if ok else 'FAIL'} torch_gpt.Gpt == megatron GPTModel, {label}: {detail}")
        passed, failed = passed + ok, failed + (not ok)
    mc.parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
