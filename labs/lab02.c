/* labs/lab02.c - M002: Megatron-Core's package map, and localising a loss anomaly.

       make lab02 && mpirun --oversubscribe -np 4 ./lab02                   the symptom
       mpirun --oversubscribe -np 4 ./lab02 --probe decoder.layers.1        one probe

   A GPT of 4 layers on TP=2 x PP=2 (default world 4; --tp 4 on 8 ranks also works), with
   sequence parallelism and tied embeddings, trained for 3 steps of 2 micro-batches. Every rank
   also trains the same model alone (TP=1, PP=1, one process: the reference) on the same data
   from the same initial weights, which the library makes TP-invariant.

     A. The package map, measured on a clean run: the module tree (which stage and ranks hold
        which module, its Megatron-Core package) and every collective of one step attributed
        to the module or package that issued it (the communicators are wrapped by counters;
        a module's tensor tap closes its count). Compared with: the collective counts the
        header documents for each layer, and the reference (every tapped tensor, parameter,
        gradient and loss within tolerance). Two cross-links: the CE's row-max all-reduce
        done as a SUM (harmless: the loss is shift-invariant) and a checkpoint saved at
        TP=2 PP=2 and loaded into the TP=1 model (resharded, equal to the TP=2 shards).
     B. The symptom: the same run with a hidden fault drawn from the nonce (one of eight, in
        the real library path, compiled only into this lab's library build: MC_FAULT_HOOKS).
        Shown: the loss and the grad norm of every step beside the reference's, and the loss
        on every last-stage rank. Nothing else.
     C. With --probe MODULE only: the tensor oracle for that module. Its forward input and
        output, the gradients of its output and input, its parameter gradients (after
        finalize_model_grads) and its parameters (at the start of each step), against the
        reference (this rank's shard against the matching slice of the TP=1 tensor). Every
        probe is counted per nonce in results/lab02.probes.json.
   The fault stays hidden until the follow-up pred block (the diagnosis) is locked: a run that
   sees those keys filled locks them (the rubric's "lock_when_filled"), then the lab reveals
   the fault, the first divergent module as the full oracle finds it, and the probe count. */
#include "grader.h"
#include "lab_driver.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
   sizes */

#define L02_LAYERS 4
#define L02_HIDDEN 32
#define L02_HEADS 4
#define L02_FFN 64
#define L02_VOCAB 32          /* padded vocabulary 32 at TP 1, 2 and 4 */
#define L02_SEQ 8
#define L02_MBS 2
#define L02_N (L02_SEQ * L02_MBS)
#define L02_M 2               /* micro-batches per step */
#define L02_STEPS 3
#define L02_LR 1e-2f
/* Adam's eps, larger than the usual 1e-8: a gradient that is zero in exact arithmetic (the
   key bias of attention: softmax ignores a shift of every key) is rounding noise of 1e-9,
   which 1e-8 would turn into full lr-sized steps that differ between TP=2 and TP=1. */
#define L02_ADAM_EPS 1e-4f
#define L02_SEED 1234
#define L02_DATA_SEED 20261202ull
#define L02_PROBE_BUDGET 4
#define L02_MAX_WORLD 8
/* A tensor differs from the reference when ||a - b|| / ||b|| exceeds this. The clean TP=2 run
   stays below 1e-5 (rounding of the split sums); every fault here moves its first tensor
   by more than 1e-2. */
#define L02_TOL 1e-3
#define L02_CLEAN_TOL 1e-4    /* what the clean run must stay below everywhere */
/* The loss or the grad norm of a step differs above this (relative); the clean run's stay
   below 1e-7. */
#define L02_LOSS_TOL 1e-6

/* ---------------------------------------------------------------------------------------------
   modules: the primitives the model taps, in forward order, then the composites */

enum { L02_SUB_LAYER, L02_SUB_LN1, L02_SUB_ATTN, L02_SUB_QKV, L02_SUB_CORE, L02_SUB_PROJ,
       L02_SUB_LN2, L02_SUB_MLP, L02_SUB_FC1, L02_SUB_FC2, L02_N_SUB };
static const char *const l02_sub_name[L02_N_SUB] = {
    "", ".input_layernorm", ".self_attention", ".self_attention.linear_qkv",
    ".self_attention.core_attention", ".self_attention.linear_proj", ".pre_mlp_layernorm", ".mlp",
    ".mlp.linear_fc1", ".mlp.linear_fc2"};
/* The leaves of a layer in forward order (the layer, attention and MLP are their sums). */
static const int l02_leaves[] = {L02_SUB_LN1, L02_SUB_QKV, L02_SUB_CORE, L02_SUB_PROJ,
                                 L02_SUB_LN2, L02_SUB_FC1, L02_SUB_FC2};
#define L02_N_LEAVES 7
#define L02_MOD_EMB 0
#define L02_MOD_LAYER(l, sub) (1 + (l) * L02_N_SUB + (sub))
#define L02_MOD_FINAL_LN (1 + L02_LAYERS * L02_N_SUB)
#define L02_MOD_OUTPUT (L02_MOD_FINAL_LN + 1)
#define L02_MOD_LOSS (L02_MOD_FINAL_LN + 2)
#define L02_N_PRIM (L02_MOD_FINAL_LN + 3)
#define L02_MOD_DECODER L02_N_PRIM        /* composite: layers 0 .. L-1 */
#define L02_MOD_GPT (L02_N_PRIM + 1)      /* composite: the whole model */
#define L02_N_MOD (L02_N_PRIM + 2)

static char l02_mod_names[L02_N_MOD][64];

static void l02_names_init(void) {
    snprintf(l02_mod_names[L02_MOD_EMB], 64, "embedding");
    for (int l = 0; l < L02_LAYERS; l++)
        for (int s = 0; s < L02_N_SUB; s++)
            snprintf(l02_mod_names[L02_MOD_LAYER(l, s)], 64, "decoder.layers.%d%s", l,
                     l02_sub_name[s]);
    snprintf(l02_mod_names[L02_MOD_FINAL_LN], 64, "decoder.final_layernorm");
    snprintf(l02_mod_names[L02_MOD_OUTPUT], 64, "output_layer");
    snprintf(l02_mod_names[L02_MOD_LOSS], 64, "loss");
    snprintf(l02_mod_names[L02_MOD_DECODER], 64, "decoder");
    snprintf(l02_mod_names[L02_MOD_GPT], 64, "gpt");
}

static int l02_module_index(const char *name) {
    for (int m = 0; m < L02_N_MOD; m++)
        if (name != NULL && strcmp(name, l02_mod_names[m]) == 0) return m;
    return -1;
}

/* Megatron-Core's package of each module (what the tree prints). */
static const char *l02_package(int m) {
    if (m == L02_MOD_EMB) return "models.common.embeddings, tensor_parallel";
    if (m == L02_MOD_FINAL_LN) return "transformer.transformer_block";
    if (m == L02_MOD_OUTPUT) return "tensor_parallel (ColumnParallelLinear)";
    if (m == L02_MOD_LOSS) return "tensor_parallel (cross_entropy)";
    switch ((m - 1) % L02_N_SUB) {
    case L02_SUB_LAYER: return "transformer.transformer_layer";
    case L02_SUB_ATTN: return "transformer.attention";
    case L02_SUB_QKV: return "tensor_parallel (ColumnParallelLinear)";
    case L02_SUB_CORE: return "transformer.dot_product_attention";
    case L02_SUB_PROJ: return "tensor_parallel (RowParallelLinear)";
    case L02_SUB_MLP: return "transformer.mlp";
    case L02_SUB_FC1: return "tensor_parallel (ColumnParallelLinear)";
    case L02_SUB_FC2: return "tensor_parallel (RowParallelLinear)";
    default: return "transformer (the spec's LayerNorm)";
    }
}

/* The module that owns parameter `name` (the longest module name that prefixes it). */
static int l02_param_owner(const char *name) {
    int best = -1;
    size_t best_len = 0;
    for (int m = 0; m < L02_N_PRIM; m++) {
        size_t n = strlen(l02_mod_names[m]);
        if (n > best_len && strncmp(name, l02_mod_names[m], n) == 0 && name[n] == '.') {
            best = m;
            best_len = n;
        }
    }
    return best;
}

/* Parameter `name` belongs to module m (composites hold their children's parameters). */
static int l02_param_in_module(const char *name, int m) {
    if (m == L02_MOD_GPT) return 1;
    if (m == L02_MOD_DECODER) return strncmp(name, "decoder.", 8) == 0;
    size_t n = strlen(l02_mod_names[m]);
    return strncmp(name, l02_mod_names[m], n) == 0 && name[n] == '.';
}

/* ---------------------------------------------------------------------------------------------
   the faults: one of eight, drawn from the nonce */

enum {
    L02_F_QKV,
    L02_F_SOFTMAX,
    L02_F_ROW,
    L02_F_COLUMN,
    L02_F_CE,
    L02_F_EMBEDDING,
    L02_F_SP_NORM,
    L02_F_OPTIMIZER,
    L02_N_FAULTS
};

static const struct {
    const char *id;
    mc_fault_kind kind;
    const char *phase;        /* forward, loss, backward_communication, grad_finalize, optimizer */
    const char *collective;   /* the culprit collective, or none */
    const char *what;
} l02_faults[L02_N_FAULTS] = {
    {"qkv_shard", MC_FAULT_QKV_SHARD, "forward", "none",
     "the linear_qkv output of one TP rank is corrupted (x1.5)"},
    {"softmax_scale", MC_FAULT_SOFTMAX_SCALE, "forward", "none",
     "the attention uses the softmax scale 1/kv_channels instead of 1/sqrt(kv_channels)"},
    {"row_no_reduce", MC_FAULT_ROW_NO_REDUCE, "forward", "row_parallel_output",
     "the row-parallel layer skips the reduction of its output over TP (a reduce-scatter under "
     "SP, an all-reduce without)"},
    {"column_no_dgrad_reduce", MC_FAULT_COLUMN_NO_DGRAD_REDUCE, "backward_communication",
     "column_parallel_input_grad",
     "the column-parallel layer skips the reduction of its input gradient over TP in backward"},
    {"ce_sum_exp_max", MC_FAULT_CE_SUM_EXP_MAX, "loss", "cross_entropy",
     "the vocab-parallel cross entropy all-reduces its sums of exp with MAX instead of SUM"},
    {"no_embedding_grad_sync", MC_FAULT_NO_EMBEDDING_GRAD_SYNC, "grad_finalize",
     "embedding_group",
     "finalize_model_grads skips the embedding-group all-reduce of the tied word embedding"},
    {"no_sp_norm_grad_sync", MC_FAULT_NO_SP_GRAD_SYNC, "grad_finalize",
     "sequence_parallel_grads",
     "finalize_model_grads leaves one LayerNorm out of the sequence-parallel TP all-reduce"},
    {"optimizer_skips_param", MC_FAULT_OPTIMIZER_SKIPS_PARAM, "optimizer", "none",
     "the optimizer step leaves one weight unchanged"},
};

typedef struct l02_fault {
    int which;                /* L02_F_* */
    mc_fault_desc desc;
    char param[96];           /* the parameter (prefix) of the SP and optimizer faults */
    char module[64];          /* the module a correct diagnosis names */
} l02_fault;

