#!/usr/bin/env python3
"""Megatron-Core peer of `make bench-gpu`: Megatron-Core 0.16.1's GPTModel on one GPU.

The model is megatron_c's GPT-2 shape built by Megatron-Core itself: GPTModel with the local
layer spec (get_gpt_layer_local_spec: Megatron-Core's own ColumnParallelLinear /
RowParallelLinear, DotProductAttention and torch LayerNorm, no Transformer Engine, no Apex),
TP = PP = 1 in a single-process torch.distributed group, learned absolute position embeddings,
LayerNorm eps 1e-5, biases on, the output layer tied to the word embedding, dropout 0, vocabulary
padded to 50304.

Precision and optimizer are Megatron's --bf16 recipe, as Megatron-LM's training loop sets it up:
bf16 parameters (Float16Module), Megatron's DistributedDataParallel with an fp32 gradient buffer
(grad_reduce_in_fp32, no overlap, no distributed optimizer), and Megatron's own optimizer from
get_megatron_optimizer: Float16OptimizerWithFloat16Params (fp32 main parameters) around
torch.optim.AdamW -- the class Megatron falls back to when neither Transformer Engine nor Apex is
installed -- with betas 0.9/0.95, eps 1e-8, weight decay 0.1 (0 on biases and norms, Megatron's
rule) and gradient clipping at 1.0. Each step: zero the grad buffer, forward, mean token loss,
backward, finalize_model_grads, optimizer.step().

Fusions as Megatron-LM's defaults where they need no extra package: bias+GELU and
bias+dropout+add through megatron.core.jit (torch.compile); their GELU is the tanh
approximation, as megatron_c's. The masked-softmax fusion needs a CUDA extension the wheel does
not ship, so attention is Megatron's unfused DotProductAttention (baddbmm, softmax in fp32, bmm).
--no-fusions turns the two fusions off (GELU tanh applied on its own then).

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/megatron_core-0.16.1-*.whl
    PYTHONPATH=/tmp/site python3 bench/gpu/mcore_gpt.py --model 124M
    PYTHONPATH=/tmp/site python3 bench/gpu/mcore_gpt.py --cpu-check     # tiny logic check

Output: one BENCH line (peer_common.py describes the fields), impl=mcore-local.
"""

import os
import socket
import sys
import types
import warnings
from contextlib import nullcontext

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common as pc  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
except ImportError as exc:
    sys.stderr.write(f"error: mcore_gpt.py: cannot import torch ({exc})\n")
    sys.exit(2)

MCORE_VERSION = "0.16.1"
INSTALL_HINT = ("python3 -m pip install -q --no-index --no-deps --target /tmp/site "
                ".whl/megatron_core-0.16.1-*.whl && export PYTHONPATH=/tmp/site")


