/* labs/lab06_attention.h - what lab06's attention modules are, and what they may call.

   An attention module here is what Megatron puts in a ModuleSpec's self_attention slot: an
   mc_transformer_spec (megatron_c.h >>transformer) made from the local spec with its two
   attention functions replaced, plus the optional fields that describe the module to the
   model (the shapes it accepts, the bytes it keeps per micro-batch, its parameter names).
   The model, mc_gpt, stays the same code for every module: it registers the parameters,
   runs the norms, the residuals, the hidden dropouts and the MLP, keeps one cache per layer
   and micro-batch slot, replays layers under recompute, and hands the module a mc_layer_ctx
   with the layer's weights (ctx->w), grads (ctx->g) and the module's own cache and scratch.

   Three sources define the modules lab06 runs:
     labs/lab06_attention.c   YOURS: a plain attention that keeps the probabilities. Edit it,
                              `make lab06`, run the lab: the integration matrix grades it.
     labs/lab06_builtin.c     the built-in example, an online-softmax ("flash") attention that
                              keeps only the row log-sum-exp, and five copies of it with one
                              integration mistake each.
   Both compute the attention core on the host (the tensors are downloaded from the op table
   and uploaded back), so they run on the CPU table and on a GPU's; the linear layers and their
   tensor-parallel communication are the library's public calls.

   Shapes per layer call (this lab runs without sequence parallelism, so Ns = N):
     N = S * B tokens, token n = s * B + b (sequence first, like every activation);
     inp [N, H] (the input_layernorm output) and out [N, H] (before the hidden dropout);
     QKV = ColumnParallel(inp) [N, 3 * Ql]: per head h of this TP rank the rows
           [h * 3 * HD, (h + 1) * 3 * HD) are [q | k | v], HD rows each (Megatron's fused
           layout, so a dim-0 shard of linear_qkv holds whole heads);
     ctx = causal softmax(q k^T / sqrt(HD)) v per local head [N, Ql], Ql = NHl * HD;
     out = RowParallel(ctx) + bias (the all-reduce over TP is inside the call).
   gpt->NHl heads live on this rank (gpt->NH / TP); gpt->NH is the model's total.
   Attention-probability dropout: element ((b * NHl + h) * S + t) * S + t2 of the draw is kept
   when mc_rng_uniform_at(seed, offset + index) >= p (the op table's rule). */
#ifndef LAB06_ATTENTION_H_INCLUDED
#define LAB06_ATTENTION_H_INCLUDED

#include <stddef.h>
#include <stdint.h>

#include "megatron_c.h"

/* One dropout draw: p == 0 means off (eval mode, or attention_dropout 0: nothing drawn). */
typedef struct lab06_draw {
    uint64_t seed, offset;
    float p;
    uint32_t unused;
} lab06_draw;

/* Takes (seed, offset) for n elements from the tracker stream `stream` of gpt->rng
   (MC_RNG_MODEL_PARALLEL for attention probabilities, as Megatron forks
   get_cuda_rng_tracker() around core attention; MC_RNG_DEFAULT is the generator outside any
   fork) and advances it by n rounded up to 4, when the model is training and
   config.attention_dropout > 0; else d->p = 0 and no stream moves. Returns 0 or a status. */
int lab06_draw_dropout(mc_gpt *gpt, const char *stream, size_t n, lab06_draw *d);

/* The model's tensor-parallel communicator (NULL at TP = 1) and the flags of its linear
   layers (sequence parallelism). */
mc_comm *lab06_tp(const mc_gpt *gpt);
int lab06_tp_flags(const mc_gpt *gpt);

/* labs/lab06_attention.c: your module. */
const mc_transformer_spec *lab06_yours_spec(void);

/* labs/lab06_builtin.c: the built-in module and its broken copies. */
enum lab06_variant {
    LAB06_BUILTIN = 0,        /* correct */
    LAB06_NO_CAUSAL_MASK,     /* every token attends to every position, later ones too */
    LAB06_GLOBAL_HEADS,       /* splits this rank's QKV shard into the model's NH heads */
    LAB06_DEFAULT_RNG,        /* draws the probability dropout from the default generator */
    LAB06_SHARED_CACHE,       /* keeps its saved tensors in one buffer per layer */
    LAB06_RENAMED_PARAM,      /* registers linear_qkv under the legacy query_key_value key */
    LAB06_N_VARIANTS
};
const mc_transformer_spec *lab06_builtin_spec(int variant);
const char *lab06_variant_name(int variant);       /* "no_causal_mask" */
const char *lab06_variant_mistake(int variant);    /* one line: the mistake it makes */

#endif /* LAB06_ATTENTION_H_INCLUDED */