static uint64_t l02_mix(uint64_t x) {   /* splitmix64's finaliser */
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* The derivation (stable: changing it re-deals every learner's fault). With
   x = splitmix64(FNV-1a(nonce) xor 0x6c61623032), fields are taken from x in turn:
   fault = x mod 8, layer = next mod 4, submodule = next mod 2 (attention, mlp),
   tp_rank = next mod 2, norm = next mod 9 (layer n/2's input (even n) or pre-MLP (odd n)
   LayerNorm, 8 = final_layernorm), weight = next mod 2 (the submodule's first or second
   linear). */
static void l02_fault_from_nonce(const char *nonce, l02_fault *f) {
    uint64_t x = l02_mix((uint64_t)lab_nonce_hash(nonce) ^ 0x6c61623032ull);
    memset(f, 0, sizeof *f);
    f->which = (int)(x % L02_N_FAULTS), x /= L02_N_FAULTS;
    int layer = (int)(x % L02_LAYERS);
    x /= L02_LAYERS;
    int sub = (int)(x % 2);
    x /= 2;
    int tp_rank = (int)(x % 2);
    x /= 2;
    int norm = (int)(x % (2 * L02_LAYERS + 1));
    x /= 2 * L02_LAYERS + 1;
    int weight = (int)(x % 2);
    static const char *const linear[2][2] = {{"linear_qkv", "linear_proj"},
                                             {"linear_fc1", "linear_fc2"}};
    f->desc.kind = l02_faults[f->which].kind;
    f->desc.layer = layer;
    f->desc.submodule = sub ? MC_FAULT_MLP : MC_FAULT_ATTENTION;
    f->desc.tp_rank = tp_rank;
    f->desc.factor = f->which == L02_F_QKV ? 1.5f : 1.0f;
    if (f->which == L02_F_SOFTMAX) f->desc.factor = (float)(1.0 / sqrt(L02_HIDDEN / L02_HEADS));
    const char *sub_name = sub ? "mlp" : "self_attention";
    switch (f->which) {
    case L02_F_QKV:
    case L02_F_SOFTMAX:
        f->desc.submodule = MC_FAULT_ATTENTION;
        snprintf(f->module, sizeof f->module, "decoder.layers.%d.self_attention.%s", layer,
                 f->which == L02_F_QKV ? "linear_qkv" : "core_attention");
        break;
    case L02_F_ROW:
    case L02_F_COLUMN:
        snprintf(f->module, sizeof f->module, "decoder.layers.%d.%s.%s", layer, sub_name,
                 linear[sub][f->which == L02_F_ROW]);
        break;
    case L02_F_CE: snprintf(f->module, sizeof f->module, "loss"); break;
    case L02_F_EMBEDDING: snprintf(f->module, sizeof f->module, "embedding"); break;
    case L02_F_SP_NORM:
        if (norm == 2 * L02_LAYERS)
            snprintf(f->module, sizeof f->module, "decoder.final_layernorm");
        else
            snprintf(f->module, sizeof f->module, "decoder.layers.%d.%s", norm / 2,
                     norm % 2 ? "pre_mlp_layernorm" : "input_layernorm");
        snprintf(f->param, sizeof f->param, "%s.", f->module);
        break;
    case L02_F_OPTIMIZER:
        snprintf(f->module, sizeof f->module, "decoder.layers.%d.%s.%s", layer, sub_name,
                 linear[sub][weight]);
        snprintf(f->param, sizeof f->param, "%s.weight", f->module);
        break;
    }
    f->desc.param = f->param[0] ? f->param : NULL;
}

/* ---------------------------------------------------------------------------------------------
   what a run records on one rank: taps, parameters, gradients, losses */

typedef struct l02_tensor {
    int rows, cols, row_shard, col_shard;
    float *data;              /* host, fp32; NULL when the tap had none */
} l02_tensor;

typedef struct l02_rec {
    int step, microbatch, backward, module;
    l02_tensor in, out;
} l02_rec;

typedef struct l02_run {
    l02_rec *recs;
    int n_recs, cap_recs;
    float *params[L02_STEPS]; /* the flat buffer at the start of each step */
    float *grads[L02_STEPS];  /* after finalize_model_grads */
    double loss[L02_STEPS];   /* this rank's mean loss per token (last stage; else 0) */
    double grad_norm[L02_STEPS];
} l02_run;

static void l02_run_free(l02_run *r) {
    for (int i = 0; i < r->n_recs; i++) {
        free(r->recs[i].in.data);
        free(r->recs[i].out.data);
    }
    free(r->recs);
    for (int k = 0; k < L02_STEPS; k++) {
        free(r->params[k]);
        free(r->grads[k]);
    }
    memset(r, 0, sizeof *r);
}

/* ---------------------------------------------------------------------------------------------
   counting collectives: every communicator of the layout gets a wrapping op table */

enum { L02_G_TP, L02_G_PP, L02_G_EMB, L02_G_MP, L02_G_DP, L02_G_WORLD, L02_N_GROUPS };
static const char *const l02_group_name[L02_N_GROUPS] = {"tp", "pp", "embedding", "mp", "dp",
                                                         "world"};
enum { L02_OP_AR, L02_OP_AG, L02_OP_RS, L02_OP_BC, L02_OP_P2P, L02_OP_BARRIER, L02_N_OPS };
static const char *const l02_op_name[L02_N_OPS] = {"all_reduce", "all_gather", "reduce_scatter",
                                                   "broadcast", "p2p", "barrier"};
static const char *const l02_op_abbr[L02_N_OPS] = {"AR", "AG", "RS", "BC", "P2P", "BAR"};
/* Where a collective is booked: a module's forward or backward (the TP group, closed by the
   module's tap), or one of the packages the lab calls directly. */
enum { L02_AT_SCHEDULE = 2 * L02_N_PRIM, L02_AT_FINALIZE, L02_AT_OPTIMIZER, L02_AT_CHECKPOINT,
       L02_N_AT };

typedef struct l02_counter {
    int mode;                 /* L02_AT_*, or -1: the model (TP ops wait for the next tap) */
    int pending[L02_N_OPS];   /* TP ops since the last tap */
    int counts[L02_N_AT][L02_N_GROUPS][L02_N_OPS];
    int on;
} l02_counter;

static l02_counter l02_cnt;

typedef struct l02_wrap {
    mc_comm *comm;
    const mc_comm_ops *orig;
    int group;
} l02_wrap;
static l02_wrap l02_wraps[L02_N_GROUPS];
static int l02_n_wraps;
static mc_comm_ops l02_counting_ops;

static const l02_wrap *l02_wrap_of(const mc_comm *c) {
    for (int i = 0; i < l02_n_wraps; i++)
        if (l02_wraps[i].comm == c) return &l02_wraps[i];
    return NULL;
}

static void l02_count(const mc_comm *c, int op, int n) {
    const l02_wrap *w = l02_wrap_of(c);
    if (!l02_cnt.on || w == NULL) return;
    if (l02_cnt.mode >= 0)
        l02_cnt.counts[l02_cnt.mode][w->group][op] += n;
    else if (w->group == L02_G_TP)
        l02_cnt.pending[op] += n;
    else
        l02_cnt.counts[L02_AT_SCHEDULE][w->group][op] += n;
}

static int l02_c_all_reduce(mc_comm *c, const void *s, void *r, size_t n, mc_dtype dt,
                            mc_reduce_op op, mc_request **req) {
    l02_count(c, L02_OP_AR, 1);
    return l02_wrap_of(c)->orig->all_reduce(c, s, r, n, dt, op, req);
}
static int l02_c_all_gather(mc_comm *c, const void *s, void *r, size_t n, mc_dtype dt,
                            mc_request **req) {
    l02_count(c, L02_OP_AG, 1);
    return l02_wrap_of(c)->orig->all_gather(c, s, r, n, dt, req);
}
static int l02_c_reduce_scatter(mc_comm *c, const void *s, void *r, size_t n, mc_dtype dt,
                                mc_reduce_op op, mc_request **req) {
    l02_count(c, L02_OP_RS, 1);
    return l02_wrap_of(c)->orig->reduce_scatter(c, s, r, n, dt, op, req);
}
static int l02_c_broadcast(mc_comm *c, void *b, size_t n, mc_dtype dt, int root,
                           mc_request **req) {
    l02_count(c, L02_OP_BC, 1);
    return l02_wrap_of(c)->orig->broadcast(c, b, n, dt, root, req);
}
static int l02_c_send(mc_comm *c, const void *b, size_t n, mc_dtype dt, int peer, int tag,
                      mc_request **req) {
    l02_count(c, L02_OP_P2P, 1);
    return l02_wrap_of(c)->orig->send(c, b, n, dt, peer, tag, req);
}
static int l02_c_recv(mc_comm *c, void *b, size_t n, mc_dtype dt, int peer, int tag,
                      mc_request **req) {
    l02_count(c, L02_OP_P2P, 1);
    return l02_wrap_of(c)->orig->recv(c, b, n, dt, peer, tag, req);
}
static int l02_c_batch(mc_comm *c, const mc_p2p_op *ops, int n, mc_request **req) {
    int sends = 0;
    for (int i = 0; i < n; i++) sends += ops[i].is_send;
    l02_count(c, L02_OP_P2P, sends);   /* messages sent: one per activation or gradient */
    return l02_wrap_of(c)->orig->batch_send_recv(c, ops, n, req);
}
static int l02_c_barrier(mc_comm *c, mc_request **req) {
    l02_count(c, L02_OP_BARRIER, 1);
    return l02_wrap_of(c)->orig->barrier(c, req);
}
static int l02_c_wait(mc_request *req, double timeout_s) {
    const mc_request_head *h = (const mc_request_head *)req;
    return l02_wrap_of(h->comm)->orig->wait(req, timeout_s);
}
static int l02_c_test(mc_request *req, int *done) {
    const mc_request_head *h = (const mc_request_head *)req;
    return l02_wrap_of(h->comm)->orig->test(req, done);
}
static int l02_c_create_child(mc_comm *c, const int *members, int n, int seq, mc_comm **out) {
    return l02_wrap_of(c)->orig->create_child(c, members, n, seq, out);
}
static void l02_c_destroy(mc_comm *c) { l02_wrap_of(c)->orig->destroy(c); }

/* Wraps the layout's communicators (the first kind named wins when two share one). */
static void l02_wrap_comms(mc_parallel_state *ps) {
    static const mc_group_kind kinds[] = {MC_GROUP_TP, MC_GROUP_PP, MC_GROUP_EMBEDDING,
                                          MC_GROUP_MP, MC_GROUP_DP_CP};
    l02_counting_ops = (mc_comm_ops){"counting", l02_c_all_reduce, l02_c_all_gather,
                                     l02_c_reduce_scatter, l02_c_broadcast, l02_c_send,
                                     l02_c_recv, l02_c_batch, l02_c_barrier, l02_c_wait,
                                     l02_c_test, l02_c_create_child, l02_c_destroy,
                                     /* no completion markers: the lab runs on mpi, whose
                                        blocking calls have finished when they return */
                                     NULL, NULL, NULL};
    l02_n_wraps = 0;
    for (int g = 0; g <= (int)(sizeof kinds / sizeof kinds[0]); g++) {
        mc_comm *c = g < (int)(sizeof kinds / sizeof kinds[0]) ? mc_parallel_group(ps, kinds[g])
                                                               : ps->world;
        if (c == NULL || l02_wrap_of(c) != NULL) continue;
        l02_wraps[l02_n_wraps++] = (l02_wrap){c, c->ops, g};
        c->ops = &l02_counting_ops;
    }
}

static void l02_unwrap_comms(void) {
    for (int i = 0; i < l02_n_wraps; i++) l02_wraps[i].comm->ops = l02_wraps[i].orig;
    l02_n_wraps = 0;
}

/* A tap closes the TP count of its module (forward or backward). */
static void l02_count_tap(int module, int backward) {
    if (!l02_cnt.on || l02_cnt.mode >= 0) return;
    for (int op = 0; op < L02_N_OPS; op++) {
        l02_cnt.counts[2 * module + backward][L02_G_TP][op] += l02_cnt.pending[op];
        l02_cnt.pending[op] = 0;
    }
}

/* ---------------------------------------------------------------------------------------------
   the application: one model, its data, the schedule's hooks */

typedef struct l02_app {
    mc_parallel_state *ps;
    int first, last, tp, tp_rank, sp;
    mc_gpt gpt;
    mc_ddp ddp;
    mc_optimizer opt;
    int ready;
    int step;
    int tokens[L02_N], labels[L02_N];
    l02_run run;
} l02_app;

static mc_gpt_config l02_config(int tp, int pp) {
    mc_gpt_config c;
    memset(&c, 0, sizeof c);
    c.num_layers = L02_LAYERS;
    c.hidden_size = L02_HIDDEN;
    c.num_attention_heads = L02_HEADS;
    c.ffn_hidden_size = L02_FFN;
    c.vocab_size = L02_VOCAB;
    c.make_vocab_size_divisible_by = 8;
    c.seq_length = L02_SEQ;
    c.max_position_embeddings = L02_SEQ;
    c.micro_batch_size = L02_MBS;
    c.init_method_std = 0.05f;
    c.hidden_dropout = MC_DROPOUT_OFF;
    c.attention_dropout = MC_DROPOUT_OFF;
    c.untie_embeddings_and_output_weights = 0;   /* tied: the last stage holds a copy */
    c.tensor_model_parallel_size = tp;
    c.pipeline_model_parallel_size = pp;
    c.sequence_parallel = tp > 1;
    c.seed = L02_SEED;
    return c;
}

/* Sample k: a token chain (next = 5 prev + 3 mod V, one token in eight random). */
static void l02_batch(int step, int microbatch, int *tokens, int *labels) {
    for (int j = 0; j < L02_MBS; j++) {
        long long k = ((long long)step * L02_M + microbatch) * L02_MBS + j;
        uint64_t at = (uint64_t)k * (uint64_t)(2 * (L02_SEQ + 1));
        int prev = (int)(mc_rng_bits_at(L02_DATA_SEED, at) % L02_VOCAB);
        for (int s = 0; s <= L02_SEQ; s++) {
            uint32_t r = mc_rng_bits_at(L02_DATA_SEED, at + 1 + (uint64_t)s);
            int t = s == 0        ? prev
                    : r % 8 == 0  ? (int)(r / 8 % L02_VOCAB)
                                  : (prev * 5 + 3) % L02_VOCAB;
            if (s < L02_SEQ) tokens[s * L02_MBS + j] = t;
            if (s > 0) labels[(s - 1) * L02_MBS + j] = t;
            prev = t;
        }
    }
}

static float *l02_download(const mc_ops *o, const void *src, size_t n) {
    float *h = lab_xcalloc(n, sizeof(float));
    MC_CHECK(o->download(o, h, src, n * sizeof(float)));
    return h;
}

static void l02_tap(void *user, const mc_gpt_tap *t) {
    l02_app *app = user;
    int m = l02_module_index(t->module);
    if (m < 0) return;
    l02_count_tap(m, t->backward);
    l02_run *r = &app->run;
    if (r->n_recs == r->cap_recs) {
        r->cap_recs = r->cap_recs ? 2 * r->cap_recs : 256;
        r->recs = realloc(r->recs, (size_t)r->cap_recs * sizeof *r->recs);
        if (r->recs == NULL) lab_abort(1);
    }
    l02_rec *rec = &r->recs[r->n_recs++];
    memset(rec, 0, sizeof *rec);
    rec->step = app->step;
    rec->microbatch = t->microbatch;
    rec->backward = t->backward;
    rec->module = m;
    const mc_gpt_tap_tensor *src[2] = {&t->in, &t->out};
    l02_tensor *dst[2] = {&rec->in, &rec->out};
    for (int i = 0; i < 2; i++) {
        if (src[i]->data == NULL) continue;
        if (src[i]->dtype != MC_F32) {
            fprintf(stderr, "lab02: the tap of %s is not fp32\n", t->module);
            lab_abort(1);
        }
        *dst[i] = (l02_tensor){src[i]->rows, src[i]->cols, src[i]->row_shard, src[i]->col_shard,
                               l02_download(app->gpt.ops, src[i]->data,
                                            (size_t)src[i]->rows * (size_t)src[i]->cols)};
    }
}

static int hook_forward(void *user, int chunk, int microbatch, const float *input,
                        float **output, double *loss_sum, double *num_tokens) {
    l02_app *app = user;
    l02_batch(app->step, microbatch, app->tokens, app->labels);
    return mc_gpt_forward_step(&app->gpt, chunk, microbatch, app->first ? app->tokens : NULL,
                               app->last ? app->labels : NULL, input, output, loss_sum,
                               num_tokens);
}

static int hook_backward(void *user, int chunk, int microbatch, const float *output_grad,
                         float loss_scale, float **input_grad) {
    l02_app *app = user;
    return mc_gpt_backward_step(&app->gpt, chunk, microbatch, output_grad, loss_scale,
                                input_grad);
}

static void hook_grad_sync(void *user, int chunk, int enable) {
    l02_app *app = user;
    mc_gpt_set_grad_sync(&app->gpt, chunk, enable);
    mc_ddp_set_grad_sync(&app->ddp, chunk, enable);
}

static int hook_finalize(void *user) {
    l02_app *app = user;
    int mode = l02_cnt.mode;
    l02_cnt.mode = L02_AT_FINALIZE;
    int rc = mc_finalize_model_grads(app->ps, &app->ddp, NULL, NULL, app->sp, NULL);
    l02_cnt.mode = mode;
    return rc;
}

static void l02_app_init(l02_app *app, mc_parallel_state *ps) {
    memset(app, 0, sizeof *app);
    app->ps = ps;
    app->first = mc_parallel_is_first_stage(ps, 1);
    app->last = mc_parallel_is_last_stage(ps, 1);
    app->tp = mc_parallel_size(ps, MC_GROUP_TP);
    app->tp_rank = mc_parallel_rank(ps, MC_GROUP_TP);
    app->sp = app->tp > 1;
    mc_gpt_desc gd;
    memset(&gd, 0, sizeof gd);
    gd.config = l02_config(app->tp, mc_parallel_size(ps, MC_GROUP_PP));
    gd.ps = ps;
    gd.ops = mc_comm_memory(ps->world);
    gd.n_slots = L02_M;
    gd.tap = l02_tap;
    gd.tap_user = app;
    MC_CHECK(mc_gpt_init(&app->gpt, &gd));
    MC_CHECK(mc_ddp_init(&app->ddp, &(mc_ddp_desc){.table = &app->gpt.table,
                                                   .grads = app->gpt.grads,
                                                   .dp = mc_parallel_group(ps, MC_GROUP_DP_CP),
                                                   .ops = app->gpt.ops}));
    MC_CHECK(mc_optimizer_init(&app->opt, &(mc_optimizer_desc){.ddp = &app->ddp,
                                                               .params = app->gpt.params,
                                                               .ps = ps,
                                                               .lr = L02_LR,
                                                               .min_lr = L02_LR,
                                                               .train_iters = L02_STEPS,
                                                               .eps = L02_ADAM_EPS,
                                                               .weight_decay =
                                                                   MC_WEIGHT_DECAY_OFF}));
    app->ready = 1;
}

static void l02_app_free(l02_app *app) {
    if (!app->ready) return;
    mc_optimizer_destroy(&app->opt);
    mc_ddp_destroy(&app->ddp);
    mc_gpt_destroy(&app->gpt);
    l02_run_free(&app->run);
    app->ready = 0;
}

/* Trains L02_STEPS steps; the fault (NULL: none) is set around the training calls only. */
static void l02_train(l02_app *app, const mc_fault_desc *fault) {
    static mc_schedule_result res;
    mc_schedule_hooks h;
    memset(&h, 0, sizeof h);
    h.app = app;
    h.forward_step = hook_forward;
    h.backward_step = hook_backward;
    h.grad_sync = hook_grad_sync;
    h.finalize = hook_finalize;
    h.tensor_elems = app->gpt.p2p_elems;
    mc_forward_backward_func fb = mc_get_forward_backward_func(app->ps);
    size_t total = app->gpt.table.total;
    for (int k = 0; k < L02_STEPS; k++) {
        app->step = k;
        app->run.params[k] = l02_download(app->gpt.ops, app->gpt.params, total);
        MC_CHECK(mc_ddp_zero_grad(&app->ddp));
        MC_CHECK(mc_gpt_zero_grad(&app->gpt));
        l02_cnt.mode = -1;
        mc_fault_inject(fault);
        int rc = fb(app->ps, &h, L02_M, 0, &res);
        app->run.grads[k] = rc == MC_OK ? l02_download(app->gpt.ops, app->gpt.grads, total) : NULL;
        l02_cnt.mode = L02_AT_OPTIMIZER;
        if (rc == MC_OK) rc = mc_optimizer_step(&app->opt);
        mc_fault_inject(NULL);
        l02_cnt.mode = -1;
        if (rc != MC_ERR_STATE) MC_CHECK(rc);   /* a non-finite grad norm skips the step */
        app->run.loss[k] = app->last && res.num_tokens > 0 ? res.loss_sum / res.num_tokens : 0.0;
        app->run.grad_norm[k] = app->opt.last_grad_norm;
    }
}

/* ---------------------------------------------------------------------------------------------
   the comparison with the reference: relative L2 differences */

static double l02_rel(double diff2, double ref2) {
    if (diff2 != diff2) return INFINITY;
    return ref2 > 0 ? sqrt(diff2 / ref2) : (diff2 > 0 ? INFINITY : 0.0);
}

/* This rank's tensor against the matching slice of the reference's full tensor; -1 when
   either is missing. */
static double l02_tensor_diff(const l02_tensor *mine, const l02_tensor *ref, int tp_rank) {
    if (mine->data == NULL || ref->data == NULL) return -1.0;
    int r0 = mine->row_shard ? tp_rank * mine->rows : 0;
    int c0 = mine->col_shard ? tp_rank * mine->cols : 0;
    if (r0 + mine->rows > ref->rows || c0 + mine->cols > ref->cols) return INFINITY;
    double d2 = 0.0, b2 = 0.0;
    for (int i = 0; i < mine->rows; i++)
        for (int j = 0; j < mine->cols; j++) {
            double a = mine->data[(size_t)i * mine->cols + j];
            double b = ref->data[(size_t)(r0 + i) * ref->cols + c0 + j];
            d2 += (a - b) * (a - b);
            b2 += b * b;
        }
    return l02_rel(d2, b2);
}

static const l02_rec *l02_find(const l02_run *r, int step, int mb, int backward, int module) {
    for (int i = 0; i < r->n_recs; i++) {
        const l02_rec *x = &r->recs[i];
        if (x->step == step && x->microbatch == mb && x->backward == backward &&
            x->module == module)
            return x;
    }
    return NULL;
}

/* Reference parameter of one of this rank's parameters (the tied copy on the last stage is
   the reference's word embedding), or -1. */
static int l02_ref_param(const mc_param_table *ref, const mc_param_info *p) {
    return mc_param_table_find(ref, p->shared ? "embedding.word_embeddings.weight" : p->name);
}

/* This rank's shard of p (values at `mine`) against the slice of the reference tensor q. */
static double l02_param_diff(const mc_param_info *p, const float *mine, const mc_param_info *q,
                             const float *ref, int tp_rank, int tp) {
    int rows = p->local_shape[0], cols = p->ndim == 2 ? p->local_shape[1] : 1;
    int grows = p->global_shape[0], gcols = p->ndim == 2 ? p->global_shape[1] : 1;
    if ((size_t)grows * (size_t)gcols != q->numel) return INFINITY;
    double d2 = 0.0, b2 = 0.0;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            int gi = i, gj = j;
            if (p->partition_dim == 0 && p->tensor_model_parallel)
                gi = mc_shard_global_index(i, grows, p->partition_stride, tp_rank, tp);
            if (p->partition_dim == 1 && p->tensor_model_parallel)
                gj = mc_shard_global_index(j, gcols, p->partition_stride, tp_rank, tp);
            if (gi < 0 || gj < 0) return INFINITY;
            double a = mine[(size_t)i * cols + j], b = ref[(size_t)gi * gcols + gj];
            d2 += (a - b) * (a - b);
            b2 += b * b;
        }
    return l02_rel(d2, b2);
}

/* The oracle's table: per step, module and quantity the largest difference over the
   micro-batches and the ranks that hold the module (-1: not measured), and per step and
   reference parameter (plus the tied copy) the gradient and value differences. Every rank
   fills its part; an all-reduce (MAX) combines them. */
enum { L02_Q_FWD_IN, L02_Q_FWD_OUT, L02_Q_BWD_IN, L02_Q_BWD_OUT, L02_Q_GRAD, L02_Q_PARAM, L02_N_Q };
static const char *const l02_q_name[L02_N_Q] = {"forward input", "forward output",
                                                "input grad", "output grad",
                                                "param grads", "params"};
#define L02_MAX_PARAMS 128

typedef struct l02_oracle {
    double mod[L02_STEPS][L02_N_PRIM][L02_N_Q];
    int ranks[L02_STEPS][L02_N_PRIM][L02_N_Q];      /* bit r: world rank r sees a difference */
    int n_params;                                   /* reference params + 1 (the tied copy) */
    char param_names[L02_MAX_PARAMS][MC_PARAM_NAME_MAX];
    double param[L02_STEPS][L02_MAX_PARAMS][2];     /* [0] grad, [1] value */
} l02_oracle;

static void l02_max_into(double *slot, double v) {
    if (v > *slot || (v != v)) *slot = v != v ? INFINITY : v;
}

static void l02_compare(lab_ctx *cx, const l02_app *mine, const l02_app *ref, l02_oracle *o) {
    static l02_oracle local;
    for (int k = 0; k < L02_STEPS; k++)
        for (int m = 0; m < L02_N_PRIM; m++)
            for (int q = 0; q < L02_N_Q; q++) local.mod[k][m][q] = -1.0;
    const mc_param_table *rt = &ref->gpt.table, *mt = &mine->gpt.table;
    local.n_params = rt->count + 1;
    if (local.n_params > L02_MAX_PARAMS) {
        fprintf(stderr, "lab02: more than %d parameters\n", L02_MAX_PARAMS);
        lab_abort(1);
    }
    for (int j = 0; j < rt->count; j++)
        snprintf(local.param_names[j], MC_PARAM_NAME_MAX, "%s", rt->info[j].name);
    snprintf(local.param_names[rt->count], MC_PARAM_NAME_MAX, "output_layer.weight");
    for (int k = 0; k < L02_STEPS; k++)
        for (int j = 0; j < local.n_params; j++) local.param[k][j][0] = local.param[k][j][1] = -1;
    /* tensors */
    for (int i = 0; i < mine->run.n_recs; i++) {
        const l02_rec *a = &mine->run.recs[i];
        const l02_rec *b = l02_find(&ref->run, a->step, a->microbatch, a->backward, a->module);
        if (b == NULL) continue;
        double din = l02_tensor_diff(&a->in, &b->in, mine->tp_rank);
        double dout = l02_tensor_diff(&a->out, &b->out, mine->tp_rank);
        double *row = local.mod[a->step][a->module];
        if (din >= 0) l02_max_into(&row[a->backward ? L02_Q_BWD_IN : L02_Q_FWD_IN], din);
        if (dout >= 0) l02_max_into(&row[a->backward ? L02_Q_BWD_OUT : L02_Q_FWD_OUT], dout);
    }
    /* parameters and gradients */
    for (int k = 0; k < L02_STEPS; k++)
        for (int i = 0; i < mt->count; i++) {
            const mc_param_info *p = &mt->info[i];
            int j = l02_ref_param(rt, p);
            if (j < 0) continue;
            int slot = p->shared ? rt->count : j;
            const mc_param_info *q = &rt->info[j];
            for (int w = 0; w < 2; w++) {
                const float *a = w ? mine->run.params[k] : mine->run.grads[k];
                const float *b = w ? ref->run.params[k] : ref->run.grads[k];
                if (a == NULL || b == NULL) continue;
                double d = l02_param_diff(p, a + p->offset, q, b + q->offset, mine->tp_rank,
                                          mine->tp);
                l02_max_into(&local.param[k][slot][w], d);
                int owner = l02_param_owner(p->shared ? "output_layer.weight" : p->name);
                if (owner >= 0)
                    l02_max_into(&local.mod[k][owner][w ? L02_Q_PARAM : L02_Q_GRAD], d);
            }
        }
    for (int k = 0; k < L02_STEPS; k++)
        for (int m = 0; m < L02_N_PRIM; m++)
            for (int q = 0; q < L02_N_Q; q++)
                local.ranks[k][m][q] = local.mod[k][m][q] > L02_TOL ? 1 << cx->me : 0;
    memcpy(o, &local, sizeof *o);
    MC_CHECK(lab_all_reduce_i32(cx->world, &local.ranks[0][0][0], &o->ranks[0][0][0],
                                sizeof local.ranks / sizeof(int), MC_SUM));
    MC_CHECK(lab_all_reduce_f64(cx->world, &local.mod[0][0][0], &o->mod[0][0][0],
                                sizeof local.mod / sizeof(double), MC_MAX));
    MC_CHECK(lab_all_reduce_f64(cx->world, &local.param[0][0][0], &o->param[0][0][0],
                                sizeof local.param / sizeof(double), MC_MAX));
}

/* Composite modules from their children; primitives as measured. */
static double l02_mod_q(const l02_oracle *o, int k, int m, int q) {
    if (m < L02_N_PRIM && (q != L02_Q_GRAD && q != L02_Q_PARAM)) return o->mod[k][m][q];
    if (q == L02_Q_GRAD || q == L02_Q_PARAM) {
        double worst = -1.0;
        for (int j = 0; j < o->n_params; j++)
            if (l02_param_in_module(o->param_names[j], m))
                l02_max_into(&worst, o->param[k][j][q == L02_Q_PARAM]);
        return worst;
    }
    int first = L02_MOD_LAYER(0, L02_SUB_LAYER);
    int last = L02_MOD_LAYER(L02_LAYERS - 1, L02_SUB_LAYER);
    if (m == L02_MOD_DECODER) {
        if (q == L02_Q_FWD_IN || q == L02_Q_BWD_IN) return o->mod[k][first][q];
        return o->mod[k][last][q];
    }
    /* gpt: the losses out, the seed back; its input grad is the embedding output's grad */
    if (q == L02_Q_FWD_OUT) return o->mod[k][L02_MOD_LOSS][q];
    if (q == L02_Q_BWD_OUT) return o->mod[k][L02_MOD_LOSS][q];
    if (q == L02_Q_BWD_IN) return o->mod[k][L02_MOD_EMB][L02_Q_BWD_OUT];
    return -1.0;
}

/* The parameter of module m with the largest difference of kind w (0 grad, 1 value). */
static int l02_worst_param(const l02_oracle *o, int k, int m, int w) {
    int best = -1;
    for (int j = 0; j < o->n_params; j++)
        if (l02_param_in_module(o->param_names[j], m) &&
            (best < 0 || o->param[k][j][w] > o->param[k][best][w]))
            best = j;
    return best;
}

/* The full oracle's verdict: the first place, in causal order, where a tensor differs. */
typedef struct l02_divergence {
    int found, step, module, quantity;
    char module_name[64];
    const char *phase;
} l02_divergence;

/* The leaf modules in forward order. */
static int l02_forward_leaves(int *out) {
    int n = 0;
    out[n++] = L02_MOD_EMB;
    for (int l = 0; l < L02_LAYERS; l++)
        for (int i = 0; i < L02_N_LEAVES; i++) out[n++] = L02_MOD_LAYER(l, l02_leaves[i]);
    out[n++] = L02_MOD_FINAL_LN;
    out[n++] = L02_MOD_OUTPUT;
    out[n++] = L02_MOD_LOSS;
    return n;
}

static void l02_first_divergence(const l02_oracle *o, l02_divergence *d) {
    int leaves[L02_N_PRIM], n = l02_forward_leaves(leaves);
    memset(d, 0, sizeof *d);
    for (int k = 0; k < L02_STEPS; k++) {
        /* the optimizer: parameters at the start of a later step */
        for (int j = 0; k > 0 && j < o->n_params; j++)
            if (o->param[k][j][1] > L02_TOL) {
                *d = (l02_divergence){1, k, l02_param_owner(o->param_names[j]), L02_Q_PARAM,
                                      "", "optimizer"};
                goto named;
            }
        /* forward, in module order (the loss module's output is the loss phase) */
        for (int i = 0; i < n; i++)
            if (o->mod[k][leaves[i]][L02_Q_FWD_OUT] > L02_TOL) {
                int m = leaves[i];
                *d = (l02_divergence){1, k, m, L02_Q_FWD_OUT, "",
                                      m == L02_MOD_LOSS ? "loss" : "forward"};
                goto named;
            }
        /* backward, in reverse module order: the first input grad that differs */
        for (int i = n - 1; i >= 0; i--)
            if (o->mod[k][leaves[i]][L02_Q_BWD_IN] > L02_TOL) {
                *d = (l02_divergence){1, k, leaves[i], L02_Q_BWD_IN, "", "backward_communication"};
                goto named;
            }
        /* grad finalize: the gradients the optimizer reads, in registration order */
        for (int j = 0; j < o->n_params; j++)
            if (o->param[k][j][0] > L02_TOL) {
                *d = (l02_divergence){1, k, l02_param_owner(o->param_names[j]), L02_Q_GRAD, "",
                                      "grad_finalize"};
                goto named;
            }
    }
    return;
named:
    snprintf(d->module_name, sizeof d->module_name, "%s",
             d->module >= 0 ? l02_mod_names[d->module] : "?");
}

/* ---------------------------------------------------------------------------------------------
   the probe ledger: results/lab02.probes.json, one entry per nonce */

typedef struct l02_probes {
    int count, before_reveal;
    int revealed;             /* the findings were locked at an earlier run or this one */
    char revealed_at[32];
    cJSON *modules;           /* [{"module", "at", "after_reveal"}] */
} l02_probes;

static void l02_probes_path(const lab_ctx *cx, char *out, size_t cap) {
    lab_path_beside_results(cx->args->results_path, "probes", "json", out, cap);
}

static cJSON *l02_probes_load(const lab_ctx *cx) {
    char path[4200];
    l02_probes_path(cx, path, sizeof path);
    char *text = lab_read_text(path, NULL);
    cJSON *doc = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (doc == NULL) {
        doc = cJSON_CreateObject();
        cJSON_AddStringToObject(doc, "format", "megatron_c-lab02-probes");
        cJSON_AddNumberToObject(doc, "version", 1);
    }
    if (!cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(doc, "nonces")))
        cJSON_AddObjectToObject(doc, "nonces");
    return doc;
}

