/* labs/lab10.c - M010: why the model-parallel RNG tracker is necessary.

   A small GPT (4 layers, hidden 16, 4 heads, 8 tokens x 2 samples, dropout 0.1) runs with
   tensor parallelism on the ranks it is started with (default TP = 2; world = TP). The
   library's tracker (mc_rng_tracker, seeded like Megatron's model_parallel_cuda_manual_seed)
   holds the default generator (seed', the same on every TP rank) and model-parallel-rng
   (seed' + 2718 + tp_rank). Every dropout reports its draw through mc_gpt.dropout_drawn; the
   lab turns a draw back into its mask with the op table's own dropout (a tensor of ones) and
   compares masks across the TP ranks.

   Experiments, on every rank:
     A  masks across TP ranks, SP off and on, under three rules: the tracker (Megatron's
        choice per region), "one global seed" (every mask from the default generator) and "a
        seed per rank" (every mask from model-parallel-rng); the last two are library faults
        (mc_fault_dropout_stream, compiled into this lab's library build only). A table of
        mask pairs equal / different per region against what the region's layout needs
        (replicated over TP: equal; sharded: different). Compared with: Megatron's seed rule,
        the Philox formula for every mask (mc_rng_dropout_mask), the offsets implied by the
        draw sizes, the single-rank run's masks (replicated regions: identical) and the
        statistics of independent masks (agreement 1 - 2p(1-p), joint drop p^2).
     B  what the rules do to a training step, against the single-rank run of the same model
        and data (hidden dropout only, so that a correct TP run must equal it): loss, every
        gradient against the single-rank slice, and whether the TP replicas of replicated
        parameters got the same gradient.
     C  full activation recompute (the follow-up variant picks the layers) with and without
        the RNG handling: the snapshot restored before the replay, the outer progress restored
        after it (mc_fault_recompute_rng removes either). Per mode: gradient error against
        the no-recompute run, which layers' gradients are wrong, whether the replay drew the
        forward's masks, the streams' offsets afterwards and what the next iteration draws.
        Compared with: the offsets computed from the draw sizes and the recompute groups.
     D  checkpoint and resume: the RNG states saved with the weights; resuming with them
        repeats the uninterrupted run bit for bit; resuming without them (Megatron's
        --no-load-rng) redraws iteration 1's masks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lab_driver.h"

#if !defined(MC_FAULT_HOOKS)
/* lab10 injects RNG faults: build it with make lab10 (-DMC_FAULT_HOOKS, build/mc_impl_faults.o) */
#error "lab10 needs MC_FAULT_HOOKS and the library built with it: use make lab10"
#endif

/* ---------------------------------------------------------------------------------------------
   sizes */

#define L10_LAYERS 4
#define L10_HIDDEN 16
#define L10_HEADS 4
#define L10_FFN 32
#define L10_VOCAB 32
#define L10_SEQ 8
#define L10_MBS 2
#define L10_TOKENS (L10_SEQ * L10_MBS)
#define L10_P 0.1f                 /* hidden and attention dropout */
#define L10_SEED 1234
#define L10_MP_OFFSET 2718         /* model-parallel-rng = seed' + 2718 + tp_rank */
#define L10_DATA_SEED 20261210ull
#define L10_LR 0.05f               /* D: one plain SGD step between the iterations */
#define L10_MAX_TP 4
#define L10_MAX_DRAWS 64           /* per recorded pass: 1 + 3 L forward, 3 L replayed */
/* B: a TP run and the single-rank run differ only by the order of the row-parallel sums */
#define L10_LOSS_RTOL 1e-5
#define L10_GRAD_ATOL 1e-5

enum { L10_TRACKER = 0, L10_ONE_SEED, L10_PER_RANK, L10_N_RULES };
static const char *const l10_rule_key[L10_N_RULES] = {"tracker", "one_seed", "per_rank_seed"};
static const char *const l10_rule_title[L10_N_RULES] = {"tracker", "one global seed",
                                                        "seed per rank"};
/* the fault stream of each rule (NULL: Megatron's choice) */
static const char *const l10_rule_stream[L10_N_RULES] = {NULL, MC_RNG_DEFAULT,
                                                         MC_RNG_MODEL_PARALLEL};

static const char *const l10_site_key[MC_GPT_DROPOUT_SITES] = {
    "embedding", "attention_probs", "attention_out", "mlp_out"};
static const char *const l10_site_title[MC_GPT_DROPOUT_SITES] = {
    "embedding output", "attention probabilities", "after linear_proj", "after linear_fc2"};

enum { L10_EQUAL = 0, L10_DIFFERENT, L10_MIXED };
static const char *const l10_verdict[3] = {"equal", "different", "mixed"};

/* C: the recompute modes. none is the reference; the others run full recompute with the
   RNG handling steps named. */
enum { L10_RC_NONE = 0, L10_RC_BOTH, L10_RC_NO_RESTORE, L10_RC_SNAPSHOT_ONLY,
       L10_RC_OUTER_ONLY, L10_N_RC };
static const char *const l10_rc_key[L10_N_RC] = {"none", "restore_both", "no_restore",
                                                 "snapshot_only", "outer_only"};
static const char *const l10_rc_title[L10_N_RC] = {
    "no recompute (reference)", "recompute, snapshot + outer restored",
    "recompute, no RNG handling", "recompute, snapshot only", "recompute, outer only"};
static const unsigned l10_rc_fault[L10_N_RC] = {
    0, 0, MC_FAULT_RECOMPUTE_NO_SNAPSHOT | MC_FAULT_RECOMPUTE_NO_OUTER,
    MC_FAULT_RECOMPUTE_NO_OUTER, MC_FAULT_RECOMPUTE_NO_SNAPSHOT};

/* The follow-up variants: which layers full recompute checkpoints. */
typedef struct l10_variant {
    mc_recompute_method method;
    int num_layers;
    const char *text;
} l10_variant;
static const l10_variant l10_variants[3] = {
    {MC_RECOMPUTE_BLOCK, 1, "block, recompute_num_layers 1: layer 0 alone"},
    {MC_RECOMPUTE_UNIFORM, 2, "uniform, recompute_num_layers 2: groups {0,1} and {2,3}"},
    {MC_RECOMPUTE_BLOCK, 2, "block, recompute_num_layers 2: layers 0 and 1, each alone"}};

/* ---------------------------------------------------------------------------------------------
   draws, as the model's dropout_drawn tap reports them */

typedef struct l10_draw {
    int site, layer, replay, mp;   /* mp: drawn from model-parallel-rng */
    uint64_t seed, offset;
    size_t n;
} l10_draw;

typedef struct l10_tap {
    l10_draw d[L10_MAX_DRAWS];
    int n, overflow;
} l10_tap;

static void l10_on_draw(void *user, const mc_gpt_dropout_draw *t) {
    l10_tap *tap = (l10_tap *)user;
    if (tap->n == L10_MAX_DRAWS) {
        tap->overflow = 1;
        return;
    }
    l10_draw *d = &tap->d[tap->n++];
    d->site = (int)t->site;
    d->layer = t->layer;
    d->replay = t->replay;
    d->mp = strcmp(t->stream, MC_RNG_MODEL_PARALLEL) == 0;
    d->seed = t->seed;
    d->offset = t->offset;
    d->n = t->n;
}

static uint64_t l10_round4(size_t n) { return ((uint64_t)n + 3u) & ~(uint64_t)3u; }

/* ---------------------------------------------------------------------------------------------
   the lab's state */

typedef struct l10_site_row {      /* one region of A's table */
    int layout_sharded;
    int stream_mp;                 /* the tracker's stream */
    int verdict[L10_N_RULES];      /* L10_EQUAL / DIFFERENT / MIXED */
} l10_site_row;

typedef struct l10_stats {         /* rank 0's masks against each other rank's, pooled */
    long long pairs, agree, both_dropped;
} l10_stats;

typedef struct l10_train_row {     /* B */
    double loss, loss_rel, grad_max_diff, grad_norm, replica_diff;
    int matches, replicas_agree;
} l10_train_row;

typedef struct l10_rc_row {        /* C */
    double loss, grad_err;
    int loss_equal, grad_zero, replay_equal, n_replays, emb_wrong, repeats;
    int wrong[L10_LAYERS];
    uint64_t def_after, mp_after;
    long long def_shift, mp_shift;
    uint64_t first_replay_offset;  /* default stream: the first replayed hidden dropout */
    int later;                     /* 0 same, 1 shifted, 2 repeats */
} l10_rc_row;

typedef struct l10_state {
    mc_parallel_state ps;
    int have_ps, tp, tp_rank;
    int n_hidden, n_attn;          /* elements of one hidden / attention-probability draw */
    /* A */
    l10_site_row rows[2][MC_GPT_DROPOUT_SITES];
    l10_stats sharded[2][L10_N_RULES], replicated[L10_N_RULES], single_halves[2];
    int seeds_ok, formula_ok, offsets_ok, single_replicated_equal, n_single_compared;
    uint64_t seen_default_seed, seen_mp_seed;   /* this rank's, from the tracker passes */
    int mp_seeds[L10_MAX_TP];      /* every TP rank's model-parallel-rng seed, as drawn */
    /* B */
    l10_train_row train[L10_N_RULES];
    double single_loss, single_grad_norm;
    /* C */
    const l10_variant *variant;
    int groups[L10_LAYERS][2];     /* [first, count] of each recompute group */
    int n_groups;
    l10_rc_row rc[L10_N_RC];
    uint64_t formula_def_end, formula_mp_end;
    /* D */
    double ck_loss2[3];            /* uninterrupted, resumed with RNG, resumed without */
    double ck_grad_diff[3];
    int ck_rng_restored[3];
    int ck_masks[3];               /* iteration 2 drew: 0 the uninterrupted run's masks,
                                      1 other masks, 2 iteration 1's masks again */
    char ck_dir[512], ck_rng_text[512];
} l10_state;