def import_megatron():
    """The Megatron-Core pieces this peer uses, or a clear exit naming the install command."""
    with warnings.catch_warnings():
        # "Apex is not installed. Falling back to Torch Norm" and the like: expected here.
        warnings.simplefilter("ignore")
        try:
            from megatron.core import package_info, parallel_state, tensor_parallel
            from megatron.core.distributed import (DistributedDataParallel,
                                                   DistributedDataParallelConfig,
                                                   finalize_model_grads)
            from megatron.core.models.gpt import GPTModel
            from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
            from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
            from megatron.core.transformer import TransformerConfig
            from megatron.core.transformer.module import Float16Module
        except ImportError as exc:
            sys.stderr.write(f"error: mcore_gpt.py: cannot import megatron.core ({exc}); "
                             f"install the wheel: {INSTALL_HINT}\n")
            sys.exit(2)
    if package_info.__version__ != MCORE_VERSION:
        sys.stderr.write(f"warning: mcore_gpt.py: megatron.core is {package_info.__version__}, "
                         f"the published peer numbers are for {MCORE_VERSION}\n")
    return types.SimpleNamespace(
        package_info=package_info, parallel_state=parallel_state, tensor_parallel=tensor_parallel,
        DistributedDataParallel=DistributedDataParallel,
        DistributedDataParallelConfig=DistributedDataParallelConfig,
        finalize_model_grads=finalize_model_grads, GPTModel=GPTModel,
        get_gpt_layer_local_spec=get_gpt_layer_local_spec, OptimizerConfig=OptimizerConfig,
        get_megatron_optimizer=get_megatron_optimizer, TransformerConfig=TransformerConfig,
        Float16Module=Float16Module)


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_parallel_state(mc, device, seed):
    """A one-process torch.distributed group, then Megatron's TP=1 PP=1 state and RNG seeds."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.distributed.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    else:
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    # The gloo groups serve the distributed optimizer's checkpointing, which this run does not use.
    mc.parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
        create_gloo_process_groups=False)
    torch.manual_seed(seed)
    if device.type == "cuda":
        mc.tensor_parallel.model_parallel_cuda_manual_seed(seed)
    else:
        install_cpu_shims(mc)


def install_cpu_shims(mc):
    """For the CPU check only: the two CUDA-only helpers DotProductAttention calls.

    The CUDA RNG tracker cannot hold CPU generator states (attention dropout is 0, so there is
    nothing to fork), and the global memory buffer allocates on the current CUDA device.
    """
    mc.tensor_parallel.get_cuda_rng_tracker = lambda *a, **k: types.SimpleNamespace(
        fork=lambda *a, **k: nullcontext())
    mc.parallel_state.get_global_memory_buffer = lambda: types.SimpleNamespace(
        get_tensor=lambda shape, dtype, name, **k: torch.empty(shape, dtype=dtype))


def build_config(mc, layers, hidden, heads, fusions, on_gpu, dtype=torch.bfloat16):
    """Megatron's TransformerConfig of the GPT-2 shape; dtype bf16 is Megatron's --bf16."""
    return mc.TransformerConfig(
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        ffn_hidden_size=4 * hidden,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        layernorm_epsilon=1e-5,
        normalization="LayerNorm",
        add_bias_linear=True,
        gated_linear_unit=False,
        # Megatron's bias+GELU fusion is chosen by activation_func == F.gelu and computes the
        # tanh approximation; without the fusion the tanh GELU is named directly.
        activation_func=F.gelu if fusions else gelu_tanh,
        bias_activation_fusion=fusions,
        bias_dropout_fusion=fusions,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        init_method_std=0.02,
        bf16=dtype == torch.bfloat16,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        tensor_model_parallel_size=1,
        pipeline_model_parallel_size=1,
        sequence_parallel=False,
        transformer_impl="local",
        use_cpu_initialization=not on_gpu,
    )


def build_model(mc, config, vocab, seq, device):
    model = mc.GPTModel(
        config=config,
        transformer_layer_spec=mc.get_gpt_layer_local_spec(),
        vocab_size=vocab,
        max_sequence_length=seq,
        pre_process=True,
        post_process=True,
        parallel_output=True,
        share_embeddings_and_output_weights=True,
        position_embedding_type="learned_absolute",
    )
    return model.to(device)


def main():
    parser = pc.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--no-fusions", action="store_true",
                        help="turn off the bias+GELU and bias+dropout+add fusions")
    args = parser.parse_args()
    pc.check_args(args, parser)

    if args.cpu_check:
        device = torch.device("cpu")
        layers, hidden, heads = pc.apply_cpu_check(args)
    else:
        pc.require_cuda(torch, "mcore_gpt.py")
        device = torch.device("cuda", 0)
        layers, hidden, heads = pc.MODELS[args.model]
    mc = import_megatron()
    vocab = pc.padded_vocab()
    fusions = not args.no_fusions
    on_gpu = device.type == "cuda"

    init_parallel_state(mc, device, args.seed)
    config = build_config(mc, layers, hidden, heads, fusions, on_gpu)
    gpt = build_model(mc, config, vocab, args.seq, device)
    params = sum(p.numel() for p in gpt.parameters())
    expected = pc.gpt2_param_count(layers, hidden, args.seq, vocab)
    if params != expected:
        sys.stderr.write(f"error: mcore_gpt.py: GPTModel has {params} parameters, the shape "
                         f"formula says {expected}\n")
        return 1
    model = mc.Float16Module(config, gpt)

    if on_gpu:
        ddp_config = mc.DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=False)
        model = mc.DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)
        opt_config = mc.OptimizerConfig(
            optimizer="adam", lr=args.lr, weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.95,
            adam_eps=1e-8, clip_grad=1.0, bf16=True, params_dtype=torch.bfloat16,
            use_distributed_optimizer=False)
        optimizer = mc.get_megatron_optimizer(opt_config, [model], use_gloo_process_groups=False)
        optimizer_name = "megatron Float16OptimizerWithFloat16Params(torch.optim.AdamW)"

        def step(tokens, labels):
            model.zero_grad_buffer()
            optimizer.zero_grad()
            loss = model(tokens, positions, causal_mask, labels=labels).mean()  # [b, s] fp32 -> ()
            loss.backward()
            mc.finalize_model_grads([model])
            ok, _grad_norm, _ = optimizer.step()
            if not ok:
                raise RuntimeError("Megatron's optimizer skipped the step (inf/nan gradients)")
            return loss.detach()
    else:
        # Megatron's grad buffer and mixed-precision optimizer allocate on CUDA only; the CPU
        # check trains the same model with plain AdamW on its bf16 parameters.
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                      eps=1e-8, weight_decay=0.1)
        optimizer_name = "torch.optim.AdamW on bf16 params (CPU check only)"

        def step(tokens, labels):
            optimizer.zero_grad(set_to_none=True)
            loss = model(tokens, positions, causal_mask, labels=labels).mean()
            loss.backward()
            optimizer.step()
            return loss.detach()

    positions = torch.arange(args.seq, device=device).unsqueeze(0).expand(args.batch, -1)
    # Megatron's mask convention: True = masked out; [1, 1, s, s], as its GPT data loader builds.
    causal_mask = torch.ones(args.seq, args.seq, dtype=torch.bool, device=device).triu(1)
    causal_mask = causal_mask.view(1, 1, args.seq, args.seq)
    if on_gpu:
        torch.cuda.reset_peak_memory_stats(device)
    batches = pc.random_batches(torch, args.batches, args.batch, args.seq, device, args.seed)
    timing = pc.timed_training(torch, step, batches, args.warmup, args.steps, device)
    peak = torch.cuda.max_memory_allocated(device) if on_gpu else 0

    extra = pc.device_facts(torch, device)
    extra.update({
        "megatron_core": mc.package_info.__version__, "spec": "get_gpt_layer_local_spec",
        "precision": "bf16 params, fp32 grad buffer, fp32 main params" if on_gpu
                     else "bf16 params", "optimizer": optimizer_name,
        "clip_grad": 1.0, "fusions": "bias-gelu,bias-dropout-add" if fusions else "none",
        "attention": "DotProductAttention (unfused, softmax in fp32)",
    })
    rec = pc.make_record("mcore-local", args, layers, hidden, vocab, params, timing, peak, extra)
    status = pc.emit(rec, args, tag="CHECK" if args.cpu_check else "BENCH")
    mc.parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