static cJSON *l02_probes_entry(cJSON *doc, const char *nonce) {
    cJSON *nonces = cJSON_GetObjectItemCaseSensitive(doc, "nonces");
    cJSON *e = cJSON_GetObjectItemCaseSensitive(nonces, nonce);
    if (e == NULL) {
        e = cJSON_AddObjectToObject(nonces, nonce);
        cJSON_AddArrayToObject(e, "probes");
    }
    return e;
}

static void l02_probes_save(const lab_ctx *cx, const cJSON *doc) {
    char path[4200];
    l02_probes_path(cx, path, sizeof path);
    if (lab_json_write_atomic(doc, path) != 0)
        fprintf(stderr, "lab02: cannot write the probe ledger %s\n", path);
}

/* ---------------------------------------------------------------------------------------------
   the lab's state */

static const char *const l02_findings[] = {"followup/faulty_module", "followup/faulty_layer",
                                           "followup/faulty_phase", "followup/culprit_collective",
                                           "followup/found_within_4_probes"};
#define L02_N_FINDINGS 5

typedef struct l02_state {
    mc_parallel_state ps;
    mc_comm *self_world;
    mc_parallel_state self_ps;
    int tp, pp, stage;
    int stage_ranks[2][L02_MAX_WORLD];   /* the world ranks of each stage, TP rank order */
    l02_fault fault;
    int revealed;             /* every finding locked: the fault may be shown */
    char locked_module[96];
    /* A */
    l02_oracle clean;
    int clean_matches;
    double clean_worst;
    double clean_loss[L02_STEPS], ref_loss[L02_STEPS], ref_norm[L02_STEPS];
    int counts[L02_N_AT][L02_N_GROUPS][L02_N_OPS];   /* summed over the ranks */
    int counts_rank[L02_MAX_WORLD][L02_N_AT][L02_N_GROUPS][L02_N_OPS];
    double control_loss_rel;
    int ckpt_resharded, ckpt_saved_tp, ckpt_saved_pp;
    double ckpt_max_diff;
    /* B */
    l02_oracle faulty;
    double loss[L02_STEPS], grad_norm[L02_STEPS];
    double loss_rel[L02_STEPS], norm_rel[L02_STEPS];
    double stage_losses[L02_STEPS][4];   /* the last stage's TP ranks */
    int first_loss_step;
    l02_divergence div;
    /* C */
    int probe;                /* module index, -1 without --probe */
    l02_probes probes;
} l02_state;