/* ---------------------------------------------------------------------------------------------
   the model and its data */

typedef struct l10_model {
    int tp, sp;
    float attn_p, hidden_p;
    mc_recompute_method method;
    int recompute_layers;          /* 0: no recompute */
} l10_model;

static mc_gpt_config l10_config(const l10_model *m) {
    mc_gpt_config c;
    memset(&c, 0, sizeof c);
    c.num_layers = L10_LAYERS;
    c.hidden_size = L10_HIDDEN;
    c.num_attention_heads = L10_HEADS;
    c.ffn_hidden_size = L10_FFN;
    c.vocab_size = L10_VOCAB;
    c.make_vocab_size_divisible_by = 8;
    c.seq_length = L10_SEQ;
    c.max_position_embeddings = L10_SEQ;
    c.micro_batch_size = L10_MBS;
    c.hidden_dropout = m->hidden_p > 0 ? m->hidden_p : MC_DROPOUT_OFF;
    c.attention_dropout = m->attn_p > 0 ? m->attn_p : MC_DROPOUT_OFF;
    c.tensor_model_parallel_size = m->tp;
    c.sequence_parallel = m->sp;
    if (m->recompute_layers > 0) {
        c.recompute_granularity = MC_RECOMPUTE_FULL;
        c.recompute_method = m->method;
        c.recompute_num_layers = m->recompute_layers;
    }
    c.seed = L10_SEED;
    return c;
}

/* The TP model on the lab's parallel state (tp > 1), or the single-rank model (tp == 1),
   with the tap recording into `tap`. */
static void l10_model_init(lab_ctx *cx, mc_gpt *g, const l10_model *m, l10_tap *tap) {
    l10_state *st = cx->state;
    mc_gpt_desc gd;
    memset(&gd, 0, sizeof gd);
    gd.config = l10_config(m);
    gd.ps = m->tp > 1 ? &st->ps : NULL;
    gd.ops = mc_comm_memory(cx->world);
    gd.n_slots = 1;
    MC_CHECK(mc_gpt_init(g, &gd));
    g->dropout_drawn = l10_on_draw;
    g->dropout_drawn_user = tap;
}

/* Batch k: tokens and next-token labels, [S, B] (token n = s * B + b). */
static void l10_batch(int k, int *tokens, int *labels) {
    for (int b = 0; b < L10_MBS; b++)
        for (int s = 0; s <= L10_SEQ; s++) {
            uint64_t at = ((uint64_t)k * L10_MBS + (uint64_t)b) * (L10_SEQ + 1) + (uint64_t)s;
            int tok = (int)(mc_rng_bits_at(L10_DATA_SEED, at) % L10_VOCAB);
            if (s < L10_SEQ) tokens[s * L10_MBS + b] = tok;
            if (s > 0) labels[(s - 1) * L10_MBS + b] = tok;
        }
}

/* Forward (and backward) of batch k; the mean loss over its tokens. */
static double l10_step(mc_gpt *g, int k, int backward) {
    int tokens[L10_TOKENS], labels[L10_TOKENS];
    float *out = NULL, *dinp = NULL;
    double loss_sum = 0.0;
    l10_batch(k, tokens, labels);
    MC_CHECK(mc_gpt_forward(g, 0, 0, tokens, labels, NULL, &out, &loss_sum));
    if (backward) MC_CHECK(mc_gpt_backward(g, 0, 0, NULL, 1.0f / L10_TOKENS, &dinp));
    return loss_sum / L10_TOKENS;
}

static float *l10_grads(const mc_gpt *g) {
    float *h = lab_xcalloc(g->table.total, sizeof(float));
    MC_CHECK(g->ops->download(g->ops, h, g->grads, g->table.total * sizeof(float)));
    return h;
}

/* The default generator's and model-parallel-rng's offsets now (no fork open). */
static void l10_offsets(mc_gpt *g, uint64_t *def, uint64_t *mp) {
    mc_rng r;
    *def = mc_rng_tracker_current(&g->rng)->offset;
    MC_CHECK(mc_rng_tracker_get(&g->rng, MC_RNG_MODEL_PARALLEL, &r));
    *mp = r.offset;
}

/* ---------------------------------------------------------------------------------------------
   masks */

/* The keep mask of a draw, through the op table's dropout on a tensor of ones (the op the
   model ran), into keep[0..n). Returns 1 when it equals the Philox formula's mask. */
static int l10_mask(const mc_ops *o, const l10_draw *d, uint8_t *keep) {
    void *buf = NULL;
    float *host = lab_xcalloc(d->n, sizeof(float));
    uint8_t *want = lab_xcalloc(d->n, 1);
    MC_CHECK(o->alloc(o, &buf, d->n * sizeof(float)));
    MC_CHECK(o->fill(o, buf, 1.0f, d->n, MC_F32));
    MC_CHECK(o->dropout_forward(o, buf, buf, d->n, L10_P, d->seed, d->offset, MC_F32));
    MC_CHECK(o->download(o, host, buf, d->n * sizeof(float)));
    MC_CHECK(o->free(o, buf));
    mc_rng r = {d->seed, d->offset};
    MC_CHECK(mc_rng_dropout_mask(&r, want, d->n, L10_P));
    int same = 1;
    for (size_t i = 0; i < d->n; i++) {
        keep[i] = host[i] != 0.0f;
        same &= keep[i] == want[i];
    }
    free(host);
    free(want);
    return same;
}

/* Every draw's mask, concatenated (bits), on this rank; *starts gets each draw's first bit. */
static uint8_t *l10_masks(const mc_ops *o, const l10_tap *tap, int *starts, int *total,
                          int *formula_ok) {
    int n = 0;
    for (int k = 0; k < tap->n; k++) {
        starts[k] = n;
        n += (int)tap->d[k].n;
    }
    uint8_t *bits = lab_xcalloc((size_t)n, 1);
    for (int k = 0; k < tap->n; k++)
        *formula_ok &= l10_mask(o, &tap->d[k], bits + starts[k]);
    *total = n;
    return bits;
}

/* Every rank's bits (each rank passes the same count), packed 32 to an int on the wire. */
static uint8_t *l10_gather_bits(lab_ctx *cx, const uint8_t *bits, int n) {
    int words = (n + 31) / 32, p = cx->world_size;
    int *mine = lab_xcalloc((size_t)words, sizeof(int)), *all = lab_xcalloc((size_t)(words * p),
                                                                            sizeof(int));
    for (int i = 0; i < n; i++)
        if (bits[i]) mine[i / 32] |= (int)(1u << (i % 32));
    MC_CHECK(lab_all_gather_i32(cx->world, mine, all, (size_t)words));
    uint8_t *out = lab_xcalloc((size_t)(n * p), 1);
    for (int r = 0; r < p; r++)
        for (int i = 0; i < n; i++)
            out[r * n + i] = ((unsigned)all[r * words + i / 32] >> (i % 32)) & 1u;
    free(mine);
    free(all);
    return out;
}

static void l10_stats_add(l10_stats *s, const uint8_t *a, const uint8_t *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        s->pairs++;
        s->agree += a[i] == b[i];
        s->both_dropped += !a[i] && !b[i];
    }
}

static double l10_frac(long long x, long long n) { return n > 0 ? (double)x / (double)n : 0.0; }

/* Agreement of two independent masks with drop probability p: both kept or both dropped. */
static double l10_independent_agreement(void) {
    return 1.0 - 2.0 * L10_P * (1.0 - L10_P);
}

/* ---------------------------------------------------------------------------------------------
   world */