/* The last stage's loss of every step, on every rank (from the last world rank). */
static void l02_global_losses(lab_ctx *cx, const l02_app *app, double *out) {
    double all[L02_MAX_WORLD * L02_STEPS];
    MC_CHECK(lab_all_gather_f64(cx->world, app->run.loss, all, L02_STEPS));
    for (int k = 0; k < L02_STEPS; k++) out[k] = all[(cx->world_size - 1) * L02_STEPS + k];
}

static double l02_rel_scalar(double a, double b) {
    double d = fabs(a - b) / fmax(fabs(b), 1e-30);
    return d != d ? INFINITY : d;
}

/* ---------------------------------------------------------------------------------------------
   world */

static int l02_check_world(const lab_ctx *cx, char *why, size_t cap) {
    const mc_grid_desc *g = &cx->grid.desc;
    const char *probe = lab_flag_value(cx, "--probe");
    l02_names_init();
    if (g->tp != 2 && g->tp != 4) {
        snprintf(why, cap, "needs tp = 2 or 4 (got tp=%d): the fault lives in a tensor-parallel "
                 "run that is compared with TP=1; try mpirun -np 4 ./lab02", g->tp);
        return 1;
    }
    if (g->pp != 2 || g->cp != 1 || g->ep != 1 || g->vpp > 1) {
        snprintf(why, cap, "needs pp=2, cp=ep=1 and no --vpp (got pp=%d cp=%d ep=%d vpp=%d): the "
                 "tied embedding spans the first and the last of two stages", g->pp, g->cp,
                 g->ep, g->vpp);
        return 1;
    }
    if (cx->grid.dp != 1) {
        snprintf(why, cap, "needs dp = 1, i.e. world = tp x pp (got world %d for tp=%d pp=%d, "
                 "dp=%d): the reference is one process on the same micro-batches; try "
                 "mpirun -np %d ./lab02", cx->world_size, g->tp, g->pp, cx->grid.dp,
                 g->tp * g->pp);
        return 1;
    }
    if (probe != NULL && l02_module_index(probe) < 0) {
        snprintf(why, cap, "needs --probe to name a module (got '%s'): embedding, decoder, "
                 "decoder.layers.N (N = 0 .. %d), decoder.layers.N.input_layernorm, "
                 ".self_attention, .pre_mlp_layernorm, .mlp, decoder.final_layernorm, "
                 "output_layer, loss or gpt", probe, L02_LAYERS - 1);
        return 1;
    }
    if (cx->world->backend == MC_BACKEND_NCCL) {
        snprintf(why, cap, "needs --backend mpi: it has not been verified on the nccl backend "
                 "yet (its model takes the world's op table, but no multi-GPU run has checked "
                 "it)");
        return 1;
    }
    return 0;
}

/* Rank 0 asks the ledger whether every finding is locked; every rank learns the answer. */
static void l02_reveal_state(lab_ctx *cx, l02_state *st) {
    int locked = 1;
    if (cx->me == 0) {
        char ledger[4200];
        gr_ledger_path_for(cx->args->results_path, ledger, sizeof ledger);
        for (int i = 0; i < L02_N_FINDINGS; i++) {
            char v[96];
            int rc = gr_ledger_locked_value(ledger, cx->nonce, l02_findings[i], v, sizeof v);
            locked &= rc == 1;
            if (rc == 1 && i == 0) snprintf(st->locked_module, sizeof st->locked_module, "%s", v);
        }
    }
    MC_CHECK(lab_broadcast_bytes(cx->world, &locked, sizeof locked, 0));
    st->revealed = locked;
}

/* ---------------------------------------------------------------------------------------------
   printing */

/* Who holds module m: its stage, or -1 for the composites that span both. */
static int l02_stage_of(int m, int pp) {
    int per = L02_LAYERS / pp;
    if (m == L02_MOD_EMB) return 0;
    if (m == L02_MOD_FINAL_LN || m == L02_MOD_OUTPUT || m == L02_MOD_LOSS) return pp - 1;
    if (m >= L02_N_PRIM) return -1;
    return ((m - 1) / L02_N_SUB) / per;
}

static void l02_stage_ranks(const l02_state *st, int stage, char *out, size_t cap) {
    lab_format_ints(out, cap, st->stage_ranks[stage], st->tp);
}

/* "2 (all_gather 1, reduce_scatter 1)" for a booking slot, per micro-batch or per step. */
static void l02_count_text(const int (*c)[L02_N_OPS], int group, int div, char *out, size_t cap) {
    int total = 0;
    size_t used = 0;
    out[0] = '\0';
    for (int op = 0; op < L02_N_OPS; op++) total += c[group][op];
    if (total == 0) {
        snprintf(out, cap, "0");
        return;
    }
    used += (size_t)snprintf(out, cap, "%d (", total / div);
    int first = 1;
    for (int op = 0; op < L02_N_OPS && used < cap; op++) {
        if (c[group][op] == 0) continue;
        used += (size_t)snprintf(out + used, cap - used, "%s%s %d", first ? "" : ", ",
                                 l02_op_abbr[op], c[group][op] / div);
        first = 0;
    }
    if (used < cap) snprintf(out + used, cap - used, ")");
}

static void l02_print_tree(lab_ctx *cx, const l02_state *st) {
    char ranks[64], fwd[96], bwd[96];
    int per_mb = L02_STEPS * L02_M;
    lab_printf0("GPTModel (TP=%d, PP=%d, sequence parallel, tied embeddings)\n", st->tp, st->pp);
    lab_printf0("  %-54s %-5s %-6s %-15s %-15s %s\n", "module", "stage", "ranks", "TP fwd",
                "TP bwd", "Megatron-Core package");
    for (int m = 0; m < L02_N_PRIM; m++) {
        int stage = l02_stage_of(m, st->pp), rank0 = st->stage_ranks[stage][0];
        int sub = (m - 1) % L02_N_SUB;
        int depth = m == L02_MOD_EMB || m >= L02_MOD_OUTPUT ? 1
                    : m == L02_MOD_FINAL_LN || sub == L02_SUB_LAYER ? 2
                    : sub == L02_SUB_QKV || sub == L02_SUB_CORE || sub == L02_SUB_PROJ ||
                              sub == L02_SUB_FC1 || sub == L02_SUB_FC2
                        ? 4
                        : 3;
        char label[96];
        snprintf(label, sizeof label, "%*s%.60s", 2 * depth, "", l02_mod_names[m]);
        l02_stage_ranks(st, stage, ranks, sizeof ranks);
        /* the stage's first rank speaks for its TP group */
        l02_count_text(st->counts_rank[rank0][2 * m], L02_G_TP, per_mb, fwd, sizeof fwd);
        l02_count_text(st->counts_rank[rank0][2 * m + 1], L02_G_TP, per_mb, bwd, sizeof bwd);
        lab_printf0("%-56s %-5d %-6s %-15s %-15s %s\n", label, stage, ranks, fwd, bwd,
                    l02_package(m));
    }
    lab_printf0("  TP collectives per micro-batch on one rank of the stage (AR all-reduce, AG "
                "all-gather, RS reduce-scatter)\n");
}

static void l02_print_packages(lab_ctx *cx, const l02_state *st) {
    char t[160];
    int last = st->stage_ranks[st->pp - 1][0], first = 0;
    lab_printf0("\ncollectives outside the modules, per step (rank 0 | rank %d):\n", last);
    lab_printf0("  %-44s %s\n", "package (call)", "group count (kinds)");
    static const struct { int at; const char *what; } rows[] = {
        {L02_AT_SCHEDULE, "pipeline_parallel (1F1B: tensors sent)"},
        {L02_AT_FINALIZE, "distributed (finalize_model_grads)"},
        {L02_AT_OPTIMIZER, "optimizer (grad norm, AdamW)"},
        {L02_AT_CHECKPOINT, "dist_checkpointing (one save)"}};
    for (int i = 0; i < 4; i++) {
        int div = rows[i].at == L02_AT_CHECKPOINT ? 1 : L02_STEPS;
        lab_printf0("  %-44s ", rows[i].what);
        for (int side = 0; side < 2; side++) {
            int r = side ? last : first, any = 0;
            for (int g = 0; g < L02_N_GROUPS; g++) {
                int n = 0;
                for (int op = 0; op < L02_N_OPS; op++) n += st->counts_rank[r][rows[i].at][g][op];
                if (n == 0) continue;
                l02_count_text(st->counts_rank[r][rows[i].at], g, div, t, sizeof t);
                lab_printf0("%s%s %s", any ? ", " : "", l02_group_name[g], t);
                any = 1;
            }
            if (!any) lab_printf0("-");
            lab_printf0("%s", side ? "\n" : " | ");
        }
    }
}

static void l02_print_probe(lab_ctx *cx, const l02_state *st) {
    const l02_oracle *o = &st->faulty;
    int m = st->probe;
    lab_printf0("%-5s %-15s %-15s %-15s %-15s %-15s %-15s\n", "step", "forward input",
                "forward output", "output grad", "input grad", "param grads", "params");
    for (int k = 0; k < L02_STEPS; k++) {
        static const int order[] = {L02_Q_FWD_IN, L02_Q_FWD_OUT, L02_Q_BWD_OUT, L02_Q_BWD_IN,
                                    L02_Q_GRAD, L02_Q_PARAM};
        lab_printf0("%-5d", k);
        for (int i = 0; i < 6; i++) {
            double v = l02_mod_q(o, k, m, order[i]);
            char cell[32];
            if (v < 0)
                snprintf(cell, sizeof cell, "-");
            else
                snprintf(cell, sizeof cell, "%.1e%s", v, v > L02_TOL ? " DIFF" : "");
            lab_printf0(" %-15s", cell);
        }
        lab_printf0("\n");
    }
    for (int k = 0; k < L02_STEPS && m < L02_N_PRIM; k++) {
        char line[256] = "";
        size_t used = 0;
        for (int q = 0; q < L02_Q_GRAD; q++) {
            int mask = o->ranks[k][m][q], ranks[L02_MAX_WORLD], n = 0;
            for (int r = 0; r < L02_MAX_WORLD; r++)
                if (mask & (1 << r)) ranks[n++] = r;
            if (n == 0 || used >= sizeof line) continue;
            char list[64];
            lab_format_ints(list, sizeof list, ranks, n);
            used += (size_t)snprintf(line + used, sizeof line - used, "%s%s %s",
                                     used ? "; " : "", l02_q_name[q], list);
        }
        if (line[0]) lab_printf0("  step %d, the ranks that differ: %s\n", k, line);
    }
    for (int k = 0; k < L02_STEPS; k++)
        for (int w = 0; w < 2; w++) {
            int j = l02_worst_param(o, k, m, w);
            if (j >= 0 && o->param[k][j][w] > L02_TOL)
                lab_printf0("  step %d: largest %s difference: %s (%.1e)\n", k,
                            w ? "parameter" : "gradient", o->param_names[j], o->param[k][j][w]);
        }
    lab_printf0("  (relative L2 difference ||x - x_ref|| / ||x_ref|| of this module's tensors "
                "against the TP=1 run, the largest over micro-batches and TP ranks; DIFF: above "
                "%.0e; '-': the module has no such tensor)\n", L02_TOL);
}

/* A composite's collectives are its own plus its parts' (the taps book them to the parts). */
static void l02_add_counts(l02_state *st, int r, int dst, int src) {
    for (int d = 0; d < 2; d++)
        for (int g = 0; g < L02_N_GROUPS; g++)
            for (int op = 0; op < L02_N_OPS; op++)
                st->counts_rank[r][2 * dst + d][g][op] += st->counts_rank[r][2 * src + d][g][op];
}