static int l10_check_world(const lab_ctx *cx, char *why, size_t cap) {
    const mc_grid_desc *g = &cx->grid.desc;
    if (g->pp != 1 || g->cp != 1 || g->ep != 1 || g->vpp > 1) {
        snprintf(why, cap, "needs pp=cp=ep=1 and no --vpp (got pp=%d cp=%d ep=%d vpp=%d): the "
                 "lab compares dropout masks across the ranks of one TP group", g->pp, g->cp,
                 g->ep, g->vpp);
        return 1;
    }
    if (g->tp != 2 && g->tp != 4) {
        snprintf(why, cap, "needs tp = 2 or 4 (got tp=%d): the model has %d heads, ffn %d and "
                 "%d tokens per sequence to split", g->tp, L10_HEADS, L10_FFN, L10_SEQ);
        return 1;
    }
    if (cx->world_size != g->tp) {
        snprintf(why, cap, "needs world == tp (got %d ranks for tp=%d, so dp=%d): one TP group "
                 "holds the whole comparison (or --tp %d)", cx->world_size, g->tp, cx->grid.dp,
                 cx->world_size);
        return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
   A. masks across TP ranks */

/* One forward under `rule` with SP on or off: this rank's draws and every rank's masks. */
typedef struct l10_pass {
    l10_tap tap;
    int starts[L10_MAX_DRAWS], total;
    uint8_t *all;                  /* (world, total) */
} l10_pass;

static void l10_mask_pass(lab_ctx *cx, int tp, int sp, int rule, l10_pass *pass) {
    l10_state *st = cx->state;
    mc_gpt g;
    l10_model m = {tp, sp, L10_P, L10_P, MC_RECOMPUTE_METHOD_NONE, 0};
    memset(pass, 0, sizeof *pass);
    l10_model_init(cx, &g, &m, &pass->tap);
    mc_fault_dropout_stream(l10_rule_stream[rule]);
    l10_step(&g, 0, 0);
    mc_fault_dropout_stream(NULL);
    if (pass->tap.overflow) MC_CHECK(MC_ERR_STATE);
    uint8_t *mine = l10_masks(g.ops, &pass->tap, pass->starts, &pass->total, &st->formula_ok);
    pass->all = tp > 1 ? l10_gather_bits(cx, mine, pass->total) : mine;
    if (tp > 1) free(mine);
    /* Megatron's seeds and the stream offsets implied by the draw sizes */
    uint64_t next[2] = {0, 0};
    for (int k = 0; k < pass->tap.n; k++) {
        const l10_draw *d = &pass->tap.d[k];
        uint64_t want = d->mp ? (uint64_t)(L10_SEED + L10_MP_OFFSET + (tp > 1 ? st->tp_rank : 0))
                              : (uint64_t)L10_SEED;
        st->seeds_ok &= d->seed == want;
        st->offsets_ok &= d->offset == next[d->mp];
        next[d->mp] = d->offset + l10_round4(d->n);
        if (tp > 1 && rule == L10_TRACKER) {
            if (d->mp) st->seen_mp_seed = d->seed;
            else st->seen_default_seed = d->seed;
        }
    }
    mc_gpt_destroy(&g);
}

/* Element j of TP shard r of a draw, as an index into the single-rank draw of the region. */
static size_t l10_shard_index(const l10_state *st, int site, int r, size_t j) {
    if (site != MC_GPT_DROPOUT_ATTENTION_PROBS)
        return (size_t)r * (size_t)st->n_hidden / (size_t)st->tp + j;
    size_t per_b = (size_t)(L10_HEADS / st->tp) * L10_SEQ * L10_SEQ;
    size_t b = j / per_b, rem = j % per_b;
    return (b * L10_HEADS + (size_t)r * (L10_HEADS / st->tp)) * L10_SEQ * L10_SEQ + rem;
}

static int l10_sharded(int sp, int site) { return site == MC_GPT_DROPOUT_ATTENTION_PROBS || sp; }

static void l10_summarise(lab_ctx *cx, int sp, int rule, const l10_pass *pass) {
    l10_state *st = cx->state;
    int eq[MC_GPT_DROPOUT_SITES] = {0}, ne[MC_GPT_DROPOUT_SITES] = {0};
    for (int k = 0; k < pass->tap.n; k++) {
        const l10_draw *d = &pass->tap.d[k];
        const uint8_t *a = pass->all + pass->starts[k];
        for (int r = 1; r < st->tp; r++) {
            const uint8_t *b = pass->all + (size_t)r * (size_t)pass->total + pass->starts[k];
            int same = memcmp(a, b, d->n) == 0;
            eq[d->site] += same;
            ne[d->site] += !same;
            l10_stats_add(l10_sharded(sp, d->site) ? &st->sharded[sp][rule]
                                                    : &st->replicated[rule], a, b, d->n);
        }
        if (rule == L10_TRACKER) st->rows[sp][d->site].stream_mp = d->mp;
    }
    for (int s = 0; s < MC_GPT_DROPOUT_SITES; s++) {
        st->rows[sp][s].layout_sharded = l10_sharded(sp, s);
        st->rows[sp][s].verdict[rule] = ne[s] == 0 ? L10_EQUAL : eq[s] == 0 ? L10_DIFFERENT
                                                                            : L10_MIXED;
    }
}

/* The single-rank run: replicated regions must draw exactly its masks (same stream, same
   offsets); its shards of the sharded regions give the statistics of independent masks. */
static void l10_single_reference(lab_ctx *cx, const l10_pass *tracker_off) {
    l10_state *st = cx->state;
    l10_pass one;
    l10_mask_pass(cx, 1, 0, L10_TRACKER, &one);
    st->single_replicated_equal = 1;
    for (int k = 0; k < one.tap.n; k++) {
        const l10_draw *d = &one.tap.d[k];
        const uint8_t *full = one.all + one.starts[k];
        if (d->site != MC_GPT_DROPOUT_ATTENTION_PROBS) {
            for (int j = 0; j < tracker_off->tap.n; j++) {
                const l10_draw *t = &tracker_off->tap.d[j];
                if (t->site != d->site || t->layer != d->layer) continue;
                st->n_single_compared++;
                st->single_replicated_equal &=
                    t->seed == d->seed && t->offset == d->offset && t->n == d->n &&
                    memcmp(tracker_off->all + tracker_off->starts[j], full, d->n) == 0;
            }
        }
        /* shard 0 against shard r, as TP (sp: every region; no sp: the heads) would cut it */
        for (int sp = 0; sp < 2; sp++) {
            if (!l10_sharded(sp, d->site)) continue;
            size_t n_local = d->n / (size_t)st->tp;
            uint8_t *a = lab_xcalloc(n_local, 1), *b = lab_xcalloc(n_local, 1);
            for (size_t j = 0; j < n_local; j++) a[j] = full[l10_shard_index(st, d->site, 0, j)];
            for (int r = 1; r < st->tp; r++) {
                for (size_t j = 0; j < n_local; j++)
                    b[j] = full[l10_shard_index(st, d->site, r, j)];
                l10_stats_add(&st->single_halves[sp], a, b, n_local);
            }
            free(a);
            free(b);
        }
    }
    free(one.all);
}

static const char *l10_mark(int verdict, int sharded) {
    int want = sharded ? L10_DIFFERENT : L10_EQUAL;
    return verdict == want ? "" : " x";
}

static void l10_print_table(lab_ctx *cx, int sp) {
    l10_state *st = cx->state;
    lab_printf0("\nSP %s (%s)\n", sp ? "on" : "off",
                sp ? "the hidden activation is split along the sequence: [Ns, H] = [8, 16] "
                     "per rank"
                   : "the hidden activation is replicated over TP: [N, H] = [16, 16] on "
                     "every rank");
    lab_printf0("  %-25s %-17s %-19s %-12s %-16s %-14s\n", "region", "layout", "tracker stream",
                "tracker", "one global seed", "seed per rank");
    for (int s = 0; s < MC_GPT_DROPOUT_SITES; s++) {
        const l10_site_row *w = &st->rows[sp][s];
        char cell[L10_N_RULES][24];
        for (int r = 0; r < L10_N_RULES; r++)
            snprintf(cell[r], sizeof cell[r], "%s%s", l10_verdict[w->verdict[r]],
                     l10_mark(w->verdict[r], w->layout_sharded));
        lab_printf0("  %-25s %-17s %-19s %-12s %-16s %-14s\n", l10_site_title[s],
                    w->layout_sharded ? (s == MC_GPT_DROPOUT_ATTENTION_PROBS ? "sharded (heads)"
                                                                              : "sharded (seq)")
                                      : "replicated",
                    w->stream_mp ? MC_RNG_MODEL_PARALLEL : MC_RNG_DEFAULT, cell[0], cell[1],
                    cell[2]);
    }
}

static int l10_exp_masks(lab_ctx *cx) {
    l10_state *st = cx->state;
    MC_CHECK(mc_parallel_init(&st->ps, &(mc_parallel_desc){.world = cx->world,
                                                            .grid = cx->grid.desc}));
    st->have_ps = 1;
    st->tp = cx->grid.desc.tp;
    st->tp_rank = mc_parallel_rank(&st->ps, MC_GROUP_TP);
    st->n_hidden = L10_TOKENS * L10_HIDDEN;
    st->n_attn = L10_MBS * (L10_HEADS / st->tp) * L10_SEQ * L10_SEQ;
    st->seeds_ok = st->formula_ok = st->offsets_ok = 1;
    lab_heading(cx, "A. Dropout masks across the %d TP ranks (rank 0's mask vs each other "
                "rank's, every layer)", st->tp);
    lab_printf0("seeds: default generator %d on every TP rank; model-parallel-rng %d + %d + "
                "tp_rank; dropout p = %.1f\n", L10_SEED, L10_SEED, L10_MP_OFFSET, (double)L10_P);
    l10_pass keep_off;
    memset(&keep_off, 0, sizeof keep_off);
    for (int sp = 0; sp < 2; sp++) {
        for (int rule = 0; rule < L10_N_RULES; rule++) {
            l10_pass pass;
            l10_mask_pass(cx, st->tp, sp, rule, &pass);
            l10_summarise(cx, sp, rule, &pass);
            if (sp == 0 && rule == L10_TRACKER)
                keep_off = pass;
            else
                free(pass.all);
        }
    }
    l10_single_reference(cx, &keep_off);
    free(keep_off.all);
    int seed = (int)st->seen_mp_seed;
    MC_CHECK(lab_all_gather_i32(cx->world, &seed, st->mp_seeds, 1));
    for (int sp = 0; sp < 2; sp++) l10_print_table(cx, sp);
    lab_printf0("  (x: breaks the layout's rule: replicated regions need equal masks, sharded "
                "ones different masks)\n");

    double ind = l10_independent_agreement();
    lab_printf0("\nmask statistics, rank 0 vs the other ranks: agreement (both kept or both "
                "dropped) and positions dropped on both\n");
    lab_printf0("  independent masks: agreement 1-2p(1-p) = %.3f, dropped on both p^2 = %.3f; "
                "identical masks: 1.000 and p = %.3f\n", ind, (double)(L10_P * L10_P),
                (double)L10_P);
    for (int sp = 0; sp < 2; sp++) {
        lab_printf0("  sharded regions, SP %-3s single-rank run (its TP pieces) %.3f / %.3f",
                    sp ? "on" : "off", l10_frac(st->single_halves[sp].agree,
                                                st->single_halves[sp].pairs),
                    l10_frac(st->single_halves[sp].both_dropped, st->single_halves[sp].pairs));
        for (int r = 0; r < L10_N_RULES; r++)
            lab_printf0("; %s %.3f / %.3f", l10_rule_title[r],
                        l10_frac(st->sharded[sp][r].agree, st->sharded[sp][r].pairs),
                        l10_frac(st->sharded[sp][r].both_dropped, st->sharded[sp][r].pairs));
        lab_printf0("\n");
    }
    lab_printf0("  replicated regions, SP off:");
    for (int r = 0; r < L10_N_RULES; r++)
        lab_printf0("%s %s %.3f", r ? ";" : "", l10_rule_title[r],
                    l10_frac(st->replicated[r].agree, st->replicated[r].pairs));
    lab_printf0(" (agreement)\n");

    /* checks */
    int all[3] = {st->seeds_ok, st->formula_ok, st->offsets_ok}, min[3];
    MC_CHECK(lab_all_reduce_i32(cx->world, all, min, 3, MC_MIN));
    lab_check(cx, min[0], "every draw's seed follows Megatron's rule (%d; %d + %d + tp_rank)",
              L10_SEED, L10_SEED, L10_MP_OFFSET);
    lab_check(cx, min[1], "every mask the op table applied equals the Philox formula's "
              "(mc_rng_dropout_mask)");
    lab_check(cx, min[2], "every stream's offsets advance by the draw sizes rounded up to 4");
    int tracker_right = 1, one_seed_all_equal = 1, per_rank_all_different = 1;
    for (int sp = 0; sp < 2; sp++)
        for (int s = 0; s < MC_GPT_DROPOUT_SITES; s++) {
            const l10_site_row *w = &st->rows[sp][s];
            tracker_right &= w->verdict[L10_TRACKER] ==
                             (w->layout_sharded ? L10_DIFFERENT : L10_EQUAL);
            one_seed_all_equal &= w->verdict[L10_ONE_SEED] == L10_EQUAL;
            per_rank_all_different &= w->verdict[L10_PER_RANK] == L10_DIFFERENT;
        }
    lab_check(cx, tracker_right, "the tracker gives equal masks on every replicated region and "
              "different masks on every sharded one");
    lab_check(cx, one_seed_all_equal, "one global seed gives every region equal masks (the "
              "same stream and offsets on every rank)");
    lab_check(cx, per_rank_all_different, "a seed per rank gives every region different masks");
    lab_check(cx, st->single_replicated_equal && st->n_single_compared == 1 + 2 * L10_LAYERS,
              "the replicated regions drew exactly the single-rank run's masks (%d regions)",
              st->n_single_compared);
    int stats_ok = 1;
    for (int sp = 0; sp < 2; sp++) {
        stats_ok &= fabs(l10_frac(st->sharded[sp][L10_TRACKER].agree,
                                  st->sharded[sp][L10_TRACKER].pairs) - ind) < 0.08;
        stats_ok &= fabs(l10_frac(st->single_halves[sp].agree, st->single_halves[sp].pairs) -
                         ind) < 0.08;
        stats_ok &= st->sharded[sp][L10_ONE_SEED].agree == st->sharded[sp][L10_ONE_SEED].pairs;
    }
    lab_check(cx, stats_ok, "tracker shards and the single-rank run's pieces agree like "
              "independent masks (within 0.08 of %.3f); one global seed's shards agree "
              "everywhere", ind);
    lab_printf0("compared with: Megatron's seed rule, the Philox formula of every mask, the "
                "offsets from the draw sizes, the single-rank run's masks and the statistics "
                "of independent masks\n");
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   B. a training step under each rule, against the single-rank run */

/* Largest |grad| difference of every parameter shard against the same slice of the
   single-rank model's gradient (host copies of both flat buffers). */
static double l10_grad_diff_vs_single(const l10_state *st, const mc_gpt *g, const float *gg,
                                      const mc_gpt *one, const float *g1) {
    double worst = 0.0;
    for (int i = 0; i < g->table.count; i++) {
        const mc_param_info *p = &g->table.info[i];
        int j = mc_param_table_find(&one->table, p->name);
        if (j < 0) return INFINITY;
        const mc_param_info *q = &one->table.info[j];
        int rows = p->local_shape[0], cols = p->ndim == 2 ? p->local_shape[1] : 1;
        int gcols = q->ndim == 2 ? q->global_shape[1] : 1;
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) {
                size_t at;
                if (p->partition_dim == 0)
                    at = (size_t)(st->tp_rank * rows + r) * (size_t)gcols + (size_t)c;
                else if (p->partition_dim == 1)
                    at = (size_t)r * (size_t)gcols + (size_t)(st->tp_rank * cols + c);
                else
                    at = (size_t)r * (size_t)gcols + (size_t)c;
                double d = fabs((double)gg[p->offset + (size_t)r * cols + c] -
                                (double)g1[q->offset + at]);
                if (d > worst || d != d) worst = d != d ? INFINITY : d;
            }
    }
    return worst;
}

/* The global grad norm: TP-split parameters summed over the ranks, replicated ones once. */
static double l10_grad_norm(lab_ctx *cx, const mc_gpt *g, const float *gg, int tp_rank) {
    double mine = 0.0, all = 0.0;
    for (int i = 0; i < g->table.count; i++) {
        const mc_param_info *p = &g->table.info[i];
        if (p->partition_dim < 0 && tp_rank != 0) continue;
        for (size_t k = 0; k < p->numel; k++) mine += (double)gg[p->offset + k] * gg[p->offset + k];
    }
    if (g->tp == 1) return sqrt(mine);
    MC_CHECK(lab_all_reduce_f64(cx->world, &mine, &all, 1, MC_SUM));
    return sqrt(all);
}

/* max over replicated elements of (max over ranks - min over ranks) of the gradient */
static double l10_replica_spread(lab_ctx *cx, const mc_gpt *g, const float *gg) {
    size_t n = 0, k = 0;
    for (int i = 0; i < g->table.count; i++)
        if (g->table.info[i].partition_dim < 0) n += g->table.info[i].numel;
    double *v = lab_xcalloc(n, sizeof(double)), *hi = lab_xcalloc(n, sizeof(double)),
           *lo = lab_xcalloc(n, sizeof(double));
    for (int i = 0; i < g->table.count; i++) {
        const mc_param_info *p = &g->table.info[i];
        if (p->partition_dim >= 0) continue;
        for (size_t e = 0; e < p->numel; e++) v[k++] = gg[p->offset + e];
    }
    MC_CHECK(lab_all_reduce_f64(cx->world, v, hi, n, MC_MAX));
    MC_CHECK(lab_all_reduce_f64(cx->world, v, lo, n, MC_MIN));
    double spread = 0.0;
    for (size_t e = 0; e < n; e++) spread = fmax(spread, hi[e] - lo[e]);
    free(v);
    free(hi);
    free(lo);
    return spread;
}

static int l10_exp_training(lab_ctx *cx) {
    l10_state *st = cx->state;
    lab_heading(cx, "B. One training step under each rule, against the single-rank run "
                "(SP off, hidden dropout %.1f, attention dropout off)", (double)L10_P);
    l10_tap tap;
    mc_gpt one;
    l10_model m1 = {1, 0, 0.0f, L10_P, MC_RECOMPUTE_METHOD_NONE, 0};
    memset(&tap, 0, sizeof tap);
    l10_model_init(cx, &one, &m1, &tap);
    st->single_loss = l10_step(&one, 0, 1);
    float *g1 = l10_grads(&one);
    st->single_grad_norm = l10_grad_norm(cx, &one, g1, 0);
    lab_printf0("single-rank run: loss %.6f, grad norm %.6f\n", st->single_loss,
                st->single_grad_norm);
    lab_printf0("  %-16s %-10s %-14s %-22s %-10s %s\n", "rule", "loss", "|loss - single|",
                "max |grad - single|", "grad norm", "TP replicas' grads of replicated params");
    for (int rule = 0; rule < L10_N_RULES; rule++) {
        l10_train_row *w = &st->train[rule];
        mc_gpt g;
        l10_model m = {st->tp, 0, 0.0f, L10_P, MC_RECOMPUTE_METHOD_NONE, 0};
        memset(&tap, 0, sizeof tap);
        l10_model_init(cx, &g, &m, &tap);
        mc_fault_dropout_stream(l10_rule_stream[rule]);
        w->loss = l10_step(&g, 0, 1);
        mc_fault_dropout_stream(NULL);
        float *gg = l10_grads(&g);
        double mine = l10_grad_diff_vs_single(st, &g, gg, &one, g1);
        MC_CHECK(lab_all_reduce_f64(cx->world, &mine, &w->grad_max_diff, 1, MC_MAX));
        w->loss_rel = fabs(w->loss - st->single_loss) / fabs(st->single_loss);
        w->grad_norm = l10_grad_norm(cx, &g, gg, st->tp_rank);
        w->replica_diff = l10_replica_spread(cx, &g, gg);
        w->replicas_agree = w->replica_diff == 0.0;
        w->matches = w->loss_rel <= L10_LOSS_RTOL && w->grad_max_diff <= L10_GRAD_ATOL;
        lab_printf0("  %-16s %-10.6f %-14.2g %-22.2g %-10.6f %s (largest spread %.2g)\n",
                    l10_rule_title[rule], w->loss, fabs(w->loss - st->single_loss),
                    w->grad_max_diff, w->grad_norm, w->replicas_agree ? "identical" : "DIFFER",
                    w->replica_diff);
        free(gg);
        mc_gpt_destroy(&g);
    }
    free(g1);
    mc_gpt_destroy(&one);
    const l10_train_row *t = st->train;
    lab_printf0("matches the single-rank run (loss within %.0e relative, every grad within "
                "%.0e): tracker %s, one global seed %s, seed per rank %s\n", L10_LOSS_RTOL,
                L10_GRAD_ATOL, t[0].matches ? "yes" : "no", t[1].matches ? "yes" : "no",
                t[2].matches ? "yes" : "no");
    lab_printf0("(here every dropout acts on a replicated activation, so one global seed is "
                "harmless; its damage is in the sharded regions of A, which no single-run "
                "comparison shows: the shards drop the same positions)\n");
    lab_check(cx, t[L10_TRACKER].matches && t[L10_TRACKER].replicas_agree,
              "the tracker run equals the single-rank run and its TP replicas agree exactly");
    lab_check(cx, t[L10_ONE_SEED].matches, "one global seed equals the single-rank run when "
              "every dropout is on a replicated activation");
    lab_check(cx, !t[L10_PER_RANK].matches && !t[L10_PER_RANK].replicas_agree,
              "a seed per rank departs from the single-rank run and splits the replicas");
    lab_check(cx, fabs(t[L10_TRACKER].grad_norm - st->single_grad_norm) <=
                      1e-5 * st->single_grad_norm,
              "the tracker run's global grad norm equals the single-rank one");
    lab_printf0("compared with: the single-rank run of the same model and batch (every "
                "gradient against its slice), and the TP replicas with each other\n");
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   C. recompute and the RNG */

static void l10_groups(l10_state *st) {
    const l10_variant *v = st->variant;
    st->n_groups = 0;
    if (v->method == MC_RECOMPUTE_BLOCK) {
        for (int l = 0; l < v->num_layers; l++) {
            st->groups[st->n_groups][0] = l;
            st->groups[st->n_groups++][1] = 1;
        }
    } else {
        for (int l = 0; l < L10_LAYERS; l += v->num_layers) {
            st->groups[st->n_groups][0] = l;
            st->groups[st->n_groups++][1] =
                l + v->num_layers <= L10_LAYERS ? v->num_layers : L10_LAYERS - l;
        }
    }
}

static int l10_recomputed(const l10_state *st, int layer) {
    for (int g = 0; g < st->n_groups; g++)
        if (layer >= st->groups[g][0] && layer < st->groups[g][0] + st->groups[g][1]) return 1;
    return 0;
}

/* Is [off, off + n) of `seed` inside a forward draw of `tap`? */
static int l10_overlaps(const l10_tap *tap, uint64_t seed, uint64_t off, size_t n) {
    for (int k = 0; k < tap->n; k++) {
        const l10_draw *d = &tap->d[k];
        if (d->replay || d->seed != seed) continue;
        if (off < d->offset + d->n && d->offset < off + n) return 1;
    }
    return 0;
}

typedef struct l10_rc_pass {
    l10_tap it1, it2;
    float *grads;
} l10_rc_pass;

static void l10_rc_run(lab_ctx *cx, int mode, l10_rc_pass *pass, l10_rc_row *w) {
    l10_state *st = cx->state;
    mc_gpt g;
    l10_model m = {st->tp, 0, L10_P, L10_P, st->variant->method,
                   mode == L10_RC_NONE ? 0 : st->variant->num_layers};
    memset(pass, 0, sizeof *pass);
    l10_model_init(cx, &g, &m, &pass->it1);
    mc_fault_recompute_rng(l10_rc_fault[mode]);
    w->loss = l10_step(&g, 0, 1);
    mc_fault_recompute_rng(0);
    l10_offsets(&g, &w->def_after, &w->mp_after);
    pass->grads = l10_grads(&g);
    g.dropout_drawn_user = &pass->it2;
    MC_CHECK(mc_gpt_zero_grad(&g));
    l10_step(&g, 1, 0);   /* iteration 2's forward: what it draws */
    if (pass->it1.overflow || pass->it2.overflow) MC_CHECK(MC_ERR_STATE);
    mc_gpt_destroy(&g);
}

/* A mode's run against the reference run: gradients (per layer; the embedding apart), the
   replay's draws, the offsets and iteration 2's draws. `table` is the runs' parameter table. */
static void l10_rc_compare(lab_ctx *cx, const mc_param_table *table, const l10_rc_pass *ref,
                           const l10_rc_pass *pass, const l10_rc_row *r0, l10_rc_row *w) {
    double err = 0.0;
    int flags[L10_LAYERS + 1] = {0}, any[L10_LAYERS + 1];   /* [L10_LAYERS]: the embedding */
    for (int i = 0; i < table->count; i++) {
        const mc_param_info *p = &table->info[i];
        int slot = p->layer >= 0 ? p->layer : strstr(p->name, "embedding") ? L10_LAYERS : -1;
        for (size_t k = 0; k < p->numel; k++) {
            float a = pass->grads[p->offset + k], b = ref->grads[p->offset + k];
            err = fmax(err, fabs((double)a - (double)b));
            if (a != b && slot >= 0) flags[slot] = 1;
        }
    }
    MC_CHECK(lab_all_reduce_f64(cx->world, &err, &w->grad_err, 1, MC_MAX));
    MC_CHECK(lab_all_reduce_i32(cx->world, flags, any, L10_LAYERS + 1, MC_MAX));
    for (int l = 0; l < L10_LAYERS; l++) w->wrong[l] = any[l];
    w->emb_wrong = any[L10_LAYERS];
    w->grad_zero = w->grad_err == 0.0;
    w->loss_equal = w->loss == r0->loss;
    /* the replay's draws against the forward's of the same region */
    w->replay_equal = 1;
    w->n_replays = 0;
    w->first_replay_offset = 0;
    int seen_first = 0;
    for (int k = 0; k < pass->it1.n; k++) {
        const l10_draw *d = &pass->it1.d[k];
        if (!d->replay) continue;
        w->n_replays++;
        if (!seen_first && !d->mp) {
            w->first_replay_offset = d->offset;
            seen_first = 1;
        }
        for (int j = 0; j < pass->it1.n; j++) {
            const l10_draw *f = &pass->it1.d[j];
            if (!f->replay && f->site == d->site && f->layer == d->layer)
                w->replay_equal &= f->seed == d->seed && f->offset == d->offset;
        }
    }
    w->def_shift = (long long)w->def_after - (long long)r0->def_after;
    w->mp_shift = (long long)w->mp_after - (long long)r0->mp_after;
    /* iteration 2: the reference's draws, earlier masks again, or other masks */
    int same = pass->it2.n == ref->it2.n, repeats = 0;
    for (int k = 0; k < pass->it2.n; k++) {
        const l10_draw *d = &pass->it2.d[k];
        if (same) same = d->seed == ref->it2.d[k].seed && d->offset == ref->it2.d[k].offset;
        repeats += l10_overlaps(&pass->it1, d->seed, d->offset, d->n);
    }
    int mine[2] = {same, repeats}, lo[2], hi[2];
    MC_CHECK(lab_all_reduce_i32(cx->world, mine, lo, 2, MC_MIN));
    MC_CHECK(lab_all_reduce_i32(cx->world, mine, hi, 2, MC_MAX));
    w->repeats = hi[1];
    w->later = lo[0] ? 0 : hi[1] > 0 ? 2 : 1;
}

static const char *const l10_later_key[3] = {"same", "shifted", "repeats"};

static void l10_layers_text(const int *flags, int emb, char *out, size_t cap) {
    size_t used = (size_t)snprintf(out, cap, "[");
    int first = 1;
    for (int l = 0; l < L10_LAYERS && used + 8 < cap; l++)
        if (flags[l]) {
            used += (size_t)snprintf(out + used, cap - used, "%s%d", first ? "" : ",", l);
            first = 0;
        }
    snprintf(out + used, cap - used, "]%s", emb ? " + embedding" : "");
}

static int l10_exp_recompute(lab_ctx *cx) {
    l10_state *st = cx->state;
    st->variant = &l10_variants[cx->variant - 1];
    l10_groups(st);
    lab_heading(cx, "C. Full recompute and the RNG (%s; SP off, dropout %.1f everywhere)",
                st->variant->text, (double)L10_P);
    /* the formula: one iteration draws (1 + 2L) hidden masks and L attention masks */
    st->formula_def_end = (uint64_t)(1 + 2 * L10_LAYERS) * l10_round4((size_t)st->n_hidden);
    st->formula_mp_end = (uint64_t)L10_LAYERS * l10_round4((size_t)st->n_attn);
    static l10_rc_pass pass[L10_N_RC];
    for (int mode = 0; mode < L10_N_RC; mode++) l10_rc_run(cx, mode, &pass[mode], &st->rc[mode]);
    mc_gpt shape;   /* the parameter table every run shares */
    l10_tap unused;
    l10_model m = {st->tp, 0, L10_P, L10_P, MC_RECOMPUTE_METHOD_NONE, 0};
    memset(&unused, 0, sizeof unused);
    l10_model_init(cx, &shape, &m, &unused);
    for (int mode = 0; mode < L10_N_RC; mode++)
        l10_rc_compare(cx, &shape.table, &pass[L10_RC_NONE], &pass[mode], &st->rc[L10_RC_NONE],
                       &st->rc[mode]);
    mc_gpt_destroy(&shape);
    lab_printf0("one iteration draws: default generator %d hidden masks of %d = offset %llu; "
                "model-parallel-rng %d attention masks of %d = offset %llu\n",
                1 + 2 * L10_LAYERS, st->n_hidden, (unsigned long long)st->formula_def_end,
                L10_LAYERS, st->n_attn, (unsigned long long)st->formula_mp_end);
    lab_printf0("  %-38s %-9s %-10s %-22s %-9s %-19s %s\n", "mode", "loss", "grad error",
                "wrong grads (layers)", "replay", "offsets after (shift)", "iteration 2 draws");
    for (int mode = 0; mode < L10_N_RC; mode++) {
        const l10_rc_row *w = &st->rc[mode];
        char layers[64], off[48], replay[16];
        l10_layers_text(w->wrong, w->emb_wrong, layers, sizeof layers);
        snprintf(off, sizeof off, "%llu/%llu (%+lld/%+lld)", (unsigned long long)w->def_after,
                 (unsigned long long)w->mp_after, w->def_shift, w->mp_shift);
        snprintf(replay, sizeof replay, "%s", mode == L10_RC_NONE ? "-"
                                              : w->replay_equal ? "same" : "other");
        lab_printf0("  %-38s %-9.6f %-10.3g %-22s %-9s %-19s %s\n", l10_rc_title[mode], w->loss,
                    w->grad_err, layers, replay, off, l10_later_key[w->later]);
    }
    lab_printf0("  (replay: masks the replay drew vs the forward's; offsets: default / "
                "model-parallel after backward)\n");

    /* the expectations from the draw sizes and the groups */
    const l10_rc_row *r = st->rc;
    int n_rec = 0, lowest_end = st->groups[0][0] + st->groups[0][1],
        top_first = st->groups[st->n_groups - 1][0];
    for (int l = 0; l < L10_LAYERS; l++) n_rec += l10_recomputed(st, l);
    long long h = (long long)l10_round4((size_t)st->n_hidden),
              a = (long long)l10_round4((size_t)st->n_attn);
    long long want_def_shift = 2LL * n_rec * h, want_mp_shift = (long long)n_rec * a;
    long long want_rewind_def =
        (long long)(1 + 2 * lowest_end) * h - (long long)st->formula_def_end;
    long long want_rewind_mp = (long long)lowest_end * a - (long long)st->formula_mp_end;
    lab_check(cx, r[L10_RC_NONE].def_after == st->formula_def_end &&
                      r[L10_RC_NONE].mp_after == st->formula_mp_end,
              "the reference's offsets equal the draw count times the draw size");
    lab_check(cx, r[L10_RC_BOTH].grad_zero && r[L10_RC_BOTH].replay_equal &&
                      r[L10_RC_BOTH].def_shift == 0 && r[L10_RC_BOTH].mp_shift == 0 &&
                      r[L10_RC_BOTH].later == 0,
              "with the RNG handled the gradients are bit-identical and the streams end where "
              "the reference's do");
    lab_check(cx, !r[L10_RC_NO_RESTORE].grad_zero && !r[L10_RC_OUTER_ONLY].grad_zero &&
                      r[L10_RC_SNAPSHOT_ONLY].grad_zero,
              "the gradients are wrong exactly when the snapshot is not restored");
    int loss_same = 1;
    for (int mode = 0; mode < L10_N_RC; mode++) loss_same &= r[mode].loss_equal;
    lab_check(cx, loss_same, "the loss is the same in every mode (recompute only changes "
              "backward)");
    int layers_ok = 1;
    for (int l = 0; l < L10_LAYERS; l++)
        layers_ok &= r[L10_RC_NO_RESTORE].wrong[l] == (l < st->groups[st->n_groups - 1][0] +
                                                            st->groups[st->n_groups - 1][1]);
    lab_check(cx, layers_ok && r[L10_RC_NO_RESTORE].emb_wrong,
              "without the snapshot the recomputed layers and every layer below them get "
              "wrong gradients, the layers above stay exact");
    lab_check(cx, r[L10_RC_NO_RESTORE].def_shift == want_def_shift &&
                      r[L10_RC_NO_RESTORE].mp_shift == want_mp_shift,
              "without any RNG handling the streams end ahead by the replayed draws (%+lld / "
              "%+lld)", want_def_shift, want_mp_shift);
    lab_check(cx, r[L10_RC_SNAPSHOT_ONLY].def_shift == want_rewind_def &&
                      r[L10_RC_SNAPSHOT_ONLY].mp_shift == want_rewind_mp &&
                      r[L10_RC_SNAPSHOT_ONLY].later == 2,
              "without the outer restore the streams end where the lowest group's replay left "
              "them (%+lld / %+lld) and iteration 2 redraws used masks", want_rewind_def,
              want_rewind_mp);
    lab_check(cx, r[L10_RC_OUTER_ONLY].def_shift == 0 && r[L10_RC_OUTER_ONLY].later == 0 &&
                      r[L10_RC_NO_RESTORE].later == 1,
              "restoring the outer progress keeps iteration 2's draws; without it they shift");
    lab_check(cx, r[L10_RC_BOTH].first_replay_offset == (uint64_t)((1 + 2 * top_first) * h) &&
                      r[L10_RC_NO_RESTORE].first_replay_offset == st->formula_def_end,
              "the first replay draws at its forward's offset with the snapshot, at the end of "
              "the forward without it");
    lab_printf0("compared with: the no-recompute run (gradients bit for bit, iteration 2's "
                "draws), and the offsets computed from the draw sizes and the recompute "
                "groups\n");
    for (int mode = 0; mode < L10_N_RC; mode++) free(pass[mode].grads);
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   D. checkpoint and resume */

static mc_checkpoint_desc l10_ckpt_desc(l10_state *st, mc_gpt *g) {
    mc_checkpoint_desc d;
    memset(&d, 0, sizeof d);
    d.dir = st->ck_dir;
    d.ps = &st->ps;
    d.config = &g->config;
    d.params = &g->table;
    d.param_data = (float *)g->params;
    d.ops = g->ops;
    d.rng = &g->rng;
    d.iteration = 1;
    return d;
}

/* Iteration 1 and a plain SGD step (batch 0): the state a checkpoint after it holds. */
static void l10_iteration1(mc_gpt *g) {
    l10_step(g, 0, 1);
    MC_CHECK(g->ops->axpy(g->ops, g->params, -L10_LR, g->grads, g->table.total, MC_F32));
    MC_CHECK(mc_gpt_zero_grad(g));
}

static const char *const l10_ck_key[3] = {"uninterrupted", "rng_loaded", "no_load_rng"};
static const char *const l10_ck_masks[3] = {"same", "shifted", "repeats"};

static int l10_exp_checkpoint(lab_ctx *cx) {
    l10_state *st = cx->state;
    const char *res = cx->args->results_path;
    size_t n = strlen(res);
    if (n > 5 && strcmp(res + n - 5, ".json") == 0) n -= 5;
    snprintf(st->ck_dir, sizeof st->ck_dir, "%.*s.ckpt", (int)n, res);
    lab_heading(cx, "D. Checkpoint after iteration 1, resume, iteration 2 (TP %d, SP off, "
                "dropout %.1f)", st->tp, (double)L10_P);
    static l10_tap t1, t2[3];
    float *grads[3];
    size_t total = 0;
    l10_model m = {st->tp, 0, L10_P, L10_P, MC_RECOMPUTE_METHOD_NONE, 0};
    for (int run = 0; run < 3; run++) {
        mc_gpt g;
        l10_tap scratch;
        memset(&scratch, 0, sizeof scratch);
        memset(&t2[run], 0, sizeof t2[run]);
        if (run < 2) {
            if (run == 0) memset(&t1, 0, sizeof t1);
            l10_model_init(cx, &g, &m, run == 0 ? &t1 : &scratch);
            l10_iteration1(&g);
        }
        if (run == 1) {   /* save, then resume in a new model */
            mc_checkpoint_desc d = l10_ckpt_desc(st, &g);
            MC_CHECK(mc_checkpoint_save(&d));
            mc_gpt_destroy(&g);
        }
        if (run > 0) {    /* a fresh model: its tracker as mc_gpt_init seeded it */
            l10_model_init(cx, &g, &m, &scratch);
            mc_checkpoint_desc d = l10_ckpt_desc(st, &g);
            mc_checkpoint_result cr;
            MC_CHECK(mc_checkpoint_load(&d, run == 2 ? MC_CKPT_LOAD_NO_RNG : 0, &cr));
            st->ck_rng_restored[run] = cr.rng_restored;
        }
        g.dropout_drawn_user = &t2[run];
        st->ck_loss2[run] = l10_step(&g, 1, 1);
        grads[run] = l10_grads(&g);
        total = g.table.total;
        mc_gpt_destroy(&g);
    }
    for (int run = 0; run < 3; run++) {
        double d = 0.0;
        for (size_t k = 0; k < total; k++) d = fmax(d, fabs((double)grads[run][k] - grads[0][k]));
        MC_CHECK(lab_all_reduce_f64(cx->world, &d, &st->ck_grad_diff[run], 1, MC_MAX));
        /* iteration 2's draws: the uninterrupted run's, or iteration 1's again */
        int same = t2[run].n == t2[0].n, repeat = t2[run].n == t1.n;
        for (int k = 0; k < t2[run].n; k++) {
            const l10_draw *x = &t2[run].d[k];
            if (same) same = x->seed == t2[0].d[k].seed && x->offset == t2[0].d[k].offset;
            if (repeat) repeat = x->seed == t1.d[k].seed && x->offset == t1.d[k].offset;
        }
        int mine[2] = {same, repeat}, all[2];
        MC_CHECK(lab_all_reduce_i32(cx->world, mine, all, 2, MC_MIN));
        st->ck_masks[run] = all[0] ? 0 : all[1] ? 2 : 1;
    }
    for (int run = 0; run < 3; run++) free(grads[run]);
    /* what the checkpoint holds for TP rank 0 */
    char path[700];
    snprintf(path, sizeof path, "%s/iter_0000001/rng_pp000_tp00.txt", st->ck_dir);
    char *text = cx->me == 0 ? lab_read_text(path, NULL) : NULL;
    snprintf(st->ck_rng_text, sizeof st->ck_rng_text, "%s", text ? text : "");
    free(text);
    lab_printf0("the checkpoint's RNG states of TP rank 0 (%s):\n", path);
    for (const char *line = st->ck_rng_text, *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        lab_printf0("    %.*s\n", nl ? (int)(nl - line) : (int)strlen(line), line);
    }
    static const char *const what[3] = {"uninterrupted", "resumed, RNG loaded",
                                        "resumed, --no-load-rng"};
    static const char *const masks[3] = {"the uninterrupted run's masks", "other masks",
                                         "iteration 1's masks again"};
    lab_printf0("  %-24s %-12s %-24s %s\n", "run", "loss it. 2", "max |grad - uninterr.|",
                "iteration 2 drew");
    for (int run = 0; run < 3; run++)
        lab_printf0("  %-24s %-12.6f %-24.3g %s\n", what[run], st->ck_loss2[run],
                    st->ck_grad_diff[run], masks[st->ck_masks[run]]);
    lab_check(cx, st->ck_rng_restored[1] && st->ck_loss2[1] == st->ck_loss2[0] &&
                      st->ck_grad_diff[1] == 0.0 && st->ck_masks[1] == 0,
              "resuming with the saved RNG states repeats the uninterrupted iteration 2 bit "
              "for bit");
    lab_check(cx, !st->ck_rng_restored[2] && st->ck_loss2[2] != st->ck_loss2[0] &&
                      st->ck_masks[2] == 2,
              "resuming without them redraws iteration 1's masks and changes iteration 2");
    lab_printf0("compared with: the uninterrupted run (loss, every gradient, every draw) and "
                "iteration 1's draws\n");
    return LAB_RAN;
}

/* ---------------------------------------------------------------------------------------------
   facts */

static cJSON *l10_verdicts(const l10_state *st, int sp, int rule) {
    cJSON *o = cJSON_CreateObject();
    for (int s = 0; s < MC_GPT_DROPOUT_SITES; s++)
        cJSON_AddStringToObject(o, l10_site_key[s], l10_verdict[st->rows[sp][s].verdict[rule]]);
    return o;
}

static cJSON *l10_stats_json(const l10_stats *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "pairs", (double)s->pairs);
    cJSON_AddNumberToObject(o, "agreement", round(l10_frac(s->agree, s->pairs) * 1e4) / 1e4);
    cJSON_AddNumberToObject(o, "dropped_on_both",
                            round(l10_frac(s->both_dropped, s->pairs) * 1e4) / 1e4);
    return o;
}

static cJSON *l10_layers_json(const int *flags) {
    int v[L10_LAYERS], n = 0;
    for (int l = 0; l < L10_LAYERS; l++)
        if (flags[l]) v[n++] = l;
    return n > 0 ? lab_json_int_array(v, n) : cJSON_CreateArray();
}

static cJSON *l10_masks_json(const l10_state *st) {
    cJSON *masks = cJSON_CreateObject();
    for (int sp = 0; sp < 2; sp++) {
        cJSON *o = cJSON_AddObjectToObject(masks, sp ? "sp_on" : "sp_off");
        cJSON *lay = cJSON_AddObjectToObject(o, "layout");
        cJSON *req = cJSON_AddObjectToObject(o, "required");
        cJSON *str = cJSON_AddObjectToObject(o, "tracker_stream");
        int wrong[L10_N_RULES] = {0};
        for (int s = 0; s < MC_GPT_DROPOUT_SITES; s++) {
            const l10_site_row *w = &st->rows[sp][s];
            cJSON_AddStringToObject(lay, l10_site_key[s],
                                    w->layout_sharded ? "sharded" : "replicated");
            cJSON_AddStringToObject(req, l10_site_key[s],
                                    w->layout_sharded ? "different" : "equal");
            cJSON_AddStringToObject(str, l10_site_key[s], w->stream_mp ? MC_RNG_MODEL_PARALLEL
                                                                       : MC_RNG_DEFAULT);
            for (int r = 0; r < L10_N_RULES; r++)
                wrong[r] += w->verdict[r] != (w->layout_sharded ? L10_DIFFERENT : L10_EQUAL);
        }
        cJSON *wr = cJSON_AddObjectToObject(o, "wrong_regions");
        for (int r = 0; r < L10_N_RULES; r++) {
            cJSON_AddItemToObject(o, l10_rule_key[r], l10_verdicts(st, sp, r));
            cJSON_AddNumberToObject(wr, l10_rule_key[r], wrong[r]);
        }
        cJSON *stats = cJSON_AddObjectToObject(o, "sharded_statistics");
        cJSON_AddItemToObject(stats, "single_rank_pieces", l10_stats_json(&st->single_halves[sp]));
        for (int r = 0; r < L10_N_RULES; r++)
            cJSON_AddItemToObject(stats, l10_rule_key[r], l10_stats_json(&st->sharded[sp][r]));
    }
    cJSON *rep = cJSON_AddObjectToObject(masks, "replicated_statistics_sp_off");
    for (int r = 0; r < L10_N_RULES; r++)
        cJSON_AddItemToObject(rep, l10_rule_key[r], l10_stats_json(&st->replicated[r]));
    cJSON_AddNumberToObject(masks, "independent_agreement",
                            round(l10_independent_agreement() * 1e4) / 1e4);
    cJSON_AddNumberToObject(masks, "independent_dropped_on_both",
                            round((double)(L10_P * L10_P) * 1e4) / 1e4);
    cJSON_AddBoolToObject(masks, "replicated_equal_single_rank", st->single_replicated_equal);
    return masks;
}

static cJSON *l10_facts(lab_ctx *cx) {
    l10_state *st = cx->state;
    cJSON *f = cJSON_CreateObject();
    cJSON *lay = cJSON_AddObjectToObject(f, "layout");
    cJSON_AddNumberToObject(lay, "world", cx->world_size);
    cJSON_AddNumberToObject(lay, "tp", st->tp);
    cJSON *mod = cJSON_AddObjectToObject(f, "model");
    cJSON_AddNumberToObject(mod, "num_layers", L10_LAYERS);
    cJSON_AddNumberToObject(mod, "hidden_size", L10_HIDDEN);
    cJSON_AddNumberToObject(mod, "num_attention_heads", L10_HEADS);
    cJSON_AddNumberToObject(mod, "seq_length", L10_SEQ);
    cJSON_AddNumberToObject(mod, "micro_batch_size", L10_MBS);
    cJSON_AddNumberToObject(mod, "dropout", round((double)L10_P * 100) / 100);
    cJSON_AddNumberToObject(mod, "seed", L10_SEED);
    cJSON_AddNumberToObject(mod, "hidden_draw_elements", st->n_hidden);
    cJSON_AddNumberToObject(mod, "attention_draw_elements_per_rank", st->n_attn);
    cJSON *seeds = cJSON_AddObjectToObject(f, "seeds");
    cJSON_AddNumberToObject(seeds, "default_rng", (double)st->seen_default_seed);
    cJSON_AddItemToObject(seeds, "model_parallel_rng", lab_json_int_array(st->mp_seeds, st->tp));
    cJSON_AddBoolToObject(seeds, "follow_megatron_rule", st->seeds_ok);
    cJSON_AddStringToObject(seeds, "seeded_by", "mc_rng_tracker_seed_megatron in mc_gpt_init "
                            "(model_parallel_cuda_manual_seed), not by mc_parallel_init");
    cJSON_AddItemToObject(f, "masks", l10_masks_json(st));

    cJSON *tr = cJSON_AddObjectToObject(f, "training");
    cJSON_AddNumberToObject(tr, "single_rank_loss", round(st->single_loss * 1e6) / 1e6);
    cJSON_AddNumberToObject(tr, "single_rank_grad_norm", round(st->single_grad_norm * 1e6) / 1e6);
    cJSON *ms = cJSON_AddObjectToObject(tr, "matches_single_rank"),
          *ra = cJSON_AddObjectToObject(tr, "replicas_agree");
    for (int r = 0; r < L10_N_RULES; r++) {
        const l10_train_row *w = &st->train[r];
        cJSON *o = cJSON_AddObjectToObject(tr, l10_rule_key[r]);
        cJSON_AddNumberToObject(o, "loss", round(w->loss * 1e6) / 1e6);
        cJSON_AddNumberToObject(o, "loss_abs_diff", fabs(w->loss - st->single_loss));
        cJSON_AddNumberToObject(o, "grad_max_abs_diff", w->grad_max_diff);
        cJSON_AddNumberToObject(o, "grad_norm", round(w->grad_norm * 1e6) / 1e6);
        cJSON_AddNumberToObject(o, "replica_grad_spread", w->replica_diff);
        cJSON_AddBoolToObject(ms, l10_rule_key[r], w->matches);
        cJSON_AddBoolToObject(ra, l10_rule_key[r], w->replicas_agree);
    }

    cJSON *rc = cJSON_AddObjectToObject(f, "recompute");
    cJSON_AddStringToObject(rc, "variant", cx->variant_name);
    cJSON_AddStringToObject(rc, "layers_checkpointed", st->variant->text);
    cJSON *grp = cJSON_AddArrayToObject(rc, "groups");
    for (int g = 0; g < st->n_groups; g++) {
        int v[L10_LAYERS], k = 0;
        for (int l = st->groups[g][0]; l < st->groups[g][0] + st->groups[g][1]; l++) v[k++] = l;
        cJSON_AddItemToArray(grp, lab_json_int_array(v, k));
    }
    cJSON_AddNumberToObject(rc, "default_offset_per_iteration", (double)st->formula_def_end);
    cJSON_AddNumberToObject(rc, "model_parallel_offset_per_iteration", (double)st->formula_mp_end);
    cJSON *gz = cJSON_AddObjectToObject(rc, "grad_error_zero"),
          *lr = cJSON_AddObjectToObject(rc, "later_randomness"),
          *modes = cJSON_AddObjectToObject(rc, "modes");
    for (int mode = 0; mode < L10_N_RC; mode++) {
        const l10_rc_row *w = &st->rc[mode];
        cJSON *o = cJSON_AddObjectToObject(modes, l10_rc_key[mode]);
        cJSON_AddStringToObject(o, "title", l10_rc_title[mode]);
        cJSON_AddNumberToObject(o, "loss", round(w->loss * 1e6) / 1e6);
        cJSON_AddBoolToObject(o, "loss_equal_reference", w->loss_equal);
        cJSON_AddNumberToObject(o, "grad_max_abs_error", w->grad_err);
        cJSON_AddItemToObject(o, "wrong_grad_layers", l10_layers_json(w->wrong));
        cJSON_AddBoolToObject(o, "embedding_grad_wrong", w->emb_wrong);
        cJSON_AddNumberToObject(o, "replayed_draws", w->n_replays);
        if (mode != L10_RC_NONE) {
            cJSON_AddBoolToObject(o, "replay_masks_equal_forward", w->replay_equal);
            cJSON_AddNumberToObject(o, "first_replay_default_offset",
                                    (double)w->first_replay_offset);
        }
        cJSON_AddNumberToObject(o, "default_offset_after", (double)w->def_after);
        cJSON_AddNumberToObject(o, "model_parallel_offset_after", (double)w->mp_after);
        cJSON_AddNumberToObject(o, "default_offset_shift", (double)w->def_shift);
        cJSON_AddNumberToObject(o, "model_parallel_offset_shift", (double)w->mp_shift);
        cJSON_AddStringToObject(o, "later_randomness", l10_later_key[w->later]);
        cJSON_AddNumberToObject(o, "iteration2_draws_repeating_iteration1", w->repeats);
        if (mode != L10_RC_NONE) {
            cJSON_AddBoolToObject(gz, l10_rc_key[mode], w->grad_zero);
            cJSON_AddStringToObject(lr, l10_rc_key[mode], l10_later_key[w->later]);
        }
    }

    cJSON *ck = cJSON_AddObjectToObject(f, "checkpoint");
    cJSON_AddStringToObject(ck, "dir", st->ck_dir);
    cJSON_AddStringToObject(ck, "rng_file_tp0", st->ck_rng_text);
    cJSON *eq = cJSON_AddObjectToObject(ck, "resume_equal");
    for (int run = 0; run < 3; run++) {
        cJSON *o = cJSON_AddObjectToObject(ck, l10_ck_key[run]);
        cJSON_AddNumberToObject(o, "loss_iteration2", round(st->ck_loss2[run] * 1e6) / 1e6);
        cJSON_AddNumberToObject(o, "grad_max_abs_diff", st->ck_grad_diff[run]);
        cJSON_AddStringToObject(o, "iteration2_masks", l10_ck_masks[st->ck_masks[run]]);
        if (run > 0) {
            cJSON_AddBoolToObject(o, "rng_restored", st->ck_rng_restored[run]);
            cJSON_AddBoolToObject(eq, l10_ck_key[run], st->ck_loss2[run] == st->ck_loss2[0] &&
                                                       st->ck_grad_diff[run] == 0.0);
        }
    }
    cJSON_AddStringToObject(ck, "no_load_rng_masks", l10_ck_masks[st->ck_masks[2]]);

    const l10_rc_row *nr = &st->rc[L10_RC_NO_RESTORE];
    cJSON *fu = cJSON_AddObjectToObject(f, "followup");
    cJSON_AddStringToObject(fu, "variant", cx->variant_name);
    cJSON_AddStringToObject(fu, "layers_checkpointed", st->variant->text);
    cJSON_AddItemToObject(fu, "wrong_grad_layers", l10_layers_json(nr->wrong));
    cJSON_AddBoolToObject(fu, "loss_changes", !nr->loss_equal);
    cJSON_AddNumberToObject(fu, "replay_offset_restored",
                            (double)st->rc[L10_RC_BOTH].first_replay_offset);
    cJSON_AddNumberToObject(fu, "replay_offset_unrestored", (double)nr->first_replay_offset);
    cJSON_AddNumberToObject(fu, "shift_no_restore", (double)nr->def_shift);
    cJSON_AddNumberToObject(fu, "shift_no_outer", (double)st->rc[L10_RC_SNAPSHOT_ONLY].def_shift);
    return f;
}

/* The closing summary: the mask table in one line per SP setting and the recompute errors. */
static void l10_report(lab_ctx *cx) {
    l10_state *st = cx->state;
    lab_printf0("\n== Summary ==\n");
    for (int sp = 0; sp < 2; sp++) {
        lab_printf0("masks SP %-3s (tracker / one seed / seed per rank):", sp ? "on" : "off");
        for (int s = 0; s < MC_GPT_DROPOUT_SITES; s++) {
            const l10_site_row *w = &st->rows[sp][s];
            lab_printf0("  %s %s/%s/%s", l10_site_key[s], l10_verdict[w->verdict[0]],
                        l10_verdict[w->verdict[1]], l10_verdict[w->verdict[2]]);
        }
        lab_printf0("\n");
    }
    lab_printf0("recompute grad error vs no recompute: with RNG restore %.3g, without %.3g "
                "(snapshot only %.3g, outer only %.3g); default-stream shift after: %+lld / "
                "%+lld / %+lld / %+lld\n",
                st->rc[L10_RC_BOTH].grad_err, st->rc[L10_RC_NO_RESTORE].grad_err,
                st->rc[L10_RC_SNAPSHOT_ONLY].grad_err, st->rc[L10_RC_OUTER_ONLY].grad_err,
                st->rc[L10_RC_BOTH].def_shift, st->rc[L10_RC_NO_RESTORE].def_shift,
                st->rc[L10_RC_SNAPSHOT_ONLY].def_shift, st->rc[L10_RC_OUTER_ONLY].def_shift);
}

static void l10_cleanup(lab_ctx *cx) {
    l10_state *st = cx->state;
    if (st->have_ps) MC_CHECK(mc_parallel_destroy(&st->ps));
    st->have_ps = 0;
}

static const lab_experiment l10_experiments[] = {{"A", l10_exp_masks},
                                                 {"B", l10_exp_training},
                                                 {"C", l10_exp_recompute},
                                                 {"D", l10_exp_checkpoint}};

static const lab_spec lab10_spec = {
    .name = "lab10",
    .question = "M010",
    .title = "why the model-parallel RNG tracker is necessary",
    .summary = "Runs a small GPT with TP = 2 (world = TP) and compares every dropout mask "
               "across the TP ranks, SP off and on, under the tracker, one global seed and a "
               "seed per rank; one training step of each against the single-rank run; full "
               "recompute with and without the RNG restore (gradient error, stream offsets, "
               "the next iteration's masks); and a checkpoint resumed with and without its "
               "RNG states.",
    .default_world = 2,
    .sizes = {.tp = 2},
    .min_world = 2,
    .max_world = L10_MAX_TP,
    .check_world = l10_check_world,
    .call_timeout_s = 30.0,
    .n_variants = 3,
    .experiments = l10_experiments,
    .n_experiments = 4,
    .state_size = sizeof(l10_state),
    .facts = l10_facts,
    .report = l10_report,
    .cleanup = l10_cleanup,
};

int main(int argc, char **argv) { return lab_main(argc, argv, &lab10_spec); }