static void l02_roll_up(l02_state *st) {
    static const int attn_parts[] = {L02_SUB_QKV, L02_SUB_CORE, L02_SUB_PROJ};
    static const int layer_parts[] = {L02_SUB_LN1, L02_SUB_ATTN, L02_SUB_LN2, L02_SUB_MLP};
    for (int r = 0; r < L02_MAX_WORLD; r++)
        for (int l = 0; l < L02_LAYERS; l++) {
            for (int i = 0; i < 3; i++)
                l02_add_counts(st, r, L02_MOD_LAYER(l, L02_SUB_ATTN),
                               L02_MOD_LAYER(l, attn_parts[i]));
            l02_add_counts(st, r, L02_MOD_LAYER(l, L02_SUB_MLP), L02_MOD_LAYER(l, L02_SUB_FC1));
            l02_add_counts(st, r, L02_MOD_LAYER(l, L02_SUB_MLP), L02_MOD_LAYER(l, L02_SUB_FC2));
            for (int i = 0; i < 4; i++)
                l02_add_counts(st, r, L02_MOD_LAYER(l, L02_SUB_LAYER),
                               L02_MOD_LAYER(l, layer_parts[i]));
        }
}

/* ---------------------------------------------------------------------------------------------
   A. the package map on a clean run */

static l02_app l02_ref;   /* the TP=1 reference, kept for B and C */

static int l02_exp_map(lab_ctx *cx) {
    l02_state *st = cx->state;
    static l02_app clean, control;
    l02_names_init();
    st->tp = cx->grid.desc.tp;
    st->pp = cx->grid.desc.pp;
    const char *probe = lab_flag_value(cx, "--probe");
    st->probe = probe ? l02_module_index(probe) : -1;
    l02_fault_from_nonce(cx->nonce, &st->fault);
    MC_CHECK(mc_parallel_init(&st->ps, &(mc_parallel_desc){.world = cx->world,
                                                            .grid = cx->grid.desc}));
    MC_CHECK(mc_comm_init_world(&st->self_world, &(mc_comm_desc){.backend = MC_BACKEND_SELF}));
    MC_CHECK(mc_parallel_init(&st->self_ps, &(mc_parallel_desc){.world = st->self_world}));
    st->stage = mc_parallel_rank(&st->ps, MC_GROUP_PP);
    for (int r = 0; r < cx->world_size; r++) {   /* DP = CP = 1: a stage is one TP group */
        mc_rank_coords rc;
        MC_CHECK(mc_grid_coords(&cx->grid, r, &rc));
        st->stage_ranks[rc.pp][rc.tp] = r;
    }
    l02_reveal_state(cx, st);

    lab_heading(cx, "A. The package map: one clean TP=%d PP=%d run, its collectives by module "
                "and package", st->tp, st->pp);
    l02_app_init(&l02_ref, &st->self_ps);
    l02_train(&l02_ref, NULL);
    l02_wrap_comms(&st->ps);
    memset(&l02_cnt, 0, sizeof l02_cnt);
    l02_cnt.mode = -1;
    l02_app_init(&clean, &st->ps);
    l02_cnt.on = 1;   /* after init: the tied embedding's first all-reduce is not a step's */
    l02_train(&clean, NULL);
    l02_cnt.on = 0;

    /* the clean run against the reference */
    l02_compare(cx, &clean, &l02_ref, &st->clean);
    double worst = 0.0;
    for (int k = 0; k < L02_STEPS; k++)
        for (int m = 0; m < L02_N_PRIM; m++)
            for (int q = 0; q < L02_N_Q; q++) l02_max_into(&worst, st->clean.mod[k][m][q]);
    l02_global_losses(cx, &clean, st->clean_loss);
    for (int k = 0; k < L02_STEPS; k++) {
        st->ref_loss[k] = l02_ref.run.loss[k];
        st->ref_norm[k] = l02_ref.run.grad_norm[k];
        l02_max_into(&worst, l02_rel_scalar(st->clean_loss[k], st->ref_loss[k]));
        l02_max_into(&worst, l02_rel_scalar(clean.run.grad_norm[k], st->ref_norm[k]));
    }
    st->clean_worst = worst;
    st->clean_matches = worst <= L02_CLEAN_TOL;

    /* the counts of every rank */
    MC_CHECK(lab_all_gather_i32(cx->world, &l02_cnt.counts[0][0][0], &st->counts_rank[0][0][0][0],
                                sizeof l02_cnt.counts / sizeof(int)));
    l02_roll_up(st);

    /* a checkpoint at TP=2 PP=2, loaded into a TP=1 model */
    char dir[4200];
    lab_path_beside_results(cx->args->results_path, "ckpt", "d", dir, sizeof dir);
    mc_checkpoint_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.dir = dir;
    cd.ps = &st->ps;
    cd.config = &clean.gpt.config;
    cd.params = &clean.gpt.table;
    cd.param_data = clean.gpt.params;
    cd.ops = clean.gpt.ops;
    cd.iteration = L02_STEPS;
    cd.optimizer_step = L02_STEPS;
    l02_cnt.on = 1;
    l02_cnt.mode = L02_AT_CHECKPOINT;
    memset(l02_cnt.counts[L02_AT_CHECKPOINT], 0, sizeof l02_cnt.counts[L02_AT_CHECKPOINT]);
    if (cx->me == 0) lab_make_parent_dirs(dir);
    MC_CHECK(mc_barrier(cx->world));
    MC_CHECK(mc_checkpoint_save(&cd));
    l02_cnt.on = 0;
    l02_cnt.mode = -1;
    int ckpt_counts[L02_MAX_WORLD][L02_N_GROUPS][L02_N_OPS];
    MC_CHECK(lab_all_gather_i32(cx->world, &l02_cnt.counts[L02_AT_CHECKPOINT][0][0],
                                &ckpt_counts[0][0][0], L02_N_GROUPS * L02_N_OPS));
    for (int r = 0; r < cx->world_size; r++)
        memcpy(st->counts_rank[r][L02_AT_CHECKPOINT], ckpt_counts[r], sizeof ckpt_counts[r]);
    {
        static l02_app loaded;
        l02_app_init(&loaded, &st->self_ps);
        mc_checkpoint_desc ld = cd;
        ld.ps = &st->self_ps;
        ld.config = &loaded.gpt.config;
        ld.params = &loaded.gpt.table;
        ld.param_data = loaded.gpt.params;
        ld.ops = loaded.gpt.ops;
        mc_checkpoint_result res;
        MC_CHECK(mc_checkpoint_load(&ld, MC_CKPT_LOAD_NO_RNG, &res));
        size_t total = clean.gpt.table.total, ltotal = loaded.gpt.table.total;
        float *mine = l02_download(clean.gpt.ops, clean.gpt.params, total);
        float *full = l02_download(loaded.gpt.ops, loaded.gpt.params, ltotal);
        double d = 0.0, all = 0.0;
        for (int i = 0; i < clean.gpt.table.count; i++) {
            const mc_param_info *p = &clean.gpt.table.info[i];
            int j = l02_ref_param(&loaded.gpt.table, p);
            double x = j < 0 ? INFINITY
                             : l02_param_diff(p, mine + p->offset, &loaded.gpt.table.info[j],
                                              full + loaded.gpt.table.info[j].offset,
                                              clean.tp_rank, clean.tp);
            l02_max_into(&d, x);
        }
        MC_CHECK(lab_all_reduce_f64(cx->world, &d, &all, 1, MC_MAX));
        st->ckpt_max_diff = all;
        st->ckpt_resharded = res.resharded;
        st->ckpt_saved_tp = res.saved_tp;
        st->ckpt_saved_pp = res.saved_pp;
        free(mine);
        free(full);
        l02_app_free(&loaded);
    }
    l02_unwrap_comms();

    /* the control: the row maxima all-reduced with SUM */
    l02_app_init(&control, &st->ps);
    mc_fault_desc max_sum = {.kind = MC_FAULT_CE_MAX_SUM};
    l02_train(&control, &max_sum);
    double control_loss[L02_STEPS];
    l02_global_losses(cx, &control, control_loss);
    st->control_loss_rel = 0.0;
    for (int k = 0; k < L02_STEPS; k++)
        l02_max_into(&st->control_loss_rel, l02_rel_scalar(control_loss[k], st->ref_loss[k]));
    l02_app_free(&control);
    l02_app_free(&clean);

    l02_print_tree(cx, st);
    l02_print_packages(cx, st);
    lab_printf0("\nclean run against the TP=1 run: largest relative difference of any tapped "
                "tensor, parameter, gradient, loss or grad norm over %d steps: %.1e\n",
                L02_STEPS, st->clean_worst);
    lab_printf0("row maxima of the cross entropy all-reduced with SUM instead of MAX: loss "
                "differs from the TP=1 run by %.1e (relative): the shift cancels\n",
                st->control_loss_rel);
    lab_printf0("checkpoint saved at TP=%d PP=%d, loaded into the TP=1 model: resharded %s, "
                "largest difference to the TP=%d shards %.1e\n", st->ckpt_saved_tp,
                st->ckpt_saved_pp, st->ckpt_resharded ? "yes" : "no", st->tp, st->ckpt_max_diff);

    /* what the header documents for each layer, per micro-batch, under SP */
    int l0 = L02_MOD_LAYER(0, L02_SUB_ATTN), m0 = L02_MOD_LAYER(0, L02_SUB_MLP);
    int per_mb = L02_STEPS * L02_M, last = st->stage_ranks[st->pp - 1][0];
    const int (*c0)[L02_N_GROUPS][L02_N_OPS] = st->counts_rank[0];
    const int (*cl)[L02_N_GROUPS][L02_N_OPS] = st->counts_rank[last];
    lab_check(cx, c0[2 * L02_MOD_EMB][L02_G_TP][L02_OP_AR] == per_mb,
              "the vocab-parallel embedding all-reduces its lookup once per micro-batch");
    lab_check(cx, c0[2 * l0][L02_G_TP][L02_OP_AG] == per_mb &&
                  c0[2 * l0][L02_G_TP][L02_OP_RS] == per_mb &&
                  c0[2 * m0][L02_G_TP][L02_OP_AG] == per_mb &&
                  c0[2 * m0][L02_G_TP][L02_OP_RS] == per_mb,
              "under SP attention and MLP each all-gather before the column-parallel layer and "
              "reduce-scatter after the row-parallel one, once per micro-batch");
    lab_check(cx, cl[2 * L02_MOD_LOSS][L02_G_TP][L02_OP_AR] == 3 * per_mb,
              "the vocab-parallel cross entropy makes three all-reduces per micro-batch");
    lab_check(cx, cl[L02_AT_FINALIZE][L02_G_EMB][L02_OP_AR] == L02_STEPS &&
                  c0[L02_AT_FINALIZE][L02_G_EMB][L02_OP_AR] == L02_STEPS,
              "finalize all-reduces the tied embedding over the embedding group once per step, "
              "on both end stages");
    lab_check(cx, c0[L02_AT_OPTIMIZER][L02_G_MP][L02_OP_AR] == L02_STEPS,
              "the grad norm is all-reduced over the model-parallel group once per step");
    lab_check(cx, c0[L02_AT_SCHEDULE][L02_G_PP][L02_OP_P2P] == L02_STEPS * L02_M,
              "the first stage sends one activation per micro-batch");
    lab_check(cx, st->clean_matches, "the clean TP=%d PP=%d run equals the TP=1 run (%.1e <= "
              "%.0e)", st->tp, st->pp, st->clean_worst, L02_CLEAN_TOL);
    lab_check(cx, st->control_loss_rel <= 1e-5, "SUM for the row maxima leaves the loss as it "
              "was (%.1e)", st->control_loss_rel);
    lab_check(cx, st->ckpt_resharded && st->ckpt_max_diff == 0.0,
              "the TP=1 model loaded from the TP=%d PP=%d checkpoint holds exactly the trained "
              "shards", st->tp, st->pp);
    lab_printf0("compared with: the collective counts the header documents per layer (SP on); "
                "every tensor of the clean run with the TP=1 run of the same data and weights; "
                "the loaded TP=1 parameters with the TP=2 shards\n");
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   B. the symptom */

static l02_app l02_bad;   /* the faulty run, kept for C */

static int l02_exp_symptom(lab_ctx *cx) {
    l02_state *st = cx->state;
    lab_heading(cx, "B. The symptom: the TP=%d PP=%d run with the hidden fault against the TP=1 "
                "run", st->tp, st->pp);
    l02_app_init(&l02_bad, &st->ps);
    l02_train(&l02_bad, &st->fault.desc);
    l02_compare(cx, &l02_bad, &l02_ref, &st->faulty);
    l02_first_divergence(&st->faulty, &st->div);
    l02_global_losses(cx, &l02_bad, st->loss);
    /* the loss every last-stage rank saw (they should agree) */
    double all[L02_MAX_WORLD * L02_STEPS];
    MC_CHECK(lab_all_gather_f64(cx->world, l02_bad.run.loss, all, L02_STEPS));
    st->first_loss_step = -1;
    for (int k = 0; k < L02_STEPS; k++) {
        st->grad_norm[k] = l02_bad.run.grad_norm[k];
        st->loss_rel[k] = l02_rel_scalar(st->loss[k], st->ref_loss[k]);
        st->norm_rel[k] = l02_rel_scalar(st->grad_norm[k], st->ref_norm[k]);
        for (int r = 0; r < st->tp; r++)
            st->stage_losses[k][r] = all[st->stage_ranks[st->pp - 1][r] * L02_STEPS + k];
        if (st->first_loss_step < 0 && st->loss_rel[k] > L02_LOSS_TOL) st->first_loss_step = k;
    }
    lab_printf0("%-5s %-12s %-12s %-10s %-12s %-12s %-10s %s\n", "step", "loss", "loss TP=1",
                "rel diff", "grad norm", "norm TP=1", "rel diff", "loss on each last-stage rank");
    for (int k = 0; k < L02_STEPS; k++) {
        lab_printf0("%-5d %-12.6f %-12.6f %-10.1e %-12.6f %-12.6f %-10.1e", k, st->loss[k],
                    st->ref_loss[k], st->loss_rel[k], st->grad_norm[k], st->ref_norm[k],
                    st->norm_rel[k]);
        for (int r = 0; r < st->tp; r++) lab_printf0(" %.6f", st->stage_losses[k][r]);
        lab_printf0("\n");
    }
    lab_printf0("the first step whose loss differs from the TP=1 run (rel > %.0e): %s%d\n",
                L02_LOSS_TOL, st->first_loss_step < 0 ? "none " : "",
                st->first_loss_step < 0 ? -1 : st->first_loss_step);
    lab_printf0("\nto look inside, probe a module of A's tree: mpirun --oversubscribe -np %d "
                "./lab02 --probe NAME (also decoder = the block, decoder.layers.N = a layer, gpt "
                "= the whole model); every probe is counted for your nonce\n", cx->world_size);
    int symptom = 0;
    for (int k = 0; k < L02_STEPS; k++)
        symptom |= st->loss_rel[k] > L02_LOSS_TOL || st->norm_rel[k] > L02_LOSS_TOL;
    lab_check(cx, symptom, "the hidden fault shows in the loss or the grad norm");
    lab_check(cx, st->div.found && strcmp(st->div.module_name, st->fault.module) == 0 &&
                      strcmp(st->div.phase, l02_faults[st->fault.which].phase) == 0,
              "the full tensor oracle localises the hidden fault to its module and phase");
    lab_printf0("compared with: the TP=1 run of the same data and weights, step by step\n");
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   C. one probe */

static int l02_exp_probe(lab_ctx *cx) {
    l02_state *st = cx->state;
    cJSON *doc = NULL;
    if (cx->me == 0) {
        doc = l02_probes_load(cx);
        cJSON *e = l02_probes_entry(doc, cx->nonce);
        cJSON *list = cJSON_GetObjectItemCaseSensitive(e, "probes");
        if (st->probe >= 0) {
            char when[32];
            lab_iso8601_utc(when, sizeof when);
            cJSON *p = cJSON_CreateObject();
            cJSON_AddStringToObject(p, "module", l02_mod_names[st->probe]);
            cJSON_AddStringToObject(p, "at", when);
            cJSON_AddBoolToObject(p, "after_reveal", st->revealed);
            cJSON_AddItemToArray(list, p);
        }
        if (st->revealed && cJSON_GetObjectItemCaseSensitive(e, "revealed_at") == NULL) {
            char when[32];
            lab_iso8601_utc(when, sizeof when);
            cJSON_AddStringToObject(e, "revealed_at", when);
        }
        const cJSON *p;
        cJSON_ArrayForEach(p, list) {
            st->probes.count++;
            st->probes.before_reveal +=
                !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "after_reveal"));
        }
        const char *at = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "revealed_at"));
        snprintf(st->probes.revealed_at, sizeof st->probes.revealed_at, "%s", at ? at : "");
        st->probes.modules = cJSON_Duplicate(list, 1);
        l02_probes_save(cx, doc);
        cJSON_Delete(doc);
    }
    if (st->probe < 0) return LAB_SKIPPED;
    lab_heading(cx, "C. Probe %s against the TP=1 run (probe %d for nonce %s)",
                l02_mod_names[st->probe], st->probes.count, cx->nonce);
    int stage = l02_stage_of(st->probe, st->pp);
    char ranks[64];
    l02_stage_ranks(st, stage < 0 ? 0 : stage, ranks, sizeof ranks);
    if (stage >= 0)
        lab_printf0("held by stage %d (ranks %s)\n", stage, ranks);
    else
        lab_printf0("spans both stages\n");
    l02_print_probe(cx, st);
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   facts and the reveal */

static cJSON *l02_doubles(const double *v, int n, double scale) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(round(v[i] * scale) / scale));
    return a;
}

static double l02_sig(double v) {   /* two significant digits, for differences */
    if (!(v > 0) || isinf(v)) return v;
    double e = pow(10.0, floor(log10(v)) - 1);
    return round(v / e) * e;
}

static cJSON *l02_count_json(const int (*c)[L02_N_OPS], int div) {
    cJSON *o = cJSON_CreateObject();
    for (int g = 0; g < L02_N_GROUPS; g++)
        for (int op = 0; op < L02_N_OPS; op++)
            if (c[g][op]) {
                char key[48];
                snprintf(key, sizeof key, "%s_%s", l02_group_name[g], l02_op_name[op]);
                cJSON_AddNumberToObject(o, key, c[g][op] / div);
            }
    return o;
}

static int l02_total(const int (*c)[L02_N_OPS], int group) {
    int n = 0;
    for (int op = 0; op < L02_N_OPS; op++) n += c[group][op];
    return n;
}

static cJSON *l02_probe_json(const l02_state *st) {
    cJSON *o = cJSON_CreateObject();
    int m = st->probe;
    cJSON_AddStringToObject(o, "module", l02_mod_names[m]);
    cJSON_AddNumberToObject(o, "stage", l02_stage_of(m, st->pp));
    cJSON *steps = cJSON_AddArrayToObject(o, "steps");
    static const char *const keys[L02_N_Q] = {"forward_input", "forward_output", "input_grad",
                                              "output_grad", "param_grads", "params"};
    for (int k = 0; k < L02_STEPS; k++) {
        cJSON *s = cJSON_CreateObject();
        cJSON_AddNumberToObject(s, "step", k);
        for (int q = 0; q < L02_N_Q; q++) {
            double v = l02_mod_q(&st->faulty, k, m, q);
            if (v >= 0) cJSON_AddNumberToObject(s, keys[q], l02_sig(v));
        }
        cJSON *differs = cJSON_AddArrayToObject(s, "differs");
        for (int q = 0; q < L02_N_Q; q++)
            if (l02_mod_q(&st->faulty, k, m, q) > L02_TOL)
                cJSON_AddItemToArray(differs, cJSON_CreateString(keys[q]));
        for (int w = 0; w < 2; w++) {
            int j = l02_worst_param(&st->faulty, k, m, w);
            if (j >= 0 && st->faulty.param[k][j][w] > L02_TOL)
                cJSON_AddStringToObject(s, w ? "worst_param" : "worst_grad",
                                        st->faulty.param_names[j]);
        }
        cJSON_AddItemToArray(steps, s);
    }
    return o;
}

static cJSON *l02_facts(lab_ctx *cx) {
    l02_state *st = cx->state;
    cJSON *f = cJSON_CreateObject();
    int per_mb = L02_STEPS * L02_M, last = st->stage_ranks[st->pp - 1][0];
    cJSON *lay = cJSON_AddObjectToObject(f, "layout");
    cJSON_AddNumberToObject(lay, "world", cx->world_size);
    cJSON_AddNumberToObject(lay, "tp", st->tp);
    cJSON_AddNumberToObject(lay, "pp", st->pp);
    cJSON_AddNumberToObject(lay, "dp", 1);
    cJSON_AddBoolToObject(lay, "sequence_parallel", 1);
    cJSON_AddBoolToObject(lay, "tied_embeddings", 1);
    cJSON *model = cJSON_AddObjectToObject(f, "model");
    cJSON_AddNumberToObject(model, "layers", L02_LAYERS);
    cJSON_AddNumberToObject(model, "hidden", L02_HIDDEN);
    cJSON_AddNumberToObject(model, "heads", L02_HEADS);
    cJSON_AddNumberToObject(model, "seq_length", L02_SEQ);
    cJSON_AddNumberToObject(model, "micro_batch_size", L02_MBS);
    cJSON_AddNumberToObject(model, "num_microbatches", L02_M);
    cJSON_AddNumberToObject(model, "steps", L02_STEPS);

    /* A: the tree and the package map */
    cJSON *stage_of = cJSON_AddObjectToObject(f, "stage_of");
    cJSON_AddNumberToObject(stage_of, "embedding", 0);
    for (int l = 0; l < L02_LAYERS; l++) {
        char key[16];
        snprintf(key, sizeof key, "layer%d", l);
        cJSON_AddNumberToObject(stage_of, key, l02_stage_of(L02_MOD_LAYER(l, 0), st->pp));
    }
    cJSON_AddNumberToObject(stage_of, "final_layernorm", st->pp - 1);
    cJSON_AddNumberToObject(stage_of, "output_layer", st->pp - 1);
    cJSON_AddNumberToObject(stage_of, "loss", st->pp - 1);
    cJSON *modules = cJSON_AddObjectToObject(f, "modules");
    for (int m = 0; m < L02_N_PRIM; m++) {
        int stage = l02_stage_of(m, st->pp), r0 = st->stage_ranks[stage][0];
        cJSON *o = cJSON_AddObjectToObject(modules, l02_mod_names[m]);
        cJSON_AddNumberToObject(o, "stage", stage);
        cJSON_AddItemToObject(o, "ranks", lab_json_int_array(st->stage_ranks[stage], st->tp));
        cJSON_AddStringToObject(o, "package", l02_package(m));
        cJSON_AddItemToObject(o, "forward_per_microbatch",
                              l02_count_json(st->counts_rank[r0][2 * m], per_mb));
        cJSON_AddItemToObject(o, "backward_per_microbatch",
                              l02_count_json(st->counts_rank[r0][2 * m + 1], per_mb));
    }
    cJSON *pm = cJSON_AddObjectToObject(f, "package_map");
    int attn = L02_MOD_LAYER(0, L02_SUB_ATTN), mlp = L02_MOD_LAYER(0, L02_SUB_MLP);
    cJSON_AddNumberToObject(pm, "tp_collectives_embedding_forward",
                            l02_total(st->counts_rank[0][2 * L02_MOD_EMB], L02_G_TP) / per_mb);
    cJSON_AddNumberToObject(pm, "tp_collectives_attention_forward",
                            l02_total(st->counts_rank[0][2 * attn], L02_G_TP) / per_mb);
    cJSON_AddNumberToObject(pm, "tp_collectives_attention_backward",
                            l02_total(st->counts_rank[0][2 * attn + 1], L02_G_TP) / per_mb);
    cJSON_AddNumberToObject(pm, "tp_collectives_mlp_forward",
                            l02_total(st->counts_rank[0][2 * mlp], L02_G_TP) / per_mb);
    cJSON_AddNumberToObject(pm, "tp_collectives_loss_forward",
                            l02_total(st->counts_rank[last][2 * L02_MOD_LOSS], L02_G_TP) / per_mb);
    cJSON_AddNumberToObject(pm, "activations_sent_per_step",
                            st->counts_rank[0][L02_AT_SCHEDULE][L02_G_PP][L02_OP_P2P] / L02_STEPS);
    cJSON *fin = cJSON_AddObjectToObject(pm, "finalize_collectives_last_stage");
    for (int g = 0; g < L02_N_GROUPS; g++)
        cJSON_AddNumberToObject(fin, l02_group_name[g],
                                l02_total(st->counts_rank[last][L02_AT_FINALIZE], g) / L02_STEPS);
    cJSON *opt = cJSON_AddObjectToObject(pm, "optimizer_collectives");
    const char *opt_group = "none";
    for (int g = 0; g < L02_N_GROUPS; g++) {
        int n = l02_total(st->counts_rank[0][L02_AT_OPTIMIZER], g) / L02_STEPS;
        cJSON_AddNumberToObject(opt, l02_group_name[g], n);
        if (n > 0 && strcmp(opt_group, "none") == 0) opt_group = l02_group_name[g];
    }
    cJSON_AddStringToObject(pm, "optimizer_grad_norm_group", opt_group);
    cJSON *per = cJSON_AddObjectToObject(pm, "per_step");
    static const struct { int at; const char *key; } outside[] = {
        {L02_AT_SCHEDULE, "pipeline_parallel"}, {L02_AT_FINALIZE, "finalize_model_grads"},
        {L02_AT_OPTIMIZER, "optimizer"}};
    for (int i = 0; i < 3; i++) {
        cJSON *o = cJSON_AddObjectToObject(per, outside[i].key);
        cJSON_AddItemToObject(o, "rank0",
                              l02_count_json(st->counts_rank[0][outside[i].at], L02_STEPS));
        char key[16];
        snprintf(key, sizeof key, "rank%d", last);
        cJSON_AddItemToObject(o, key,
                              l02_count_json(st->counts_rank[last][outside[i].at], L02_STEPS));
    }
    cJSON *ck = cJSON_AddObjectToObject(pm, "checkpoint");
    cJSON_AddNumberToObject(ck, "saved_tp", st->ckpt_saved_tp);
    cJSON_AddNumberToObject(ck, "saved_pp", st->ckpt_saved_pp);
    cJSON_AddBoolToObject(ck, "loaded_at_tp1_resharded", st->ckpt_resharded);
    cJSON_AddBoolToObject(ck, "tp1_load_matches", st->ckpt_resharded && st->ckpt_max_diff == 0.0);
    cJSON_AddItemToObject(ck, "save_collectives_rank0",
                          l02_count_json(st->counts_rank[0][L02_AT_CHECKPOINT], 1));
    cJSON *clean = cJSON_AddObjectToObject(f, "clean");
    cJSON_AddBoolToObject(clean, "matches_reference", st->clean_matches);
    cJSON_AddNumberToObject(clean, "max_rel_diff", l02_sig(st->clean_worst));
    cJSON_AddItemToObject(clean, "loss", l02_doubles(st->clean_loss, L02_STEPS, 1e6));
    cJSON_AddItemToObject(clean, "reference_loss", l02_doubles(st->ref_loss, L02_STEPS, 1e6));
    cJSON *ctl = cJSON_AddObjectToObject(f, "control_max_as_sum");
    cJSON_AddNumberToObject(ctl, "loss_rel_diff", l02_sig(st->control_loss_rel));
    cJSON_AddBoolToObject(ctl, "loss_changes", st->control_loss_rel > 1e-5);

    /* B: the symptom */
    cJSON *sy = cJSON_AddObjectToObject(f, "symptom");
    cJSON_AddItemToObject(sy, "loss", l02_doubles(st->loss, L02_STEPS, 1e6));
    cJSON_AddItemToObject(sy, "reference_loss", l02_doubles(st->ref_loss, L02_STEPS, 1e6));
    double v[L02_STEPS];
    for (int k = 0; k < L02_STEPS; k++) v[k] = l02_sig(st->loss_rel[k]);
    cJSON_AddItemToObject(sy, "loss_rel_diff", l02_doubles(v, L02_STEPS, 1e12));
    cJSON_AddItemToObject(sy, "grad_norm", l02_doubles(st->grad_norm, L02_STEPS, 1e6));
    cJSON_AddItemToObject(sy, "reference_grad_norm", l02_doubles(st->ref_norm, L02_STEPS, 1e6));
    for (int k = 0; k < L02_STEPS; k++) v[k] = l02_sig(st->norm_rel[k]);
    cJSON_AddItemToObject(sy, "grad_norm_rel_diff", l02_doubles(v, L02_STEPS, 1e12));
    cJSON_AddNumberToObject(sy, "first_loss_step", st->first_loss_step);
    cJSON_AddBoolToObject(sy, "step0_loss_differs", st->loss_rel[0] > L02_LOSS_TOL);
    cJSON_AddBoolToObject(sy, "step0_grad_norm_differs", st->norm_rel[0] > L02_LOSS_TOL);
    int agree = 1;
    cJSON *tl = cJSON_AddArrayToObject(sy, "last_stage_rank_losses");
    for (int k = 0; k < L02_STEPS; k++) {
        cJSON_AddItemToArray(tl, l02_doubles(st->stage_losses[k], st->tp, 1e6));
        for (int r = 1; r < st->tp; r++)
            agree &= l02_rel_scalar(st->stage_losses[k][r], st->stage_losses[k][0]) <= 1e-6;
    }
    cJSON_AddBoolToObject(sy, "last_stage_ranks_agree", agree);

    /* C and the ledger of probes */
    if (st->probe >= 0) cJSON_AddItemToObject(f, "probe", l02_probe_json(st));
    cJSON *pr = cJSON_AddObjectToObject(f, "probes");
    cJSON_AddNumberToObject(pr, "count", st->probes.count);
    cJSON_AddNumberToObject(pr, "before_reveal", st->probes.before_reveal);
    cJSON_AddNumberToObject(pr, "budget", L02_PROBE_BUDGET);
    cJSON_AddItemToObject(pr, "list", st->probes.modules ? st->probes.modules
                                                         : cJSON_CreateArray());
    st->probes.modules = NULL;

    /* the reveal: only once every finding is locked */
    cJSON_AddBoolToObject(f, "revealed", st->revealed);
    if (st->revealed) {
        const l02_fault *fl = &st->fault;
        cJSON *fo = cJSON_AddObjectToObject(f, "fault");
        cJSON_AddStringToObject(fo, "id", l02_faults[fl->which].id);
        cJSON_AddStringToObject(fo, "module", fl->module);
        cJSON_AddStringToObject(fo, "phase", l02_faults[fl->which].phase);
        cJSON_AddStringToObject(fo, "collective", l02_faults[fl->which].collective);
        cJSON_AddStringToObject(fo, "what", l02_faults[fl->which].what);
        int layer = -1;
        if (sscanf(fl->module, "decoder.layers.%d.", &layer) == 1)
            cJSON_AddNumberToObject(fo, "layer", layer);
        else
            cJSON_AddStringToObject(fo, "layer", "none");
        if (fl->param[0]) cJSON_AddStringToObject(fo, "param", fl->param);
        cJSON *dv = cJSON_AddObjectToObject(f, "first_divergence");
        cJSON_AddStringToObject(dv, "module", st->div.module_name);
        cJSON_AddStringToObject(dv, "phase", st->div.phase ? st->div.phase : "none");
        cJSON_AddNumberToObject(dv, "step", st->div.step);
        cJSON_AddStringToObject(dv, "quantity", l02_q_name[st->div.quantity]);
        int right = strcasecmp(st->locked_module, fl->module) == 0;
        int within = st->probes.before_reveal <= L02_PROBE_BUDGET;
        cJSON *bs = cJSON_AddObjectToObject(f, "bisection");
        cJSON_AddNumberToObject(bs, "probes_before_reveal", st->probes.before_reveal);
        cJSON_AddNumberToObject(bs, "budget", L02_PROBE_BUDGET);
        cJSON_AddBoolToObject(bs, "diagnosis_module_right", right);
        cJSON_AddStringToObject(bs, "found_within_budget", right && within ? "yes" : "no");
    }
    return f;
}

static void l02_report(lab_ctx *cx) {
    l02_state *st = cx->state;
    lab_heading(cx, "D. The diagnosis");
    lab_printf0("probes for nonce %s: %d (%d before the reveal; budget %d)\n", cx->nonce,
                st->probes.count, st->probes.before_reveal, L02_PROBE_BUDGET);
    if (!st->revealed) {
        lab_printf0("The fault stays hidden until your diagnosis is locked: fill the follow-up "
                    "pred block (faulty_module, faulty_layer, faulty_phase, culprit_collective, "
                    "found_within_4_probes) and run once more; that run locks them and "
                    "reveals the fault. Probes after it do not count.\n");
        return;
    }
    const l02_fault *fl = &st->fault;
    lab_printf0("the fault: %s (%s)\n  module %s, phase %s, culprit collective %s%s%s\n",
                l02_faults[fl->which].id, l02_faults[fl->which].what, fl->module,
                l02_faults[fl->which].phase, l02_faults[fl->which].collective,
                fl->param[0] ? ", parameter " : "", fl->param);
    lab_printf0("the full oracle's first divergence: %s, %s, step %d (%s)\n",
                st->div.module_name, st->div.phase ? st->div.phase : "none", st->div.step,
                l02_q_name[st->div.quantity]);
    lab_printf0("your locked module: %s (%s); found within %d probes: %s\n",
                st->locked_module[0] ? st->locked_module : "-",
                strcasecmp(st->locked_module, fl->module) == 0 ? "right" : "wrong",
                L02_PROBE_BUDGET,
                strcasecmp(st->locked_module, fl->module) == 0 &&
                        st->probes.before_reveal <= L02_PROBE_BUDGET
                    ? "yes"
                    : "no");
}

static void l02_cleanup(lab_ctx *cx) {
    l02_state *st = cx->state;
    l02_app_free(&l02_bad);
    l02_app_free(&l02_ref);
    cJSON_Delete(st->probes.modules);
    if (st->self_ps.initialized) mc_parallel_destroy(&st->self_ps);
    if (st->self_world) mc_comm_destroy(st->self_world);
    if (st->ps.initialized) mc_parallel_destroy(&st->ps);
}

static const lab_flag l02_flags[] = {{"--probe", 1}};

static const lab_experiment l02_experiments[] = {
    {"A", l02_exp_map}, {"B", l02_exp_symptom}, {"C", l02_exp_probe}};

static const lab_spec lab02_spec = {
    .name = "lab02",
    .question = "M002",
    .title = "Megatron-Core's package map, and localising a loss anomaly",
    .summary = "Runs a TP=2 x PP=2 GPT (SP, tied embeddings) beside a TP=1 reference: (A) the "
               "module tree and every collective of a step booked to the module or package "
               "that issued it, a checkpoint resharded to TP=1; (B) the symptom of a hidden "
               "fault drawn from your nonce (loss and grad norm against TP=1); (C) with "
               "--probe MODULE, that module's tensors against TP=1 (counted per nonce). The "
               "fault is revealed once your diagnosis (the follow-up pred block) is locked.",
    .usage = "  --probe MODULE     compare MODULE's tensors with the TP=1 run (embedding,\n"
             "                     decoder, decoder.layers.N[.input_layernorm|.self_attention|\n"
             "                     .pre_mlp_layernorm|.mlp], decoder.final_layernorm,\n"
             "                     output_layer, loss, gpt)\n",
    .flags = l02_flags,
    .n_flags = 1,
    .default_world = 4,
    .sizes = {.tp = 2, .pp = 2},
    .max_world = L02_MAX_WORLD,
    .check_world = l02_check_world,
    .call_timeout_s = 30.0,
    .n_variants = 1,
    .experiments = l02_experiments,
    .n_experiments = 3,
    .state_size = sizeof(l02_state),
    .facts = l02_facts,
    .report = l02_report,
    .cleanup = l02_cleanup,
};

int main(int argc, char **argv) { return lab_main(argc, argv, &lab02_spec); }
