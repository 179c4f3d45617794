/* labs/grader.c - the workbook's answer-sheet grader. The rules are described in grader.h and
   in the rubric files (labs/rubric/labNN.json); this file only knows how to apply them.

   Sections of this file:
     >>memory      arena + error exit (every allocation of one grading lives in one arena)
     >>text        NFKC + lower-case, tokens (English words, numbers, CJK characters, symbols)
     >>rubric      loading labs/rubric/labNN.json into concepts, patterns, items
     >>sheet       parsing the answer sheet with libcmark (sections, sentences, pred blocks)
     >>results     the measured facts (results/labNN.json), dot paths, flattened values
     >>predictions pred blocks vs facts
     >>concepts    concept matches, negation, pattern conjunctions
     >>prose       explanation points, anti-stuffing rules, misconceptions, evidence, quality
     >>report      score table, grade.json, report struct
     >>api         gr_grade, prediction hash, header, template */
#include "grader.h"

#include <ctype.h>
#include <math.h>
#include <regex.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmark.h>
#include <unicase.h>
#include <uninorm.h>
#include <unistr.h>

#include "megatron_c.h"

/* Inputs larger than this are read in part (a sheet is a few kilobytes). */
#define GR__MAX_SHEET_BYTES ((size_t)4 << 20)
#define GR__MAX_JSON_BYTES ((size_t)16 << 20)
/* Sentences beyond this many per section are not analysed (protects against pathological
   sheets; real sections have a few dozen). */
#define GR__MAX_SENTENCES_PER_SECTION 2000
#define GR__MAX_CANDIDATES 64    /* concept matches considered per pattern slot */
#define GR__SEARCH_BUDGET 200000 /* pattern-search steps per sentence and pattern */
#define GR__TABLE_WIDTH 96

enum { GR__PART_OTHER = -1, GR__PART_MAIN = 0, GR__PART_FOLLOWUP = 1 };
static const char *const gr__part_name[2] = {"main", "followup"};

// ---------------------------------------------------------------------------------------------
// >>memory

typedef struct gr__chunk {
    struct gr__chunk *next;
    size_t used, cap;
    max_align_t data[];
} gr__chunk;

typedef struct gr__ctx gr__ctx;

typedef struct gr__sb { /* growable string in the arena */
    char *s;
    size_t len, cap;
} gr__sb;

/* The grading context: the arena, the error exit and everything the grading builds. Defined
   further down (after the rubric, sheet and item types). */
struct gr__ctx;

static void *gr__alloc(gr__ctx *c, size_t n);
static void gr__fail(gr__ctx *c, int code, const char *fmt, ...);

static char *gr__strndup(gr__ctx *c, const char *s, size_t n) {
    char *d = (char *)gr__alloc(c, n + 1);
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

static char *gr__strdup(gr__ctx *c, const char *s) {
    return gr__strndup(c, s != NULL ? s : "", s != NULL ? strlen(s) : 0);
}

/* Returns arr with room for one more element (elements live in the arena; the old block is
   left behind, which is fine for a short-lived grading). */
static void *gr__grow(gr__ctx *c, void *arr, size_t elem, int n, int *cap) {
    if (n < *cap) return arr;
    int ncap = *cap > 0 ? *cap * 2 : 8;
    void *p = gr__alloc(c, elem * (size_t)ncap);
    if (arr != NULL && n > 0) memcpy(p, arr, elem * (size_t)n);
    *cap = ncap;
    return p;
}
#define GR__PUSH(c, arr, n, cap)                                                                   \
    ((arr) = gr__grow((c), (arr), sizeof *(arr), (n), &(cap)), &(arr)[(n)++])

static void gr__sb_addn(gr__ctx *c, gr__sb *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t ncap = b->cap > 0 ? b->cap * 2 : 256;
        while (ncap < b->len + n + 1)
            ncap *= 2;
        char *p = (char *)gr__alloc(c, ncap);
        if (b->len > 0) memcpy(p, b->s, b->len);
        b->s = p;
        b->cap = ncap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

static void gr__sb_add(gr__ctx *c, gr__sb *b, const char *s) { gr__sb_addn(c, b, s, strlen(s)); }

static void gr__sb_printf(gr__ctx *c, gr__sb *b, const char *fmt, ...) {
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        gr__sb_addn(c, b, small, (size_t)n);
        return;
    }
    char *big = (char *)gr__alloc(c, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    gr__sb_addn(c, b, big, (size_t)n);
}

static const char *gr__sb_str(const gr__sb *b) { return b->s != NULL ? b->s : ""; }

/* Reads at most max bytes of a file into malloc'd memory (NUL-terminated). NULL when the file
   cannot be opened. *truncated is set when the file was longer. */
static char *gr__read_file(const char *path, size_t max, size_t *len, int *truncated) {
    *len = 0;
    if (truncated != NULL) *truncated = 0;
    if (path == NULL) return NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = (char *)malloc(cap + 1);
    while (buf != NULL) {
        if (n == cap) {
            if (cap >= max) {
                if (truncated != NULL && fgetc(f) != EOF) *truncated = 1;
                break;
            }
            cap = cap * 2 > max ? max : cap * 2;
            char *nb = (char *)realloc(buf, cap + 1);
            if (nb == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    fclose(f);
    if (buf == NULL) return NULL;
    buf[n] = '\0';
    *len = n;
    return buf;
}

// ---------------------------------------------------------------------------------------------
// >>text

enum { GR__T_WORD, GR__T_NUM, GR__T_CJK, GR__T_SYM };

typedef struct gr__tok {
    uint8_t kind;
    uint8_t barrier; /* , : ( ) 、 - a clause boundary that negation does not cross */
    uint8_t prefix;  /* pattern tokens only: "creat*" matches any word starting with "creat" */
    int start, len;  /* bytes in the normalised text */
    char *s;         /* the token text */
    char *stem;      /* words: light stem */
} gr__tok;

static int gr__is_cjk(ucs4_t u) {
    return (u >= 0x3400 && u <= 0x4DBF) || (u >= 0x4E00 && u <= 0x9FFF) ||
           (u >= 0xF900 && u <= 0xFAFF) || (u >= 0x20000 && u <= 0x2FA1F) ||
           (u >= 0x3040 && u <= 0x30FF);
}

/* 0: separator, 1: symbol token, 2: barrier token (commas, colons, parentheses: clause
   boundaries that negation does not cross). Symbols are kept because a few concepts are
   symbols ("/" for "divided by", "×" for a product). */
static int gr__symbol_class(ucs4_t u) {
    switch (u) {
    case '/':
    case '=':
    case '*':
    case '+':
    case '#':
    case 0xD7:
    case 0xB7:
    case 0x22C5:
    case 0xF7:
    case 0x2217: return 1;
    case ',':
    case ':':
    case '(':
    case ')':
    case 0x3001: return 2;
    default: return 0;
    }
}

/* Replaces invalid UTF-8 and NUL bytes by spaces so that the Unicode functions get valid
   input whatever the file held. */
static char *gr__valid_utf8(gr__ctx *c, const char *s, size_t n, size_t *out_n) {
    char *o = (char *)gr__alloc(c, n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        ucs4_t uc;
        int m = u8_mbtouc(&uc, (const uint8_t *)s + i, n - i);
        if (m <= 0) m = 1;
        int replacement_char = (m == 3 && memcmp(s + i, "\xEF\xBF\xBD", 3) == 0);
        if ((uc == 0xFFFD && !replacement_char) || uc == 0) {
            o[k++] = ' ';
        } else {
            memcpy(o + k, s + i, (size_t)m);
            k += (size_t)m;
        }
        i += (size_t)m;
    }
    o[k] = '\0';
    *out_n = k;
    return o;
}

/* NFKC + lower-case; "n't" becomes " not" so that negation sees a word. */
static char *gr__normalize(gr__ctx *c, const char *s, size_t n) {
    size_t vn = 0;
    char *v = gr__valid_utf8(c, s, n, &vn);
    size_t ln = 0;
    uint8_t *low = u8_tolower((const uint8_t *)v, vn, NULL, UNINORM_NFKC, NULL, &ln);
    const char *src = v;
    size_t sn = vn;
    if (low != NULL) {
        src = (const char *)low;
        sn = ln;
    } else {
        for (size_t i = 0; i < vn; i++)
            v[i] = (char)tolower((unsigned char)v[i]);
    }
    char *o = (char *)gr__alloc(c, sn * 2 + 8);
    size_t k = 0;
    for (size_t i = 0; i < sn; i++) {
        if (src[i] == 'n') {
            size_t apo = 0; /* bytes of the apostrophe after the 'n' */
            if (i + 1 < sn && src[i + 1] == '\'')
                apo = 1;
            else if (i + 4 < sn && memcmp(src + i + 1, "\xE2\x80\x99", 3) == 0)
                apo = 3;
            size_t tpos = i + 1 + apo;
            if (apo > 0 && tpos < sn && src[tpos] == 't' &&
                (tpos + 1 >= sn || !isalpha((unsigned char)src[tpos + 1]))) {
                memcpy(o + k, " not", 4); /* "doesn't" -> "does not" */
                k += 4;
                i = tpos;
                continue;
            }
        }
        o[k++] = src[i];
    }
    o[k] = '\0';
    free(low);
    return o;
}

/* Light English stemming: enough to make create/creates/created and group/groups meet. */
static char *gr__stem(gr__ctx *c, const char *w, int n) {
    char buf[64];
    if (n <= 0 || n >= (int)sizeof buf) return gr__strndup(c, w, n > 0 ? (size_t)n : 0);
    memcpy(buf, w, (size_t)n);
    int len = n;
#define GR__ENDS(sfx)                                                                              \
    (len > (int)strlen(sfx) && memcmp(buf + len - strlen(sfx), sfx, strlen(sfx)) == 0)
    if (len > 4 && GR__ENDS("ies")) {
        len -= 3;
        buf[len++] = 'y';
    } else if (len > 3 && buf[len - 1] == 's' && buf[len - 2] != 's') {
        len--;
    }
    if (len > 5 && GR__ENDS("ing"))
        len -= 3;
    else if (len > 4 && GR__ENDS("ed"))
        len -= 2;
    if (len > 4 && buf[len - 1] == 'e') len--;
    if (len > 3 && buf[len - 1] == buf[len - 2] && strchr("aeiouls", buf[len - 1]) == NULL) len--;
#undef GR__ENDS
    return gr__strndup(c, buf, (size_t)len);
}

/* Tokenises normalised text. In pattern mode a '*' right after a word marks a prefix. */
static gr__tok *gr__tokenize(gr__ctx *c, const char *t, int pattern_mode, int *ntok) {
    gr__tok *tok = NULL;
    int n = 0, cap = 0;
    size_t len = strlen(t);
    for (size_t i = 0; i < len;) {
        unsigned char ch = (unsigned char)t[i];
        if (ch >= 'a' && ch <= 'z') {
            size_t j = i;
            while (j < len && t[j] >= 'a' && t[j] <= 'z')
                j++;
            gr__tok *k = GR__PUSH(c, tok, n, cap);
            memset(k, 0, sizeof *k);
            k->kind = GR__T_WORD;
            k->start = (int)i;
            k->len = (int)(j - i);
            k->s = gr__strndup(c, t + i, j - i);
            k->stem = gr__stem(c, t + i, (int)(j - i));
            if (pattern_mode && j < len && t[j] == '*') {
                k->prefix = 1;
                j++;
            }
            i = j;
            continue;
        }
        if (ch >= '0' && ch <= '9') {
            size_t j = i;
            while (j < len && isdigit((unsigned char)t[j]))
                j++;
            if (j + 1 < len && t[j] == '.' && isdigit((unsigned char)t[j + 1])) {
                j++;
                while (j < len && isdigit((unsigned char)t[j]))
                    j++;
            }
            gr__tok *k = GR__PUSH(c, tok, n, cap);
            memset(k, 0, sizeof *k);
            k->kind = GR__T_NUM;
            k->start = (int)i;
            k->len = (int)(j - i);
            k->s = gr__strndup(c, t + i, j - i);
            i = j;
            continue;
        }
        ucs4_t uc;
        int m = u8_mbtouc(&uc, (const uint8_t *)t + i, len - i);
        if (m <= 0) m = 1;
        int sym = gr__symbol_class(uc);
        if (gr__is_cjk(uc) || sym != 0) {
            gr__tok *k = GR__PUSH(c, tok, n, cap);
            memset(k, 0, sizeof *k);
            k->kind = gr__is_cjk(uc) ? GR__T_CJK : GR__T_SYM;
            k->barrier = sym == 2;
            k->start = (int)i;
            k->len = m;
            k->s = gr__strndup(c, t + i, (size_t)m);
        }
        i += (size_t)m;
    }
    *ntok = n;
    return tok;
}

static int gr__is_content(const gr__tok *t) { return t->kind != GR__T_SYM; }

/* Weight of a token for "within N tokens": a Chinese character is about half a word. */
static double gr__tok_weight(const gr__tok *t) {
    return t->kind == GR__T_CJK ? 0.5 : t->kind == GR__T_SYM ? 0.0 : 1.0;
}

// ---------------------------------------------------------------------------------------------
// >>rubric

typedef struct gr__alt {
    char *src; /* as written in the rubric */
    int is_re;
    regex_t *re;
    gr__tok *pt; /* pattern tokens */
    int npt;
} gr__alt;

typedef struct gr__concept {
    char id[48];
    gr__alt *alt;
    int nalt, capalt;
    int is_term; /* used by a rubric point: counts for the list and density rules */
} gr__concept;

typedef struct gr__slot { /* one conjunct of a pattern: any of these concepts */
    int *concepts;
    int n;
} gr__slot;

typedef struct gr__pat {
    gr__slot *slot;
    int nslot;
    int *unless; /* concepts that, anywhere in the sentence, stop the pattern */
    int nunless;
    int window;  /* 0 = whole sentence; else max token distance first..last */
    int ordered; /* slots must appear in the given order */
    int negated; /* misconceptions: matches only the negated form of the conjunction */
    int clause;  /* the conjunction may not span a comma (one clause) */
} gr__pat;

typedef struct gr__rsec { /* a rubric section (free text) */
    char id[16];
    int part;
    const char *title;
    const char *prompt;
    const char *kind; /* "expl" | "evid" */
} gr__rsec;

typedef struct gr__pitem { /* one prediction item */
    char key[64];
    char id[48];
    const char *type;
    const char *path;
    double points;
    cJSON *spec; /* the rubric object (values, fields, tolerances, partial) */
} gr__pitem;

typedef struct gr__point {
    char id[48];
    int section; /* index into rsec */
    double points;
    gr__pat *pat;
    int npat;
    int use_negation;
    const char *need;
    const char *title;
    cJSON *variants; /* NULL = every variant */
} gr__point;

typedef struct gr__misc {
    char id[16];
    const char *title;
    double penalty;
    gr__pat *pat;
    int npat;
    int *claims; /* claim-kind concepts whose wrong group lists fire this */
    int nclaims;
    cJSON *scope;  /* section ids */
    cJSON *pairs;  /* rubric point ids this contradicts */
    cJSON *refute; /* fact paths printed as the refutation */
    const char *feedback;
    const char *citation;
} gr__misc;

typedef struct gr__evid {
    char id[48];
    int section;
    double points, per_value;
    const char *facts_path;
    cJSON *ignore_paths;
    cJSON *ignore_numbers;
    const char *need;
} gr__evid;

typedef struct gr__quality {
    char id[48];
    int part;
    double points;
    cJSON *sections;
    const char *need;
} gr__quality;

typedef struct gr__claimkind {
    int concept;
    const char *path; /* NULL: lists after this word are not group claims */
} gr__claimkind;

typedef struct gr__rules {
    double negation_window, list_min_terms, density_cap, density_factor;
    double floor_en_words, floor_cjk_chars, copy_overlap, penalty_cap, unlocked_factor;
    double max_sentence_tokens, claim_distance;
} gr__rules;

typedef struct gr__rubric {
    cJSON *root;
    const char *lab, *question, *title, *version, *source_version;
    double max_main, max_followup;
    gr__rules rules;
    gr__concept *concepts;
    int nconcepts, capconcepts;
    int c_neg, c_neg_except, c_connective;
    gr__rsec *sec;
    int nsec, capsec;
    gr__point *points;
    int npoints, cappoints;
    gr__misc *misc;
    int nmisc, capmisc;
    gr__evid *evid;
    int nevid, capevid;
    gr__quality *quality;
    int nquality, capquality;
    gr__claimkind *claims;
    int nclaims, capclaims;
    cJSON *predictions; /* array, read when scoring (variant-dependent) */
    cJSON *parts;       /* {"main": [...], "followup": [...]} heading keywords */
    cJSON *variants;    /* {"F1": {"title", "question"}} */
    cJSON *header_fields;
} gr__rubric;

// ---------------------------------------------------------------------------------------------
// >>sheet types

typedef struct gr__match {
    int start, end; /* token range [start, end) */
    int alt;
    int neg; /* a negator stands within the window before it */
} gr__match;

typedef struct gr__sent {
    char *raw; /* as written (soft line breaks become spaces), trimmed */
    int line;
    char *norm;
    gr__tok *tok;
    int ntok;
    int words, cjk; /* English words and numbers, CJK characters */
    double *wpos;   /* wpos[i]: weighted position of token i (CJK 0.5, symbols 0, words 1) */
    int *barriers;  /* barriers[i]: barrier tokens among tokens 0..i-1 */
    int ignored;    /* 0, or why: 1 copy of the prompt/rubric, 2 list of terms, 3 too long */
    gr__match **cm; /* per concept, computed on first use */
    int *ncm;
} gr__sent;

typedef struct gr__sec {
    char *heading;
    int line;
    int part;
    int rub; /* rubric section index, -1 if none */
    gr__sent *sent;
    int nsent, capsent;
    int dropped; /* sentences beyond the per-section limit */
} gr__sec;

typedef struct gr__predblock {
    int part;
    int line;
    char *text;
} gr__predblock;

typedef struct gr__sheet {
    int present;
    int truncated;
    gr__sec *sec;
    int nsec, capsec;
    gr__predblock *pb;
    int npb, cappb;
    int has_header;
    char nonce[17];
    int probe;
    char variant[8];
} gr__sheet;

typedef struct gr__pv { /* one "key: value" of a pred block */
    char key[64];
    char *value;
    int line;
    int part;
    int placeholder;
} gr__pv;

typedef struct gr__item {
    char id[48];
    const char *kind; /* pred | expl | misc | evid | quality */
    const char *tag;  /* PRED | EXPL | MISC | EVID | QUAL */
    int part;
    double score, max;
    int line;
    int fired;
    char *detail; /* short, on the table line */
    gr__sb more;  /* further lines: excerpt, need, measured, citation */
} gr__item;

struct gr__ctx {
    gr__chunk *chunks;
    jmp_buf jmp;
    char err[1024];
    const char *answers_path; /* for messages */
    struct gr__lockstate *lock;
    int n_unlocked; /* filled predictions that earn 0 because of the lock */
    regex_t **regs;
    int nregs, capregs;
    cJSON **jsons;
    int njsons, capjsons;
    cmark_node *doc;
    cmark_iter *iters[2];
    gr__rubric R;
    gr__sheet S;
    cJSON *results;
    cJSON *facts;
    char variant[8];
    gr__item *items;
    int nitems, capitems;
    gr__sb warnings;
    /* prompt n-grams (copy detection) */
    uint64_t *ngram;
    size_t ngram_cap, ngram_n;
};

static void *gr__alloc(gr__ctx *c, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    gr__chunk *ch = c->chunks;
    if (ch == NULL || ch->cap - ch->used < n) {
        size_t cap = n > ((size_t)64 << 10) ? n : ((size_t)64 << 10);
        ch = (gr__chunk *)malloc(sizeof(gr__chunk) + cap);
        if (ch == NULL) {
            snprintf(c->err, sizeof c->err, "grader: out of memory");
            longjmp(c->jmp, MC_ERR_NO_MEMORY);
        }
        ch->next = c->chunks;
        ch->used = 0;
        ch->cap = cap;
        c->chunks = ch;
    }
    void *p = (char *)ch->data + ch->used;
    ch->used += n;
    memset(p, 0, n);
    return p;
}

static void gr__fail(gr__ctx *c, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    longjmp(c->jmp, code);
}

static void gr__ctx_free(gr__ctx *c) {
    for (int i = 0; i < c->nregs; i++)
        regfree(c->regs[i]);
    for (int i = 0; i < c->njsons; i++)
        cJSON_Delete(c->jsons[i]);
    for (int i = 0; i < 2; i++)
        if (c->iters[i] != NULL) cmark_iter_free(c->iters[i]);
    if (c->doc != NULL) cmark_node_free(c->doc);
    free(c->ngram);
    gr__chunk *ch = c->chunks;
    while (ch != NULL) {
        gr__chunk *next = ch->next;
        free(ch);
        ch = next;
    }
    free(c);
}

static gr__ctx *gr__ctx_new(void) { return (gr__ctx *)calloc(1, sizeof(gr__ctx)); }

/* Keeps a cJSON tree until the grading ends. */
static cJSON *gr__keep_json(gr__ctx *c, cJSON *j) {
    if (j != NULL) *GR__PUSH(c, c->jsons, c->njsons, c->capjsons) = j;
    return j;
}

static void gr__warn(gr__ctx *c, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    gr__sb_add(c, &c->warnings, buf);
    gr__sb_add(c, &c->warnings, "\n");
}

// ---------------------------------------------------------------------------------------------
// >>rubric loading

static const char *gr__jstr(const cJSON *o, const char *key, const char *def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) && v->valuestring != NULL ? v->valuestring : def;
}

static double gr__jnum(const cJSON *o, const char *key, double def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

static int gr__part_from_name(const char *s) {
    if (s == NULL) return GR__PART_OTHER;
    if (strcmp(s, "main") == 0) return GR__PART_MAIN;
    if (strcmp(s, "followup") == 0) return GR__PART_FOLLOWUP;
    return GR__PART_OTHER;
}

static int gr__concept_index(const gr__rubric *R, const char *id) {
    for (int i = 0; i < R->nconcepts; i++)
        if (strcmp(R->concepts[i].id, id) == 0) return i;
    return -1;
}

static void gr__add_alt(gr__ctx *c, gr__concept *k, const char *src) {
    gr__alt *a = GR__PUSH(c, k->alt, k->nalt, k->capalt);
    memset(a, 0, sizeof *a);
    a->src = gr__strdup(c, src);
    if (strncmp(src, "re:", 3) == 0) {
        a->is_re = 1;
        a->re = (regex_t *)gr__alloc(c, sizeof(regex_t));
        int rc = regcomp(a->re, src + 3, REG_EXTENDED);
        if (rc != 0) {
            char msg[256];
            regerror(rc, a->re, msg, sizeof msg);
            gr__fail(c, MC_ERR_INVALID_DESC,
                     "rubric: concept %s, alternative \"%s\": bad regular expression (%s)", k->id,
                     src, msg);
        }
        *GR__PUSH(c, c->regs, c->nregs, c->capregs) = a->re;
        return;
    }
    char *norm = gr__normalize(c, src, strlen(src));
    a->pt = gr__tokenize(c, norm, 1, &a->npt);
    if (a->npt == 0)
        gr__fail(c, MC_ERR_INVALID_DESC,
                 "rubric: concept %s, alternative \"%s\" has no word, number or CJK character",
                 k->id, src);
}

static void gr__add_alts(gr__ctx *c, gr__concept *k, const cJSON *list, const char *where) {
    const cJSON *v;
    if (list == NULL) return;
    if (!cJSON_IsArray(list))
        gr__fail(c, MC_ERR_INVALID_DESC, "rubric: %s must be a list of strings", where);
    cJSON_ArrayForEach(v, list) {
        if (!cJSON_IsString(v))
            gr__fail(c, MC_ERR_INVALID_DESC, "rubric: %s must hold strings only", where);
        gr__add_alt(c, k, v->valuestring);
    }
}

static gr__concept *gr__new_concept(gr__ctx *c, const char *id) {
    gr__rubric *R = &c->R;
    if (strlen(id) >= sizeof R->concepts[0].id)
        gr__fail(c, MC_ERR_INVALID_DESC, "rubric: concept id \"%s\" is longer than 47 characters",
                 id);
    if (gr__concept_index(R, id) >= 0)
        gr__fail(c, MC_ERR_INVALID_DESC, "rubric: concept %s is defined twice", id);
    gr__concept *k = GR__PUSH(c, R->concepts, R->nconcepts, R->capconcepts);
    memset(k, 0, sizeof *k);
    snprintf(k->id, sizeof k->id, "%s", id);
    return k;
}

static void gr__load_concepts(gr__ctx *c, const cJSON *root) {
    const cJSON *concepts = cJSON_GetObjectItemCaseSensitive(root, "concepts");
    if (!cJSON_IsObject(concepts))
        gr__fail(c, MC_ERR_INVALID_DESC,
                 "rubric: \"concepts\" must be an object of concept groups");
    const cJSON *g;
    cJSON_ArrayForEach(g, concepts) {
        char where[128];
        gr__concept *k = gr__new_concept(c, g->string);
        if (cJSON_IsArray(g)) {
            snprintf(where, sizeof where, "concepts.%s", g->string);
            gr__add_alts(c, k, g, where);
        } else if (cJSON_IsObject(g)) {
            static const char *const langs[] = {"en", "zh", "re"};
            for (int i = 0; i < 3; i++) {
                snprintf(where, sizeof where, "concepts.%s.%s", g->string, langs[i]);
                const cJSON *list = cJSON_GetObjectItemCaseSensitive(g, langs[i]);
                if (i == 2 && list != NULL) { /* "re": patterns without the "re:" prefix */
                    const cJSON *v;
                    cJSON_ArrayForEach(v, list) {
                        if (!cJSON_IsString(v))
                            gr__fail(c, MC_ERR_INVALID_DESC, "rubric: %s must hold strings", where);
                        char buf[1024];
                        snprintf(buf, sizeof buf, "re:%s", v->valuestring);
                        gr__add_alt(c, k, buf);
                    }
                } else {
                    gr__add_alts(c, k, list, where);
                }
            }
        } else {
            gr__fail(c, MC_ERR_INVALID_DESC,
                     "rubric: concepts.%s must be a list or an object {en, zh, re}", g->string);
        }
        if (k->nalt == 0)
            gr__fail(c, MC_ERR_INVALID_DESC, "rubric: concept %s has no alternatives", k->id);
    }
    /* The language rules become concepts too, so one matcher serves everything. */
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text");
    static const char *const special[3][2] = {{"__NEG", "negators"},
                                              {"__NEG_EXCEPT", "negator_exceptions"},
                                              {"__CONNECTIVE", "connectives"}};
    for (int i = 0; i < 3; i++) {
        gr__concept *k = gr__new_concept(c, special[i][0]);
        char where[64];
        snprintf(where, sizeof where, "text.%s", special[i][1]);
        gr__add_alts(c, k, cJSON_GetObjectItemCaseSensitive(text, special[i][1]), where);
    }
    c->R.c_neg = gr__concept_index(&c->R, "__NEG");
    c->R.c_neg_except = gr__concept_index(&c->R, "__NEG_EXCEPT");
    c->R.c_connective = gr__concept_index(&c->R, "__CONNECTIVE");
}

static int gr__need_concept(gr__ctx *c, const char *id, const char *where) {
    int k = gr__concept_index(&c->R, id);
    if (k < 0)
        gr__fail(c, MC_ERR_INVALID_DESC, "rubric: %s names unknown concept \"%s\"", where, id);
    return k;
}

/* "ADJ|STRIDED" -> the two concept indices. */
static void gr__parse_slot(gr__ctx *c, const char *spec, gr__slot *slot, const char *where) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", spec);
    int cap = 0;
    for (char *save = NULL, *p = strtok_r(buf, "|", &save); p != NULL;
         p = strtok_r(NULL, "|", &save))
        *GR__PUSH(c, slot->concepts, slot->n, cap) = gr__need_concept(c, p, where);
    if (slot->n == 0)
        gr__fail(c, MC_ERR_INVALID_DESC, "rubric: %s has an empty concept slot", where);
}

static void gr__parse_patterns(gr__ctx *c, const cJSON *list, gr__pat **out, int *nout,
                               const char *where, int mark_terms) {
    int cap = 0;
    *out = NULL;
    *nout = 0;
    if (list == NULL) return;
    if (!cJSON_IsArray(list))
        gr__fail(c, MC_ERR_INVALID_DESC, "rubric: %s.patterns must be a list", where);
    const cJSON *p;
    cJSON_ArrayForEach(p, list) {
        gr__pat *pat = GR__PUSH(c, *out, *nout, cap);
        memset(pat, 0, sizeof *pat);
        const cJSON *all = cJSON_GetObjectItemCaseSensitive(p, "all");
        if (!cJSON_IsArray(all) || cJSON_GetArraySize(all) == 0)
            gr__fail(c, MC_ERR_INVALID_DESC,
                     "rubric: %s: each pattern needs \"all\": [concept, ...] (one or more)", where);
        int scap = 0;
        const cJSON *s;
        cJSON_ArrayForEach(s, all) {
            if (!cJSON_IsString(s))
                gr__fail(c, MC_ERR_INVALID_DESC, "rubric: %s: \"all\" holds concept names", where);
            gr__slot *slot = GR__PUSH(c, pat->slot, pat->nslot, scap);
            memset(slot, 0, sizeof *slot);
            gr__parse_slot(c, s->valuestring, slot, where);
            if (mark_terms)
                for (int i = 0; i < slot->n; i++)
                    c->R.concepts[slot->concepts[i]].is_term = 1;
        }
        int ucap = 0;
        const cJSON *un = cJSON_GetObjectItemCaseSensitive(p, "unless");
        cJSON_ArrayForEach(s, un) {
            if (cJSON_IsString(s))
                *GR__PUSH(c, pat->unless, pat->nunless, ucap) =
                    gr__need_concept(c, s->valuestring, where);
        }
        pat->window = (int)gr__jnum(p, "window", 0);
        pat->ordered = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "ordered"));
        pat->negated = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "negated"));
        pat->clause = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "clause"));
    }
}

static int gr__rsec_index(const gr__rubric *R, const char *id) {
    for (int i = 0; i < R->nsec; i++)
        if (strcasecmp(R->sec[i].id, id) == 0) return i;
    return -1;
}

static void gr__load_sections(gr__ctx *c, const cJSON *root) {
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "sections");
    if (!cJSON_IsArray(list))
        gr__fail(c, MC_ERR_INVALID_DESC,
                 "rubric: \"sections\" must be a list of {id, part, title}");
    const cJSON *s;
    cJSON_ArrayForEach(s, list) {
        const char *id = gr__jstr(s, "id", NULL);
        if (id == NULL || strlen(id) >= 16)
            gr__fail(c, MC_ERR_INVALID_DESC,
                     "rubric: every section needs an \"id\" (under 16 characters)");
        gr__rsec *r = GR__PUSH(c, c->R.sec, c->R.nsec, c->R.capsec);
        memset(r, 0, sizeof *r);
        snprintf(r->id, sizeof r->id, "%s", id);
        r->part = gr__part_from_name(gr__jstr(s, "part", NULL));
        if (r->part == GR__PART_OTHER)
            gr__fail(c, MC_ERR_INVALID_DESC,
                     "rubric: section %s: \"part\" must be \"main\" or \"followup\"", id);
        r->title = gr__jstr(s, "title", "");
        r->prompt = gr__jstr(s, "prompt", "");
        r->kind = gr__jstr(s, "kind", "expl");
    }
}

static int gr__need_section(gr__ctx *c, const cJSON *o, const char *where) {
    const char *sid = gr__jstr(o, "section", NULL);
    int si = sid != NULL ? gr__rsec_index(&c->R, sid) : -1;
    if (si < 0)
        gr__fail(c, MC_ERR_INVALID_DESC, "rubric: %s: \"section\" (%s) is not one of the sections",
                 where, sid != NULL ? sid : "missing");
    return si;
}

static void gr__copy_id(gr__ctx *c, char *dst, size_t cap, const cJSON *o, const char *what) {
    const char *id = gr__jstr(o, "id", NULL);
    if (id == NULL || strlen(id) >= cap)
        gr__fail(c, MC_ERR_INVALID_DESC,
                 "rubric: every %s needs an \"id\" shorter than %zu characters", what, cap);
    snprintf(dst, cap, "%s", id);
}

static void gr__load_points(gr__ctx *c, const cJSON *root) {
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(root, "points")) {
        gr__point *pt = GR__PUSH(c, c->R.points, c->R.npoints, c->R.cappoints);
        memset(pt, 0, sizeof *pt);
        gr__copy_id(c, pt->id, sizeof pt->id, p, "point");
        char where[64];
        snprintf(where, sizeof where, "point %s", pt->id);
        pt->section = gr__need_section(c, p, where);
        pt->points = gr__jnum(p, "points", -1);
        if (!(pt->points >= 0))
            gr__fail(c, MC_ERR_INVALID_DESC, "rubric: point %s needs \"points\" >= 0", pt->id);
        gr__parse_patterns(c, cJSON_GetObjectItemCaseSensitive(p, "patterns"), &pt->pat, &pt->npat,
                           pt->id, 1);
        if (pt->npat == 0)
            gr__fail(c, MC_ERR_INVALID_DESC, "rubric: point %s needs at least one pattern", pt->id);
        const cJSON *neg = cJSON_GetObjectItemCaseSensitive(p, "negation");
        pt->use_negation = !cJSON_IsFalse(neg);
        pt->need = gr__jstr(p, "need", "");
        pt->title = gr__jstr(p, "title", "");
        pt->variants = cJSON_GetObjectItemCaseSensitive(p, "variants");
    }
}

static void gr__load_misconceptions(gr__ctx *c, const cJSON *root) {
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(root, "misconceptions")) {
        gr__misc *m = GR__PUSH(c, c->R.misc, c->R.nmisc, c->R.capmisc);
        memset(m, 0, sizeof *m);
        gr__copy_id(c, m->id, sizeof m->id, p, "misconception");
        m->title = gr__jstr(p, "title", "");
        m->penalty = gr__jnum(p, "penalty", -1);
        if (!(m->penalty >= 0))
            gr__fail(c, MC_ERR_INVALID_DESC, "rubric: misconception %s needs \"penalty\" >= 0",
                     m->id);
        gr__parse_patterns(c, cJSON_GetObjectItemCaseSensitive(p, "patterns"), &m->pat, &m->npat,
                           m->id, 0);
        int cap = 0;
        const cJSON *k;
        cJSON_ArrayForEach(k, cJSON_GetObjectItemCaseSensitive(p, "claims")) {
            if (cJSON_IsString(k))
                *GR__PUSH(c, m->claims, m->nclaims, cap) =
                    gr__need_concept(c, k->valuestring, m->id);
        }
        if (m->npat == 0 && m->nclaims == 0)
            gr__fail(c, MC_ERR_INVALID_DESC, "rubric: misconception %s needs patterns or claims",
                     m->id);
        m->scope = cJSON_GetObjectItemCaseSensitive(p, "sections");
        m->pairs = cJSON_GetObjectItemCaseSensitive(p, "pairs_with");
        m->refute = cJSON_GetObjectItemCaseSensitive(p, "refute");
        m->feedback = gr__jstr(p, "feedback", "");
        m->citation = gr__jstr(p, "citation", "");
    }
}

static void gr__load_evidence_quality(gr__ctx *c, const cJSON *root) {
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(root, "evidence")) {
        gr__evid *e = GR__PUSH(c, c->R.evid, c->R.nevid, c->R.capevid);
        memset(e, 0, sizeof *e);
        gr__copy_id(c, e->id, sizeof e->id, p, "evidence item");
        char where[64];
        snprintf(where, sizeof where, "evidence %s", e->id);
        e->section = gr__need_section(c, p, where);
        e->points = gr__jnum(p, "points", 1.0);
        e->per_value = gr__jnum(p, "per_value", 0.5);
        e->facts_path = gr__jstr(p, "facts", "facts");
        e->ignore_paths = cJSON_GetObjectItemCaseSensitive(p, "ignore_paths");
        e->ignore_numbers = cJSON_GetObjectItemCaseSensitive(p, "ignore_numbers");
        e->need = gr__jstr(p, "need", "");
    }
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(root, "quality")) {
        gr__quality *q = GR__PUSH(c, c->R.quality, c->R.nquality, c->R.capquality);
        memset(q, 0, sizeof *q);
        gr__copy_id(c, q->id, sizeof q->id, p, "quality item");
        q->part = gr__part_from_name(gr__jstr(p, "part", "followup"));
        q->points = gr__jnum(p, "points", 0.5);
        q->sections = cJSON_GetObjectItemCaseSensitive(p, "sections");
        q->need = gr__jstr(p, "need", "");
    }
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(root, "claim_kinds")) {
        gr__claimkind *k = GR__PUSH(c, c->R.claims, c->R.nclaims, c->R.capclaims);
        k->concept = gr__need_concept(c, gr__jstr(p, "concept", "?"), "claim_kinds");
        k->path = gr__jstr(p, "path", NULL);
    }
}

static void gr__load_rules(gr__ctx *c, const cJSON *root) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(root, "rules");
    gr__rules *x = &c->R.rules;
    x->negation_window = gr__jnum(r, "negation_window", 3);
    x->list_min_terms = gr__jnum(r, "list_min_terms", 6);
    x->density_cap = gr__jnum(r, "density_cap", 0.35);
    x->density_factor = gr__jnum(r, "density_factor", 0.5);
    x->floor_en_words = gr__jnum(r, "floor_en_words", 40);
    x->floor_cjk_chars = gr__jnum(r, "floor_cjk_chars", 80);
    x->copy_overlap = gr__jnum(r, "copy_overlap", 0.8);
    x->penalty_cap = gr__jnum(r, "penalty_cap", 3.0);
    x->unlocked_factor = gr__jnum(r, "unlocked_factor", 0.5);
    x->max_sentence_tokens = gr__jnum(r, "max_sentence_tokens", 400);
    x->claim_distance = gr__jnum(r, "claim_distance", 8);
}

/* Parses the rubric file (JSON text) into c->R. Fails with a message naming the field. */
static void gr__load_rubric_text(gr__ctx *c, const char *path, const char *text) {
    cJSON *root = gr__keep_json(c, cJSON_Parse(text));
    if (root == NULL) {
        const char *at = cJSON_GetErrorPtr();
        gr__fail(c, MC_ERR_INVALID_DESC, "rubric %s is not valid JSON (near \"%.30s\")", path,
                 at != NULL ? at : "?");
    }
    gr__rubric *R = &c->R;
    R->root = root;
    R->lab = gr__jstr(root, "lab", "lab");
    R->question = gr__jstr(root, "question", "");
    R->title = gr__jstr(root, "title", "");
    R->version = gr__jstr(root, "rubric_version", "?");
    R->source_version = gr__jstr(root, "source_version", "");
    const cJSON *max = cJSON_GetObjectItemCaseSensitive(root, "max");
    R->max_main = gr__jnum(max, "main", 10);
    R->max_followup = gr__jnum(max, "followup", 5);
    R->predictions = cJSON_GetObjectItemCaseSensitive(root, "predictions");
    R->parts = cJSON_GetObjectItemCaseSensitive(root, "parts");
    R->variants = cJSON_GetObjectItemCaseSensitive(root, "variants");
    R->header_fields = cJSON_GetObjectItemCaseSensitive(root, "header_fields");
    gr__load_rules(c, root);
    gr__load_concepts(c, root);
    gr__load_sections(c, root);
    gr__load_points(c, root);
    gr__load_misconceptions(c, root);
    gr__load_evidence_quality(c, root);
}

static void gr__load_rubric(gr__ctx *c, const char *path) {
    size_t n = 0;
    char *text = gr__read_file(path, GR__MAX_JSON_BYTES, &n, NULL);
    if (text == NULL)
        gr__fail(c, MC_ERR_IO, "rubric %s cannot be read (run from the repository root)",
                 path != NULL ? path : "(null)");
    char *copy = gr__strndup(c, text, n);
    free(text);
    gr__load_rubric_text(c, path, copy);
}

// ---------------------------------------------------------------------------------------------
// >>sheet

/* Reads the answer sheet. Returns NULL (and sets *missing) when there is no file at the path:
   a missing sheet is graded as an empty one. Anything else that is not a UTF-8 text file (a
   directory, a device, invalid UTF-8, NUL bytes) fails with a message naming the file and the
   line, because grading it would silently score garbage. A leading byte-order mark is
   dropped. */
static char *gr__read_sheet(gr__ctx *c, const char *path, size_t *len, int *truncated,
                            int *missing) {
    *len = 0;
    *missing = 0;
    if (truncated != NULL) *truncated = 0;
    struct stat st;
    if (path == NULL || stat(path, &st) != 0) {
        if (path != NULL && errno != ENOENT)
            gr__fail(c, MC_ERR_IO, "answer sheet %s cannot be read: %s", path, strerror(errno));
        *missing = 1;
        return NULL;
    }
    if (S_ISDIR(st.st_mode))
        gr__fail(c, MC_ERR_IO, "answer sheet %s is a directory, not a Markdown file", path);
    if (!S_ISREG(st.st_mode))
        gr__fail(c, MC_ERR_IO, "answer sheet %s is not a regular file", path);
    size_t n = 0;
    char *raw = gr__read_file(path, GR__MAX_SHEET_BYTES, &n, truncated);
    if (raw == NULL) gr__fail(c, MC_ERR_IO, "answer sheet %s cannot be read: %s", path, strerror(errno));
    char *text = gr__strndup(c, raw, n);
    free(raw);
    if (n >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) {
        memmove(text, text + 3, n - 2);
        n -= 3;
    }
    /* A sheet cut at the size limit may end inside a character: ignore that tail. */
    size_t check = n;
    if (truncated != NULL && *truncated)
        while (check > 0 && ((unsigned char)text[check - 1] & 0xC0) == 0x80)
            check--;
    if (truncated != NULL && *truncated && check > 0 && (unsigned char)text[check - 1] >= 0xC0)
        check--;
    int line = 1, col = 1;
    for (size_t i = 0; i < check;) {
        ucs4_t uc;
        int m = u8_mbtouc(&uc, (const uint8_t *)text + i, check - i);
        int bad = m <= 0 || uc == 0xFFFD;
        if (bad && m == 3 && memcmp(text + i, "\xEF\xBF\xBD", 3) == 0) bad = 0; /* a real U+FFFD */
        if (bad || uc == 0)
            gr__fail(c, MC_ERR_INVALID_DESC,
                     "answer sheet %s, line %d, column %d: %s (save the sheet as UTF-8 text)",
                     path, line, col, uc == 0 && !bad ? "NUL byte" : "invalid UTF-8");
        if (uc == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
        i += (size_t)(m > 0 ? m : 1);
    }
    *len = check;
    text[check] = '\0';
    return text;
}


/* Finds "nonce: X ; probe_rank: N ; followup: FV" inside an HTML comment. */
static int gr__parse_header_text(const char *s, char nonce[17], int *probe, char variant[8]) {
    for (const char *open = strstr(s, "<!--"); open != NULL; open = strstr(open + 4, "<!--")) {
        const char *close = strstr(open, "-->");
        size_t span = close != NULL ? (size_t)(close - open) : strlen(open);
        const char *p = strstr(open, "nonce:");
        if (p == NULL || (size_t)(p - open) > span) continue;
        p += 6;
        while (*p == ' ' || *p == '\t')
            p++;
        size_t n = 0;
        while (n < 16 && (isalnum((unsigned char)p[n]) || p[n] == '_' || p[n] == '-'))
            n++;
        if (n == 0) continue;
        memcpy(nonce, p, n);
        nonce[n] = '\0';
        const char *q = strstr(p, "probe_rank:");
        if (q == NULL || (size_t)(q - open) > span) continue;
        *probe = atoi(q + 11);
        variant[0] = '\0';
        const char *v = strstr(p, "followup:");
        if (v != NULL && (size_t)(v - open) <= span) {
            v += 9;
            while (*v == ' ' || *v == '\t')
                v++;
            size_t k = 0;
            while (k < 7 && isalnum((unsigned char)v[k]))
                k++;
            memcpy(variant, v, k);
            variant[k] = '\0';
        }
        return 1;
    }
    return 0;
}

/* The first run of letters/digits of a normalised heading ("a1 layout rule" -> "a1"). */
static void gr__heading_id(const char *norm, char *out, size_t cap) {
    while (*norm != '\0' && !isalnum((unsigned char)*norm))
        norm++;
    size_t n = 0;
    while (n + 1 < cap && isalnum((unsigned char)norm[n])) {
        out[n] = norm[n];
        n++;
    }
    out[n] = '\0';
}

static int gr__heading_part(gr__ctx *c, const char *norm) {
    static const char *const defaults[2][3] = {{"predictions", "main", NULL},
                                               {"follow", NULL, NULL}};
    while (*norm == ' ')
        norm++;
    for (int part = 0; part < 2; part++) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(c->R.parts, gr__part_name[part]);
        if (list != NULL) {
            const cJSON *kw;
            cJSON_ArrayForEach(kw, list) {
                if (!cJSON_IsString(kw)) continue;
                char *k = gr__normalize(c, kw->valuestring, strlen(kw->valuestring));
                if (k[0] != '\0' && strncmp(norm, k, strlen(k)) == 0) return part;
            }
        } else {
            for (int i = 0; defaults[part][i] != NULL; i++)
                if (strncmp(norm, defaults[part][i], strlen(defaults[part][i])) == 0) return part;
        }
    }
    return GR__PART_OTHER;
}

/* Text of a node's inline content: soft breaks become '\x01' (a space that counts a line),
   hard breaks '\n' (a sentence end). */
static char *gr__inline_text(gr__ctx *c, cmark_node *node, size_t *len) {
    gr__sb b = {0};
    cmark_iter *it = cmark_iter_new(node);
    if (it == NULL) gr__fail(c, MC_ERR_NO_MEMORY, "grader: out of memory");
    c->iters[1] = it;
    cmark_event_type ev;
    while ((ev = cmark_iter_next(it)) != CMARK_EVENT_DONE) {
        if (ev != CMARK_EVENT_ENTER) continue;
        cmark_node *n = cmark_iter_get_node(it);
        switch (cmark_node_get_type(n)) {
        case CMARK_NODE_TEXT:
        case CMARK_NODE_CODE: {
            const char *lit = cmark_node_get_literal(n);
            if (lit != NULL) gr__sb_add(c, &b, lit);
            break;
        }
        case CMARK_NODE_SOFTBREAK: gr__sb_add(c, &b, "\x01"); break;
        case CMARK_NODE_LINEBREAK: gr__sb_add(c, &b, "\n"); break;
        default: break;
        }
    }
    cmark_iter_free(it);
    c->iters[1] = NULL;
    *len = b.len;
    return b.s != NULL ? b.s : gr__strdup(c, "");
}

static void gr__prepare_sentence(gr__ctx *c, gr__sent *s) {
    s->norm = gr__normalize(c, s->raw, strlen(s->raw));
    s->tok = gr__tokenize(c, s->norm, 0, &s->ntok);
    s->wpos = (double *)gr__alloc(c, sizeof(double) * (size_t)(s->ntok + 1));
    s->barriers = (int *)gr__alloc(c, sizeof(int) * (size_t)(s->ntok + 1));
    double w = 0;
    for (int i = 0; i < s->ntok; i++) {
        s->wpos[i] = w;
        s->barriers[i + 1] = s->barriers[i] + s->tok[i].barrier;
        w += gr__tok_weight(&s->tok[i]);
        if (s->tok[i].kind == GR__T_WORD || s->tok[i].kind == GR__T_NUM)
            s->words++;
        else if (s->tok[i].kind == GR__T_CJK)
            s->cjk++;
    }
    s->wpos[s->ntok] = w;
}

static void gr__add_sentence(gr__ctx *c, gr__sec *sec, const char *text, size_t n, int line) {
    while (n > 0 && (isspace((unsigned char)*text) || *text == '\x01')) {
        text++;
        n--;
    }
    while (n > 0 && (isspace((unsigned char)text[n - 1]) || text[n - 1] == '\x01'))
        n--;
    if (n == 0) return;
    if (sec->nsent >= GR__MAX_SENTENCES_PER_SECTION) {
        sec->dropped++;
        return;
    }
    gr__sent *s = GR__PUSH(c, sec->sent, sec->nsent, sec->capsent);
    memset(s, 0, sizeof *s);
    /* A soft line break becomes a space, except between two non-ASCII characters (Chinese
       text wraps without spaces). */
    char *raw = (char *)gr__alloc(c, n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = text[i];
        if (ch == '\x01') {
            int cjk_join = k > 0 && (unsigned char)raw[k - 1] >= 0x80 && i + 1 < n &&
                           (unsigned char)text[i + 1] >= 0x80;
            if (!cjk_join) raw[k++] = ' ';
            continue;
        }
        raw[k++] = ch == '\n' || ch == '\t' ? ' ' : ch;
    }
    raw[k] = '\0';
    s->raw = raw;
    s->line = line;
    gr__prepare_sentence(c, s);
}

/* 1 when the character at text[i] ends a sentence; *adv = its length in bytes. */
static int gr__sentence_end(const char *text, size_t n, size_t i, size_t *adv) {
    unsigned char ch = (unsigned char)text[i];
    *adv = 1;
    if (ch == '\n' || ch == '!' || ch == '?' || ch == ';') return 1;
    if (ch == '.') {
        if (i + 1 >= n) return 1;
        unsigned char next = (unsigned char)text[i + 1];
        return isspace(next) || next == '\x01' || next >= 0x80;
    }
    if (ch >= 0x80) {
        ucs4_t uc;
        int m = u8_mbtouc(&uc, (const uint8_t *)text + i, n - i);
        *adv = m > 0 ? (size_t)m : 1;
        return uc == 0x3002 || uc == 0xFF01 || uc == 0xFF1F || uc == 0xFF1B || uc == 0xFF61;
    }
    return 0;
}

/* Splits a paragraph into sentences on . ! ? ; 。！？； and hard line breaks. */
static void gr__add_paragraph(gr__ctx *c, gr__sec *sec, const char *text, size_t n, int line0) {
    size_t start = 0;
    int line = line0; /* line of text[start] */
    for (size_t i = 0; i <= n;) {
        size_t adv = 1;
        int end = i == n ? 1 : gr__sentence_end(text, n, i, &adv);
        if (!end) {
            i += adv;
            continue;
        }
        size_t stop = i == n ? n : i + adv;
        int sline = line;
        size_t k = start;
        while (k < stop && (isspace((unsigned char)text[k]) || text[k] == '\x01')) {
            if (text[k] == '\x01' || text[k] == '\n') sline++;
            k++;
        }
        gr__add_sentence(c, sec, text + start, stop - start, sline);
        for (size_t j = start; j < stop; j++)
            if (text[j] == '\x01' || text[j] == '\n') line++;
        start = stop;
        if (i == n) break;
        i = stop;
    }
}

static gr__sec *gr__new_section(gr__ctx *c, const char *heading, int line, int part, int rub) {
    gr__sheet *S = &c->S;
    if (rub >= 0) /* a repeated heading continues the same rubric section */
        for (int i = 0; i < S->nsec; i++)
            if (S->sec[i].rub == rub) return &S->sec[i];
    gr__sec *sec = GR__PUSH(c, S->sec, S->nsec, S->capsec);
    memset(sec, 0, sizeof *sec);
    sec->heading = gr__strdup(c, heading);
    sec->line = line;
    sec->part = part;
    sec->rub = rub;
    return sec;
}

static void gr__on_heading(gr__ctx *c, cmark_node *node, int *part, int *cur) {
    size_t hl = 0;
    char *htext = gr__inline_text(c, node, &hl);
    for (char *p = htext; *p != '\0'; p++)
        if (*p == '\x01' || *p == '\n') *p = ' ';
    int level = cmark_node_get_heading_level(node);
    int line = cmark_node_get_start_line(node);
    char *norm = gr__normalize(c, htext, hl);
    char hid[16];
    gr__heading_id(norm, hid, sizeof hid);
    int rub = level >= 2 && hid[0] != '\0' ? gr__rsec_index(&c->R, hid) : -1;
    if (rub >= 0) {
        *cur = (int)(gr__new_section(c, htext, line, c->R.sec[rub].part, rub) - c->S.sec);
        return;
    }
    if (level <= 2) *part = level == 1 ? GR__PART_OTHER : gr__heading_part(c, norm);
    if (level <= 3) *cur = (int)(gr__new_section(c, htext, line, *part, -1) - c->S.sec);
    /* deeper headings stay inside the current section */
}

/* Parses the sheet into sections, sentences and pred blocks. */
static void gr__parse_sheet(gr__ctx *c, const char *text, size_t n) {
    gr__sheet *S = &c->S;
    S->present = 1;
    c->doc = cmark_parse_document(text, n, CMARK_OPT_DEFAULT);
    if (c->doc == NULL) gr__fail(c, MC_ERR_NO_MEMORY, "grader: out of memory");
    S->has_header = gr__parse_header_text(text, S->nonce, &S->probe, S->variant);
    int part = GR__PART_OTHER;
    int cur =
        (int)(gr__new_section(c, "(before the first heading)", 1, GR__PART_OTHER, -1) - S->sec);
    cmark_iter *it = cmark_iter_new(c->doc);
    if (it == NULL) gr__fail(c, MC_ERR_NO_MEMORY, "grader: out of memory");
    c->iters[0] = it;
    cmark_event_type ev;
    while ((ev = cmark_iter_next(it)) != CMARK_EVENT_DONE) {
        if (ev != CMARK_EVENT_ENTER) continue;
        cmark_node *node = cmark_iter_get_node(it);
        switch (cmark_node_get_type(node)) {
        case CMARK_NODE_HEADING: gr__on_heading(c, node, &part, &cur); break;
        case CMARK_NODE_PARAGRAPH: {
            size_t len = 0;
            char *t = gr__inline_text(c, node, &len);
            gr__add_paragraph(c, &S->sec[cur], t, len, cmark_node_get_start_line(node));
            break;
        }
        case CMARK_NODE_CODE_BLOCK: {
            const char *info = cmark_node_get_fence_info(node);
            char word[16] = {0};
            if (info != NULL) sscanf(info, "%15s", word);
            if (strcasecmp(word, "pred") != 0) break; /* other code blocks are not prose */
            gr__predblock *b = GR__PUSH(c, S->pb, S->npb, S->cappb);
            int bpart = S->sec[cur].part != GR__PART_OTHER ? S->sec[cur].part : part;
            if (bpart == GR__PART_OTHER) bpart = S->npb == 1 ? GR__PART_MAIN : GR__PART_FOLLOWUP;
            b->part = bpart;
            b->line = cmark_node_get_start_line(node) + 1;
            b->text = gr__strdup(c, cmark_node_get_literal(node));
            break;
        }
        default: break;
        }
    }
    cmark_iter_free(it);
    c->iters[0] = NULL;
}

// ---------------------------------------------------------------------------------------------
// >>results

static const cJSON *gr__path(const cJSON *root, const char *path) {
    if (root == NULL || path == NULL) return NULL;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *cur = root;
    for (char *save = NULL, *p = strtok_r(buf, ".", &save); p != NULL && cur != NULL;
         p = strtok_r(NULL, ".", &save)) {
        if (cJSON_IsArray(cur) && isdigit((unsigned char)p[0]))
            cur = cJSON_GetArrayItem(cur, atoi(p));
        else
            cur = cJSON_GetObjectItemCaseSensitive(cur, p);
    }
    return cur;
}

static int gr__cmp_long(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

static int gr__cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* "[7,5]" -> "[5,7]": a flat list of integers, sorted. */
static char *gr__canon_ints(gr__ctx *c, long *v, int n) {
    qsort(v, (size_t)n, sizeof *v, gr__cmp_long);
    gr__sb b = {0};
    gr__sb_add(c, &b, "[");
    for (int i = 0; i < n; i++)
        gr__sb_printf(c, &b, i ? ",%ld" : "%ld", v[i]);
    gr__sb_add(c, &b, "]");
    return b.s;
}

static char *gr__canon_nested(gr__ctx *c, char **inner, int n) {
    qsort(inner, (size_t)n, sizeof *inner, gr__cmp_str);
    gr__sb b = {0};
    gr__sb_add(c, &b, "[");
    for (int i = 0; i < n; i++) {
        if (i) gr__sb_add(c, &b, ",");
        gr__sb_add(c, &b, inner[i]);
    }
    gr__sb_add(c, &b, "]");
    return b.s;
}

/* A bracketed list in text: flat [a,b] or nested [[a,b],[c,d]]; inner lists canonical. */
typedef struct gr__blist {
    size_t start, end; /* bytes in the text */
    int nested;
    char **inner;
    int *inner_len;
    int ninner;
    char *canon;
} gr__blist;

static void gr__skip_ws(const char *s, size_t n, size_t *i) {
    while (*i < n && (s[*i] == ' ' || s[*i] == '\t'))
        (*i)++;
}

static int gr__list_sep(const char *s, size_t n, size_t *i) {
    gr__skip_ws(s, n, i);
    if (*i < n && s[*i] == ',') {
        (*i)++;
        return 1;
    }
    if (*i + 3 <= n && memcmp(s + *i, "\xE3\x80\x81", 3) == 0) { /* 、 */
        *i += 3;
        return 1;
    }
    return 0;
}

/* Parses "[1, 2, 3]" at s[*i]; NULL (and *i unchanged) when it is not a list of integers. */
static char *gr__parse_flat(gr__ctx *c, const char *s, size_t n, size_t *i, int *len) {
    size_t k = *i;
    if (k >= n || s[k] != '[') return NULL;
    k++;
    long v[512];
    int nv = 0;
    gr__skip_ws(s, n, &k);
    if (k < n && s[k] == ']') return NULL; /* [] says nothing */
    for (;;) {
        gr__skip_ws(s, n, &k);
        if (k >= n || !isdigit((unsigned char)s[k]) || nv >= 512) return NULL;
        long x = 0;
        while (k < n && isdigit((unsigned char)s[k]) && x < 100000000)
            x = x * 10 + (s[k++] - '0');
        if (k < n && (isdigit((unsigned char)s[k]) || s[k] == '.')) return NULL;
        v[nv++] = x;
        if (gr__list_sep(s, n, &k)) continue;
        gr__skip_ws(s, n, &k);
        if (k < n && s[k] == ']') {
            k++;
            break;
        }
        return NULL;
    }
    *i = k;
    *len = nv;
    return gr__canon_ints(c, v, nv);
}

static int gr__parse_blist(gr__ctx *c, const char *s, size_t n, size_t at, gr__blist *out) {
    memset(out, 0, sizeof *out);
    size_t k = at;
    int len = 0;
    char *flat = gr__parse_flat(c, s, n, &k, &len);
    if (flat != NULL) {
        out->start = at;
        out->end = k;
        out->inner = (char **)gr__alloc(c, sizeof(char *));
        out->inner_len = (int *)gr__alloc(c, sizeof(int));
        out->inner[0] = flat;
        out->inner_len[0] = len;
        out->ninner = 1;
        out->canon = flat;
        return 1;
    }
    k = at + 1;
    int cap = 0, lcap = 0, nl = 0;
    for (;;) {
        gr__skip_ws(s, n, &k);
        char *in = gr__parse_flat(c, s, n, &k, &len);
        if (in == NULL) return 0;
        *GR__PUSH(c, out->inner, out->ninner, cap) = in;
        *GR__PUSH(c, out->inner_len, nl, lcap) = len;
        if (gr__list_sep(s, n, &k)) continue;
        gr__skip_ws(s, n, &k);
        if (k < n && s[k] == ']') {
            k++;
            break;
        }
        return 0;
    }
    out->start = at;
    out->end = k;
    out->nested = 1;
    char **copy = (char **)gr__alloc(c, sizeof(char *) * (size_t)out->ninner);
    memcpy(copy, out->inner, sizeof(char *) * (size_t)out->ninner);
    out->canon = gr__canon_nested(c, copy, out->ninner);
    return 1;
}

/* A number quoted in text, with the decimals it was written with. */
typedef struct gr__num {
    double v;
    int decimals;
    char text[32];
    size_t start;
} gr__num;

static int gr__is_unit(const char *w, size_t n) {
    static const char *const units[] = {"s",      "ms",      "us",  "ns",    "sec",  "secs",
                                        "second", "seconds", "mib", "gib",   "kib",  "mb",
                                        "gb",     "kb",      "b",   "bytes", "x",    "st",
                                        "nd",     "rd",      "th",  "ranks", "gpus", NULL};
    for (int i = 0; units[i] != NULL; i++)
        if (strlen(units[i]) == n && strncmp(units[i], w, n) == 0) return 1;
    return 0;
}

/* Extracts bracketed lists and stand-alone numbers ("5.0 s", "#23"; not "F2", "M003"). */
static void gr__extract_values(gr__ctx *c, const char *s, gr__blist **lists, int *nlists, int *lcap,
                               gr__num **nums, int *nnums, int *ncap) {
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        if (s[i] == '[') {
            gr__blist bl;
            if (gr__parse_blist(c, s, n, i, &bl)) {
                *GR__PUSH(c, *lists, *nlists, *lcap) = bl;
                i = bl.end;
                continue;
            }
        }
        if (isdigit((unsigned char)s[i])) {
            size_t j = i;
            while (j < n && isdigit((unsigned char)s[j]))
                j++;
            int dec = 0;
            if (j + 1 < n && s[j] == '.' && isdigit((unsigned char)s[j + 1])) {
                j++;
                while (j < n && isdigit((unsigned char)s[j])) {
                    j++;
                    dec++;
                }
            }
            int glued_before =
                i > 0 && (isalpha((unsigned char)s[i - 1]) || s[i - 1] == '_' || s[i - 1] == '.');
            size_t w = j;
            while (w < n && isalpha((unsigned char)s[w]))
                w++;
            int glued_after = (w > j && !gr__is_unit(s + j, w - j)) || (w < n && s[w] == '_');
            if (!glued_before && !glued_after && j - i < 30) {
                gr__num *x = GR__PUSH(c, *nums, *nnums, *ncap);
                memset(x, 0, sizeof *x);
                memcpy(x->text, s + i, j - i);
                x->v = strtod(x->text, NULL);
                x->decimals = dec;
                x->start = i;
            }
            i = w > j ? w : j;
            continue;
        }
        i++;
    }
}

/* Every value the run measured: numbers, integer lists (flat and nested), and the numbers and
   lists written inside measured strings. */
typedef struct gr__facts {
    double *num;
    int nnum, capnum;
    char **list;
    int nlist, caplist;
} gr__facts;

static char *gr__json_canon(gr__ctx *c, const cJSON *j);

static void gr__facts_add_num(gr__ctx *c, gr__facts *F, double v) {
    *GR__PUSH(c, F->num, F->nnum, F->capnum) = v;
}

static void gr__facts_add_list(gr__ctx *c, gr__facts *F, char *canon) {
    if (canon != NULL) *GR__PUSH(c, F->list, F->nlist, F->caplist) = canon;
}

static void gr__flatten(gr__ctx *c, const cJSON *j, gr__facts *F, int depth) {
    if (j == NULL || depth > 32) return;
    if (cJSON_IsNumber(j)) {
        gr__facts_add_num(c, F, j->valuedouble);
    } else if (cJSON_IsString(j) && j->valuestring != NULL) {
        char *norm = gr__normalize(c, j->valuestring, strlen(j->valuestring));
        gr__blist *lists = NULL;
        gr__num *nums = NULL;
        int nl = 0, lc = 0, nn = 0, nc = 0;
        gr__extract_values(c, norm, &lists, &nl, &lc, &nums, &nn, &nc);
        for (int i = 0; i < nl; i++) {
            gr__facts_add_list(c, F, lists[i].canon);
            for (int k = 0; k < lists[i].ninner && lists[i].nested; k++)
                gr__facts_add_list(c, F, lists[i].inner[k]);
        }
        for (int i = 0; i < nn; i++)
            gr__facts_add_num(c, F, nums[i].v);
    } else if (cJSON_IsArray(j) || cJSON_IsObject(j)) {
        /* A list of rank ids counts as a list; its elements are not stand-alone measurements
           (otherwise every small integer would "verify"). */
        char *canon = cJSON_IsArray(j) ? gr__json_canon(c, j) : NULL;
        gr__facts_add_list(c, F, canon);
        const cJSON *e;
        cJSON_ArrayForEach(e, j) {
            if (canon != NULL && cJSON_IsNumber(e)) continue;
            gr__flatten(c, e, F, depth + 1);
        }
    }
}

/* Canonical form of a JSON list of integers, or of a list of such lists; NULL otherwise. */
static char *gr__json_canon(gr__ctx *c, const cJSON *j) {
    if (!cJSON_IsArray(j)) return NULL;
    int n = cJSON_GetArraySize(j);
    if (n == 0) return NULL;
    const cJSON *first = cJSON_GetArrayItem(j, 0);
    if (cJSON_IsNumber(first)) {
        long *v = (long *)gr__alloc(c, sizeof(long) * (size_t)n);
        int k = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, j) {
            if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble)) return NULL;
            v[k++] = (long)e->valuedouble;
        }
        return gr__canon_ints(c, v, k);
    }
    if (cJSON_IsArray(first)) {
        char **inner = (char **)gr__alloc(c, sizeof(char *) * (size_t)n);
        int k = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, j) {
            const cJSON *f = cJSON_GetArrayItem(e, 0);
            if (!cJSON_IsArray(e) || !cJSON_IsNumber(f)) return NULL;
            if ((inner[k++] = gr__json_canon(c, e)) == NULL) return NULL;
        }
        return gr__canon_nested(c, inner, k);
    }
    return NULL;
}

/* Short printable form of a JSON value ("[[0,4],[1,5],[2,6],[3,7]]" cut to cap). */
static char *gr__json_short(gr__ctx *c, const cJSON *j, size_t cap) {
    if (j == NULL) return gr__strdup(c, "(none)");
    char *p = cJSON_PrintUnformatted(j);
    if (p == NULL) return gr__strdup(c, "?");
    char *s = gr__strdup(c, p);
    free(p);
    if (strlen(s) > cap && cap > 3) strcpy(s + cap - 2, "..");
    return s;
}

// ---------------------------------------------------------------------------------------------
// >>predictions

static char *gr__trim(char *s) {
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

/* Removes a '#' comment (outside double quotes) from one line, in place. */
static void gr__strip_comment(char *line) {
    int in_str = 0;
    for (char *p = line; *p != '\0'; p++) {
        if (*p == '"' && (p == line || p[-1] != '\\')) in_str = !in_str;
        if (*p == '#' && !in_str) {
            *p = '\0';
            return;
        }
    }
}

/* A template value ("?", "[[..]]", "ok|hang|...") or nothing at all. */
static int gr__is_placeholder(const char *v) {
    while (isspace((unsigned char)*v))
        v++;
    return *v == '\0' || strchr(v, '?') != NULL || strstr(v, "..") != NULL ||
           strstr(v, "\xE2\x80\xA6") != NULL || strchr(v, '|') != NULL;
}

static int gr__key_line(const char *line, char *key, size_t cap, const char **value) {
    const char *p = line;
    if (!(isalpha((unsigned char)*p) || *p == '_')) return 0;
    size_t n = 0;
    while (isalnum((unsigned char)p[n]) || p[n] == '_')
        n++;
    size_t k = n;
    while (p[k] == ' ' || p[k] == '\t')
        k++;
    if (p[k] != ':' || n >= cap) return 0;
    memcpy(key, p, n);
    key[n] = '\0';
    *value = p + k + 1;
    return 1;
}

/* Parses "key: value" lines (continuation lines join the previous value). */
static void gr__parse_pred_block(gr__ctx *c, const gr__predblock *b, gr__pv **out, int *n,
                                 int *cap) {
    char *text = gr__strdup(c, b->text);
    int line = b->line;
    int first = *n; /* keys of this block start here: a key may repeat across blocks */
    gr__pv *last = NULL;
    for (char *ln = text; ln != NULL; line++) {
        char *nl = strchr(ln, '\n');
        if (nl != NULL) *nl = '\0';
        char *next = nl != NULL ? nl + 1 : NULL;
        gr__strip_comment(ln);
        char *t = gr__trim(ln);
        char key[64];
        const char *value;
        if (*t == '\0') {
            /* blank line: nothing */
        } else if (gr__key_line(t, key, sizeof key, &value)) {
            for (int i = first; i < *n; i++)
                if (strcmp((*out)[i].key, key) == 0)
                    gr__fail(c, MC_ERR_INVALID_DESC,
                             "answer sheet %s, line %d: the prediction key \"%s\" is given twice "
                             "in one pred block (first on line %d); keep one line per key",
                             c->answers_path != NULL ? c->answers_path : "(sheet)", line, key,
                             (*out)[i].line);
            last = GR__PUSH(c, *out, *n, *cap);
            memset(last, 0, sizeof *last);
            snprintf(last->key, sizeof last->key, "%s", key);
            last->value = gr__strdup(c, value);
            last->line = line;
            last->part = b->part;
        } else if (last != NULL) {
            gr__sb sb = {0};
            gr__sb_add(c, &sb, last->value);
            gr__sb_add(c, &sb, " ");
            gr__sb_add(c, &sb, t);
            last->value = sb.s;
        }
        ln = next;
    }
    for (int i = first; i < *n; i++) {
        (*out)[i].value = gr__trim((*out)[i].value);
        (*out)[i].placeholder = gr__is_placeholder((*out)[i].value);
    }
}

/* Hash input for one pred block: lines without comments and without any whitespace. */
static void gr__pred_normal_form(gr__ctx *c, const char *block, gr__sb *out) {
    char *text = gr__strdup(c, block);
    for (char *save = NULL, *ln = strtok_r(text, "\n", &save); ln != NULL;
         ln = strtok_r(NULL, "\n", &save)) {
        gr__strip_comment(ln);
        char compact[4096];
        size_t k = 0;
        for (char *p = ln; *p != '\0' && k + 1 < sizeof compact; p++)
            if (!isspace((unsigned char)*p)) compact[k++] = *p;
        compact[k] = '\0';
        if (k == 0) continue;
        gr__sb_add(c, out, compact);
        gr__sb_add(c, out, "\n");
    }
}

static uint64_t gr__fnv1a(const char *s, size_t n, uint64_t h) {
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static void gr__sheet_pred_hash(gr__ctx *c, char hex[17], int *n_filled) {
    gr__sb all = {0};
    *n_filled = 0;
    for (int i = 0; i < c->S.npb; i++) {
        gr__sb_add(c, &all, "--pred--\n");
        gr__pred_normal_form(c, c->S.pb[i].text, &all);
        gr__pv *pv = NULL;
        int n = 0, cap = 0, filled = 0;
        gr__parse_pred_block(c, &c->S.pb[i], &pv, &n, &cap);
        for (int k = 0; k < n; k++)
            filled |= !pv[k].placeholder;
        *n_filled += filled;
    }
    uint64_t h = gr__fnv1a(gr__sb_str(&all), all.len, 0xcbf29ce484222325ULL);
    snprintf(hex, 17, "%016llx", (unsigned long long)h);
}

/* JSON, or JSON with bare words quoted ({tp_rank: 1} and wrong_membership are accepted). */
static cJSON *gr__parse_value(gr__ctx *c, const char *v) {
    cJSON *j = cJSON_ParseWithOpts(v, NULL, 1);
    if (j != NULL) return gr__keep_json(c, j);
    gr__sb b = {0};
    int in_str = 0;
    for (size_t i = 0; v[i] != '\0';) {
        char ch = v[i];
        if (in_str) {
            gr__sb_addn(c, &b, &v[i], 1);
            if (ch == '\\' && v[i + 1] != '\0')
                gr__sb_addn(c, &b, &v[++i], 1);
            else if (ch == '"')
                in_str = 0;
            i++;
        } else if (ch == '"') {
            in_str = 1;
            gr__sb_addn(c, &b, &v[i++], 1);
        } else if (isalpha((unsigned char)ch) || ch == '_') {
            size_t j2 = i;   /* a bare word; dotted names (decoder.layers.2.mlp) are one */
            while (isalnum((unsigned char)v[j2]) || v[j2] == '_' || v[j2] == '-' ||
                   (v[j2] == '.' && isalnum((unsigned char)v[j2 + 1])))
                j2++;
            int literal = (j2 - i == 4 &&
                           (strncmp(v + i, "true", 4) == 0 || strncmp(v + i, "null", 4) == 0)) ||
                          (j2 - i == 5 && strncmp(v + i, "false", 5) == 0);
            if (!literal) gr__sb_add(c, &b, "\"");
            gr__sb_addn(c, &b, v + i, j2 - i);
            if (!literal) gr__sb_add(c, &b, "\"");
            i = j2;
        } else {
            gr__sb_addn(c, &b, &v[i++], 1);
        }
    }
    return gr__keep_json(c, cJSON_ParseWithOpts(gr__sb_str(&b), NULL, 1));
}

static int gr__json_bool(const cJSON *j, int *out) {
    if (cJSON_IsBool(j)) {
        *out = cJSON_IsTrue(j);
        return 1;
    }
    if (cJSON_IsString(j)) {
        const char *s = j->valuestring;
        if (!strcasecmp(s, "true") || !strcasecmp(s, "yes")) {
            *out = 1;
            return 1;
        }
        if (!strcasecmp(s, "false") || !strcasecmp(s, "no")) {
            *out = 0;
            return 1;
        }
    }
    return 0;
}

/* Equality used for object fields and exact items: numbers by value, strings without case,
   booleans also from yes/no, integer lists as sets, lists of lists as sets of sets. */
static int gr__loose_eq(gr__ctx *c, const cJSON *you, const cJSON *meas) {
    if (you == NULL || meas == NULL) return 0;
    if (cJSON_IsNumber(meas))
        return cJSON_IsNumber(you) && fabs(you->valuedouble - meas->valuedouble) <=
                                          1e-9 * fmax(1.0, fabs(meas->valuedouble));
    if (cJSON_IsBool(meas)) {
        int b;
        return gr__json_bool(you, &b) && b == cJSON_IsTrue(meas);
    }
    if (cJSON_IsString(meas))
        return cJSON_IsString(you) && strcasecmp(you->valuestring, meas->valuestring) == 0;
    if (cJSON_IsArray(meas)) {
        char *a = gr__json_canon(c, you), *b = gr__json_canon(c, meas);
        if (a != NULL && b != NULL) return strcmp(a, b) == 0;
    }
    return cJSON_Compare(you, meas, 1);
}

typedef struct gr__verdict {
    double frac;   /* fraction of the item's points */
    gr__sb detail; /* short */
    gr__sb more;   /* extra lines */
} gr__verdict;

static void gr__judge_groups(gr__ctx *c, const cJSON *you, const cJSON *meas, gr__verdict *v) {
    int nm = cJSON_GetArraySize(meas), ny = cJSON_IsArray(you) ? cJSON_GetArraySize(you) : 0;
    char **ym = (char **)gr__alloc(c, sizeof(char *) * (size_t)(ny + 1));
    int *used = (int *)gr__alloc(c, sizeof(int) * (size_t)(ny + 1));
    for (int i = 0; i < ny; i++) {
        const cJSON *g = cJSON_GetArrayItem(you, i);
        ym[i] = cJSON_IsArray(g) && cJSON_IsNumber(cJSON_GetArrayItem(g, 0)) ? gr__json_canon(c, g)
                                                                             : NULL;
    }
    if (ny == 0 || ym[0] == NULL) {
        v->frac = 0;
        gr__sb_add(c, &v->detail, "not a list of groups");
        gr__sb_add(c, &v->more, "write a list of rank lists, e.g. [[0,1],[2,3]]");
        return;
    }
    int exact = 0;
    const char *missed = NULL;
    for (int i = 0; i < nm; i++) {
        char *mg = gr__json_canon(c, cJSON_GetArrayItem(meas, i));
        int hit = 0;
        for (int k = 0; k < ny && !hit && mg != NULL; k++)
            if (!used[k] && ym[k] != NULL && strcmp(ym[k], mg) == 0) used[k] = hit = 1;
        exact += hit;
        if (!hit && missed == NULL) missed = mg;
    }
    const char *wrong = NULL;
    for (int k = 0; k < ny && wrong == NULL; k++)
        if (!used[k]) wrong = ym[k] != NULL ? ym[k] : "(not a list)";
    int denom = nm > ny ? nm : ny;
    double f = denom > 0 ? (double)exact / denom : 0;
    v->frac = f >= 1.0 ? 1.0 : f >= 0.5 ? 0.5 : 0.0;
    if (exact == nm && ny == nm) {
        gr__sb_printf(c, &v->detail, "%d/%d groups exact", exact, nm);
    } else {
        gr__sb_printf(c, &v->detail, "%d/%d exact (you: %s..; measured %s..)", exact, denom,
                      wrong != NULL ? wrong : "-", missed != NULL ? missed : "-");
        gr__sb_printf(c, &v->more, "measured: %s", gr__json_short(c, meas, 80));
    }
}

static void gr__judge_fields(gr__ctx *c, const cJSON *you, const cJSON *meas, const cJSON *spec,
                             gr__verdict *v) {
    const cJSON *fields = cJSON_GetObjectItemCaseSensitive(spec, "fields");
    int nf = cJSON_GetArraySize(fields), ok = 0;
    if (!cJSON_IsObject(you)) {
        gr__sb_add(c, &v->detail, "not an object {field: value}");
        return;
    }
    gr__sb wrong = {0};
    const cJSON *f;
    cJSON_ArrayForEach(f, fields) {
        if (!cJSON_IsString(f)) continue;
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(meas, f->valuestring);
        const cJSON *y = cJSON_GetObjectItemCaseSensitive(you, f->valuestring);
        if (gr__loose_eq(c, y, m)) {
            ok++;
        } else {
            gr__sb_printf(c, &wrong, "%s%s: you %s, measured %s", wrong.len ? "; " : "",
                          f->valuestring, y != NULL ? gr__json_short(c, y, 20) : "-",
                          gr__json_short(c, m, 20));
        }
    }
    /* "partial": [[4, 1.0], [3, 0.5]] = all four right earns all, three earn half. */
    double frac = ok == nf ? 1.0 : 0.0;
    const cJSON *partial = cJSON_GetObjectItemCaseSensitive(spec, "partial");
    if (partial != NULL) {
        frac = 0.0;
        const cJSON *row;
        cJSON_ArrayForEach(row, partial) {
            const cJSON *need = cJSON_GetArrayItem(row, 0), *give = cJSON_GetArrayItem(row, 1);
            if (cJSON_IsNumber(need) && cJSON_IsNumber(give) && ok >= need->valueint &&
                give->valuedouble > frac)
                frac = give->valuedouble;
        }
    } else if (ok == nf - 1 && nf > 1) {
        frac = 0.5;
    }
    v->frac = frac;
    gr__sb_printf(c, &v->detail, "%d/%d fields right", ok, nf);
    if (wrong.len) gr__sb_add(c, &v->more, gr__sb_str(&wrong));
}

static void gr__judge_scalar(gr__ctx *c, const char *type, const cJSON *you, const cJSON *meas,
                             const cJSON *spec, gr__verdict *v) {
    char *ys = gr__json_short(c, you, 30), *ms = gr__json_short(c, meas, 30);
    int ok = 0;
    if (strcmp(type, "int") == 0) {
        double y = cJSON_IsNumber(you)   ? you->valuedouble
                   : cJSON_IsString(you) ? strtod(you->valuestring, NULL)
                                         : NAN;
        ok = cJSON_IsNumber(meas) && y == meas->valuedouble;
    } else if (strcmp(type, "enum") == 0) {
        const cJSON *values = cJSON_GetObjectItemCaseSensitive(spec, "values");
        int known = values == NULL;
        const cJSON *e;
        cJSON_ArrayForEach(e, values) if (cJSON_IsString(e) && cJSON_IsString(you) &&
                                          !strcasecmp(e->valuestring, you->valuestring)) known = 1;
        if (!known) {
            gr__sb_printf(c, &v->detail, "%s is not a listed outcome", ys);
            gr__sb_add(c, &v->more, "allowed: ");
            cJSON_ArrayForEach(e, values) if (cJSON_IsString(e))
                gr__sb_printf(c, &v->more, "%s ", e->valuestring);
            return;
        }
        ok = cJSON_IsString(you) && cJSON_IsString(meas) &&
             !strcasecmp(you->valuestring, meas->valuestring);
    } else if (strcmp(type, "bool") == 0) {
        int b;
        ok = gr__json_bool(you, &b) && cJSON_IsBool(meas) && b == cJSON_IsTrue(meas);
    } else if (strcmp(type, "set") == 0 || strcmp(type, "exact") == 0) {
        ok = gr__loose_eq(c, you, meas);
    } else if (strcmp(type, "numeric") == 0) {
        double rel = gr__jnum(spec, "rel_tol", 0), abs_tol = gr__jnum(spec, "abs_tol", 0);
        if (cJSON_IsNumber(you) && cJSON_IsNumber(meas)) {
            double m = meas->valuedouble;
            ok = fabs(you->valuedouble - m) <= fmax(abs_tol, rel * fabs(m)) + 1e-12;
        }
    } else if (strcmp(type, "interval") == 0) {
        const cJSON *lo = cJSON_GetArrayItem(you, 0), *hi = cJSON_GetArrayItem(you, 1);
        if (!cJSON_IsArray(you) || cJSON_GetArraySize(you) != 2 || !cJSON_IsNumber(lo) ||
            !cJSON_IsNumber(hi) || !cJSON_IsNumber(meas)) {
            gr__sb_add(c, &v->detail, "write an interval [lo, hi]");
            return;
        }
        double l = lo->valuedouble, h = hi->valuedouble, m = meas->valuedouble;
        int contains = l <= m && m <= h;
        double ratio = l > 0 ? h / l : INFINITY;
        v->frac = !contains ? 0.0 : ratio <= 2.0 ? 1.0 : ratio <= 4.0 ? 0.5 : 0.0;
        gr__sb_printf(c, &v->detail, "%s, measured %s%s", ys, ms,
                      !contains     ? " (outside)"
                      : ratio > 4.0 ? " (hi/lo > 4: too wide)"
                      : ratio > 2.0 ? " (hi/lo > 2: half)"
                                    : "");
        return;
    } else {
        gr__sb_printf(c, &v->detail, "rubric type \"%s\" unknown", type);
        return;
    }
    v->frac = ok ? 1.0 : 0.0;
    gr__sb_printf(c, &v->detail, "%s, measured %s", ys, ms);
}

static void gr__judge(gr__ctx *c, const gr__pitem *it, const gr__pv *pv, gr__verdict *v) {
    const cJSON *meas = gr__path(c->results, it->path);
    if (pv == NULL) {
        gr__sb_add(c, &v->detail, "no prediction");
        gr__sb_printf(c, &v->more, "add the line \"%s: ...\" to the pred block", it->key);
        return;
    }
    if (pv->placeholder) {
        gr__sb_add(c, &v->detail, "not filled in");
        return;
    }
    if (meas == NULL || cJSON_IsNull(meas)) {
        gr__sb_printf(c, &v->detail, "not measured in this run");
        gr__sb_printf(c, &v->more, "the results have no %s (run the lab again)", it->path);
        return;
    }
    const cJSON *you = gr__parse_value(c, pv->value);
    if (you == NULL) {
        gr__sb_add(c, &v->detail, "could not read your value");
        gr__sb_printf(c, &v->more, "line %d: \"%.40s\" is not JSON or an enum word", pv->line,
                      pv->value);
        return;
    }
    if (strcmp(it->type, "groups") == 0)
        gr__judge_groups(c, you, meas, v);
    else if (strcmp(it->type, "fields") == 0)
        gr__judge_fields(c, you, meas, it->spec, v);
    else
        gr__judge_scalar(c, it->type, you, meas, it->spec, v);
}

// ---------------------------------------------------------------------------------------------
// >>ledger  the prediction ledger (see grader.h)

#define GR__LEDGER_FORMAT "megatron_c-prediction-ledger"
#define GR__LEDGER_VERSION 1

static const char *const gr__block_name[2] = {"main", "followup"};

/* "main/dp_size": the ledger's name of a key (the same key may stand in both blocks). */
static void gr__ledger_key(const gr__pv *pv, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", gr__block_name[pv->part == GR__PART_FOLLOWUP], pv->key);
}

/* The value as the ledger stores it: comments gone (already), whitespace removed, lower case
   (so "[[0, 1]]" and "[[0,1]]", or "OK" and "ok", are the same prediction). */
static char *gr__ledger_value(gr__ctx *c, const char *v) {
    size_t n = strlen(v), k = 0;
    char *o = (char *)gr__alloc(c, n + 1);
    for (size_t i = 0; i < n; i++)
        if (!isspace((unsigned char)v[i])) o[k++] = (char)tolower((unsigned char)v[i]);
    o[k] = '\0';
    return o;
}

/* Every filled prediction of the parsed sheet: {"main/dp_size": "2", ...}. */
static cJSON *gr__sheet_predictions(gr__ctx *c) {
    cJSON *o = gr__keep_json(c, cJSON_CreateObject());
    if (o == NULL) gr__fail(c, MC_ERR_NO_MEMORY, "grader: out of memory");
    gr__pv *pv = NULL;
    int n = 0, cap = 0;
    for (int i = 0; i < c->S.npb; i++)
        gr__parse_pred_block(c, &c->S.pb[i], &pv, &n, &cap);
    for (int i = 0; i < n; i++) {
        if (pv[i].placeholder) continue;
        char key[96];
        gr__ledger_key(&pv[i], key, sizeof key);
        cJSON_DeleteItemFromObjectCaseSensitive(o, key); /* two main blocks: the later wins */
        cJSON_AddStringToObject(o, key, gr__ledger_value(c, pv[i].value));
    }
    return o;
}

void gr_ledger_path_for(const char *results_path, char *out, size_t cap) {
    if (cap == 0) return;
    const char *r = results_path != NULL ? results_path : "results/lab.json";
    size_t n = strlen(r);
    if (n > 5 && strcmp(r + n - 5, ".json") == 0)
        snprintf(out, cap, "%.*s.ledger.json", (int)(n - 5), r);
    else
        snprintf(out, cap, "%s.ledger.json", r);
}

/* The ledger, or NULL when there is none at path. Anything unreadable or malformed fails:
   resetting it would unlock every nonce it holds. */
static cJSON *gr__ledger_load(gr__ctx *c, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT) return NULL;
        gr__fail(c, MC_ERR_IO, "prediction ledger %s cannot be read: %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode))
        gr__fail(c, MC_ERR_IO, "prediction ledger %s is not a regular file", path);
    size_t n = 0;
    int truncated = 0;
    char *text = gr__read_file(path, GR__MAX_JSON_BYTES, &n, &truncated);
    if (text == NULL)
        gr__fail(c, MC_ERR_IO, "prediction ledger %s cannot be read: %s", path, strerror(errno));
    cJSON *root = gr__keep_json(c, truncated ? NULL : cJSON_Parse(text));
    free(text);
    const char *why = NULL;
    if (root == NULL)
        why = truncated ? "it is larger than the grader reads" : "it is not valid JSON";
    else if (strcmp(gr__jstr(root, "format", ""), GR__LEDGER_FORMAT) != 0)
        why = "its \"format\" is not " GR__LEDGER_FORMAT;
    else if ((int)gr__jnum(root, "version", -1) != GR__LEDGER_VERSION)
        why = "its \"version\" is not 1 (written by another version of the labs?)";
    else if (!cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(root, "nonces")))
        why = "it has no \"nonces\" object";
    if (why == NULL) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(root, "nonces")) {
            if (!cJSON_IsObject(e) ||
                !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "locked_at")) ||
                !cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(e, "keys"))) {
                why = "an entry lacks \"locked_at\" or \"keys\"";
                break;
            }
        }
    }
    if (why != NULL)
        gr__fail(c, MC_ERR_INVALID_DESC,
                 "prediction ledger %s is corrupt: %s. It is never reset on its own; restore it "
                 "(e.g. from version control) or move it away, which forfeits every lock in it",
                 path, why);
    return root;
}

static void gr__ledger_write(gr__ctx *c, const char *path, const cJSON *root) {
    char *text = cJSON_Print(root);
    if (text == NULL) gr__fail(c, MC_ERR_NO_MEMORY, "grader: out of memory");
    gr__sb tb = {0};
    gr__sb_printf(c, &tb, "%s.tmp.%ld", path, (long)getpid());
    const char *tmp = gr__sb_str(&tb);
    FILE *f = fopen(tmp, "w");
    int ok = f != NULL && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    if (f != NULL && fclose(f) != 0) ok = 0;
    free(text);
    if (ok && rename(tmp, path) != 0) ok = 0;
    if (!ok) {
        int e = errno;
        remove(tmp);
        gr__fail(c, MC_ERR_IO, "cannot write the prediction ledger %s: %s", path, strerror(e));
    }
}

static void gr__utc_now(char *out, size_t cap) {
    time_t now = time(NULL);
    struct tm tm_utc;
    gmtime_r(&now, &tm_utc);
    if (strftime(out, cap, "%Y-%m-%dT%H:%M:%SZ", &tm_utc) == 0 && cap > 0) out[0] = '\0';
}

/* Keys whose value differs between the lock and now (added, changed or removed). */
static int gr__count_changed(const cJSON *locked, const cJSON *now, gr__sb *names, gr__ctx *c) {
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, now) {
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(locked, e->string);
        if (!cJSON_IsString(l) || strcmp(l->valuestring, e->valuestring) != 0) {
            if (n++ < 8) gr__sb_printf(c, names, "%s%s", names->len ? ", " : "", e->string);
        }
    }
    cJSON_ArrayForEach(e, locked) {
        if (cJSON_GetObjectItemCaseSensitive(now, e->string) == NULL)
            if (n++ < 8) gr__sb_printf(c, names, "%s%s (removed)", names->len ? ", " : "", e->string);
    }
    return n;
}

static int gr__nonce_ok(const char *nonce) {
    size_t n = nonce != NULL ? strlen(nonce) : 0;
    if (n == 0 || n > 16) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)nonce[i])) return 0;
    return 1;
}

/* The rubric's findings ("lock_when_filled": ["followup/faulty_module", ...]): keys a learner
   can only fill after looking at a run (a diagnosis). A finding absent from the lock is added
   at the first measured run that sees it filled; the lab keeps the answer hidden until then.
   Returns how many were locked now; their names go to *names. */
static int gr__lock_findings(gr__ctx *c, cJSON *entry, const cJSON *now, const char *when,
                             gr__sb *names) {
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(c->R.root, "lock_when_filled");
    cJSON *keys = cJSON_GetObjectItemCaseSensitive(entry, "keys");
    cJSON *late = cJSON_GetObjectItemCaseSensitive(entry, "late_locks");
    const cJSON *k;
    int n = 0;
    cJSON_ArrayForEach(k, list) {
        if (!cJSON_IsString(k)) continue;
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(now, k->valuestring);
        if (!cJSON_IsString(v) || cJSON_GetObjectItemCaseSensitive(keys, k->valuestring) != NULL)
            continue;
        cJSON_AddStringToObject(keys, k->valuestring, v->valuestring);
        if (late == NULL) late = cJSON_AddObjectToObject(entry, "late_locks");
        cJSON_AddStringToObject(late, k->valuestring, when);
        gr__sb_printf(c, names, "%s%s", names->len ? ", " : "", k->valuestring);
        n++;
    }
    return n;
}

static int gr__is_finding(const gr__ctx *c, const char *ledger_key) {
    const cJSON *k;
    cJSON_ArrayForEach(k, cJSON_GetObjectItemCaseSensitive(c->R.root, "lock_when_filled"))
        if (cJSON_IsString(k) && strcmp(k->valuestring, ledger_key) == 0) return 1;
    return 0;
}

static void gr__ledger_lock(gr__ctx *c, const char *ledger_path, const char *answers_path,
                            const char *nonce, gr_lock_info *info) {
    if (!gr__nonce_ok(nonce))
        gr__fail(c, MC_ERR_INVALID_ARG, "prediction ledger: the nonce \"%s\" is not 1-16 letters "
                 "or digits", nonce != NULL ? nonce : "(null)");
    c->answers_path = answers_path;
    size_t n = 0;
    int missing = 0;
    char *text = gr__read_sheet(c, answers_path, &n, NULL, &missing);
    if (!missing) gr__parse_sheet(c, text, n);
    cJSON *now = gr__sheet_predictions(c);
    cJSON *root = gr__ledger_load(c, ledger_path);
    if (root == NULL) {
        root = gr__keep_json(c, cJSON_CreateObject());
        if (root == NULL) gr__fail(c, MC_ERR_NO_MEMORY, "grader: out of memory");
        cJSON_AddStringToObject(root, "format", GR__LEDGER_FORMAT);
        cJSON_AddNumberToObject(root, "version", GR__LEDGER_VERSION);
        cJSON_AddStringToObject(root, "lab", c->R.lab != NULL ? c->R.lab : "");
        cJSON_AddObjectToObject(root, "nonces");
    }
    cJSON *nonces = cJSON_GetObjectItemCaseSensitive(root, "nonces");
    cJSON *entry = cJSON_GetObjectItemCaseSensitive(nonces, nonce);
    char when[32];
    gr__utc_now(when, sizeof when);
    if (entry == NULL) {
        entry = cJSON_AddObjectToObject(nonces, nonce);
        cJSON_AddStringToObject(entry, "locked_at", when);
        cJSON_AddStringToObject(entry, "answers_path", answers_path != NULL ? answers_path : "");
        cJSON_AddItemToObject(entry, "keys", cJSON_Duplicate(now, 1));
        cJSON_AddNumberToObject(entry, "runs", 1);
        cJSON_AddStringToObject(entry, "last_run_at", when);
        cJSON_AddNumberToObject(entry, "last_changed", 0);
        info->locked_now = 1;
        info->n_keys = cJSON_GetArraySize(now);
        info->n_changed = 0;
        snprintf(info->locked_at, sizeof info->locked_at, "%s", when);
        snprintf(info->message, sizeof info->message,
                 "predictions locked for nonce %s: %d key%s (first measured run, %s)%s", nonce,
                 info->n_keys, info->n_keys == 1 ? "" : "s", when,
                 info->n_keys == 0 ? "; none was filled in, so no prediction can earn points "
                                     "for this nonce"
                                   : "");
        const cJSON *findings = cJSON_GetObjectItemCaseSensitive(c->R.root, "lock_when_filled");
        if (info->n_keys == 0 && cJSON_GetArraySize(findings) > 0) {
            size_t used = strlen(info->message);
            snprintf(info->message + used, sizeof info->message - used,
                     " (its findings still lock when first filled)");
        }
    } else {
        gr__sb found = {0};
        int n_found = gr__lock_findings(c, entry, now, when, &found);
        const cJSON *keys = cJSON_GetObjectItemCaseSensitive(entry, "keys");
        gr__sb names = {0};
        info->locked_now = 0;
        info->n_keys = cJSON_GetArraySize(keys);
        info->n_changed = gr__count_changed(keys, now, &names, c);
        snprintf(info->locked_at, sizeof info->locked_at, "%s",
                 gr__jstr(entry, "locked_at", ""));
        cJSON_ReplaceItemInObjectCaseSensitive(
            entry, "runs", cJSON_CreateNumber(gr__jnum(entry, "runs", 1) + 1));
        cJSON_DeleteItemFromObjectCaseSensitive(entry, "last_run_at");
        cJSON_AddStringToObject(entry, "last_run_at", when);
        cJSON_DeleteItemFromObjectCaseSensitive(entry, "last_changed");
        cJSON_AddNumberToObject(entry, "last_changed", info->n_changed);
        if (info->n_changed == 0)
            snprintf(info->message, sizeof info->message,
                     "predictions for nonce %s were locked at %s (%d key%s); unchanged since",
                     nonce, info->locked_at, info->n_keys, info->n_keys == 1 ? "" : "s");
        else
            snprintf(info->message, sizeof info->message,
                     "predictions for nonce %s were locked at %s (%d key%s); %d differ%s now "
                     "and earn 0: %s",
                     nonce, info->locked_at, info->n_keys, info->n_keys == 1 ? "" : "s",
                     info->n_changed, info->n_changed == 1 ? "s" : "", gr__sb_str(&names));
        if (n_found > 0) {
            size_t used = strlen(info->message);
            snprintf(info->message + used, sizeof info->message - used,
                     "; locked now (findings): %.200s", gr__sb_str(&found));
        }
    }
    gr__ledger_write(c, ledger_path, root);
}

/* How the predictions of this sheet were locked, decided once per grading. */
enum { GR__LOCK_NONE, GR__LOCK_LEDGER, GR__LOCK_LEGACY };

typedef struct gr__lockstate {
    int mode;
    const char *ledger_path;
    const char *why_none;  /* GR__LOCK_NONE: why nothing counts */
    const cJSON *keys;     /* ledger: the locked values */
    const char *locked_at; /* ledger: the first run; legacy: the run */
    int legacy_ok;         /* legacy: hash recorded at the run equals the sheet's now */
    int legacy_present;    /* legacy: predictions were present at the run */
} gr__lockstate;

/* 1 when this prediction may be judged; else 0 with the reason in *why. */
static int gr__prediction_locked(gr__ctx *c, const gr__lockstate *L, const gr__pv *pv,
                                 gr__sb *why) {
    switch (L->mode) {
    case GR__LOCK_LEDGER: {
        char key[96];
        gr__ledger_key(pv, key, sizeof key);
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(L->keys, key);
        if (!cJSON_IsString(l) && gr__is_finding(c, key)) {
            gr__sb_printf(c, why, "not locked yet: a finding locks at the first run that sees it "
                          "filled (run the lab once more)");
            return 0;
        }
        if (!cJSON_IsString(l)) {
            gr__sb_printf(c, why, "not predicted before the first run at %s", L->locked_at);
            return 0;
        }
        if (strcmp(l->valuestring, gr__ledger_value(c, pv->value)) != 0) {
            gr__sb_printf(c, why, "changed since the first run at %s (locked: %.40s)",
                          L->locked_at, l->valuestring);
            return 0;
        }
        return 1;
    }
    case GR__LOCK_LEGACY:
        if (L->legacy_ok) return 1;
        if (!L->legacy_present)
            gr__sb_printf(c, why, "not predicted before the run at %s", L->locked_at);
        else
            gr__sb_printf(c, why, "changed since the run at %s (the pred blocks' hash differs)",
                          L->locked_at);
        return 0;
    default: gr__sb_add(c, why, L->why_none); return 0;
    }
}

// ---------------------------------------------------------------------------------------------
// >>concepts

static int gr__alt_at(const gr__alt *a, const gr__sent *s, int i) {
    if (i + a->npt > s->ntok) return 0;
    for (int j = 0; j < a->npt; j++) {
        const gr__tok *p = &a->pt[j], *t = &s->tok[i + j];
        if (p->kind != t->kind) return 0;
        if (p->kind == GR__T_WORD) {
            if (p->prefix ? strncmp(t->s, p->s, (size_t)p->len) != 0
                          : strcmp(t->stem, p->stem) != 0)
                return 0;
        } else if (strcmp(t->s, p->s) != 0) {
            return 0;
        }
    }
    return 1;
}

/* Token index of the first token starting at or after byte `off` (ntok if none). */
static int gr__tok_at(const gr__sent *s, size_t off) {
    int lo = 0, hi = s->ntok;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if ((size_t)(s->tok[mid].start + s->tok[mid].len) <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void gr__push_match(gr__ctx *c, gr__match **arr, int *n, int *cap, int start, int end,
                           int alt) {
    gr__match *m = GR__PUSH(c, *arr, *n, *cap);
    m->start = start;
    m->end = end;
    m->alt = alt;
    m->neg = 0;
}

static void gr__find_concept(gr__ctx *c, gr__sent *s, int k) {
    const gr__concept *cp = &c->R.concepts[k];
    gr__match *arr = NULL;
    int n = 0, cap = 0;
    for (int a = 0; a < cp->nalt; a++) {
        const gr__alt *alt = &cp->alt[a];
        if (!alt->is_re) {
            for (int i = 0; i + alt->npt <= s->ntok; i++)
                if (gr__alt_at(alt, s, i)) gr__push_match(c, &arr, &n, &cap, i, i + alt->npt, a);
            continue;
        }
        size_t len = strlen(s->norm), off = 0;
        regmatch_t m;
        while (off < len && regexec(alt->re, s->norm + off, 1, &m, off ? REG_NOTBOL : 0) == 0) {
            size_t b = off + (size_t)m.rm_so, e = off + (size_t)m.rm_eo;
            int ts = gr__tok_at(s, b), te = gr__tok_at(s, e > b ? e - 1 : b) + 1;
            if (te > s->ntok) te = s->ntok;
            if (ts < s->ntok) gr__push_match(c, &arr, &n, &cap, ts, te > ts ? te : ts + 1, a);
            off = e > b ? e : b + 1;
        }
    }
    s->cm[k] = arr;
    s->ncm[k] = n;
}

/* 1 when a negator (not, never, 不, 没有 ...) stands within the negation window before token
   `start`, not across a comma, and is not part of an exception ("不同", "not only"). */
static int gr__negated_at(const gr__ctx *c, const gr__sent *s, int start) {
    const gr__rubric *R = &c->R;
    for (int i = 0; i < s->ncm[R->c_neg]; i++) {
        const gr__match *ng = &s->cm[R->c_neg][i];
        if (ng->end > start) continue;
        int excepted = 0;
        for (int e = 0; e < s->ncm[R->c_neg_except] && !excepted; e++) {
            const gr__match *ex = &s->cm[R->c_neg_except][e];
            excepted = ex->start <= ng->start && ex->end > ng->start;
        }
        if (excepted) continue;
        double d = 0;
        int blocked = 0;
        for (int t = ng->end; t < start && !blocked; t++) {
            blocked = s->tok[t].barrier;
            d += gr__tok_weight(&s->tok[t]);
        }
        if (!blocked && d < R->rules.negation_window) return 1;
    }
    return 0;
}

static void gr__analyse_sentence(gr__ctx *c, gr__sent *s) {
    if (s->cm != NULL) return;
    int nk = c->R.nconcepts;
    s->cm = (gr__match **)gr__alloc(c, sizeof(gr__match *) * (size_t)nk);
    s->ncm = (int *)gr__alloc(c, sizeof(int) * (size_t)nk);
    if (s->ntok > (int)c->R.rules.max_sentence_tokens) return; /* ignored, no matches */
    gr__find_concept(c, s, c->R.c_neg);
    gr__find_concept(c, s, c->R.c_neg_except);
    for (int k = 0; k < nk; k++) {
        if (k == c->R.c_neg || k == c->R.c_neg_except) continue;
        gr__find_concept(c, s, k);
        for (int i = 0; i < s->ncm[k]; i++)
            s->cm[k][i].neg = gr__negated_at(c, s, s->cm[k][i].start);
    }
}

typedef struct gr__search {
    const gr__pat *p;
    const double *wpos;
    const int *barriers; /* barriers[i]: barrier tokens before token i */
    gr__match **cand;
    int *ncand;
    gr__match *chosen;
    int allow_neg;
    int budget;
} gr__search;

static int gr__dfs(gr__search *q, int slot, int minstart, int maxend) {
    if (slot == q->p->nslot) return 1;
    for (int i = 0; i < q->ncand[slot]; i++) {
        if (--q->budget < 0) return 0;
        const gr__match *x = &q->cand[slot][i];
        if (x->neg && !q->allow_neg) continue;
        if (q->p->ordered && slot > 0 && x->start < q->chosen[slot - 1].end) continue;
        int overlap = 0;
        for (int j = 0; j < slot && !overlap; j++)
            overlap = x->start < q->chosen[j].end && q->chosen[j].start < x->end;
        if (overlap) continue;
        int ms = x->start < minstart ? x->start : minstart;
        int me = x->end > maxend ? x->end : maxend;
        /* window: weighted distance from the first to the last token of the conjunction */
        if (q->p->window > 0 && q->wpos[me - 1] - q->wpos[ms] > q->p->window + 1e-9) continue;
        if (q->p->clause && q->barriers[me] - q->barriers[ms] > 0) continue;
        q->chosen[slot] = *x;
        if (gr__dfs(q, slot + 1, ms, me)) return 1;
    }
    return 0;
}

/* 0: no match; 1: the conjunction holds; 2: it holds only in negated form. */
static int gr__pattern_eval(gr__ctx *c, gr__sent *s, const gr__pat *p, int use_negation) {
    gr__analyse_sentence(c, s);
    for (int u = 0; u < p->nunless; u++)
        if (s->ncm[p->unless[u]] > 0) return 0;
    gr__match *cand[16];
    int ncand[16];
    gr__match chosen[16];
    if (p->nslot > 16) return 0;
    for (int sl = 0; sl < p->nslot; sl++) {
        int n = 0;
        for (int k = 0; k < p->slot[sl].n; k++)
            n += s->ncm[p->slot[sl].concepts[k]];
        if (n == 0) return 0;
        if (n > GR__MAX_CANDIDATES) n = GR__MAX_CANDIDATES;
        cand[sl] = (gr__match *)gr__alloc(c, sizeof(gr__match) * (size_t)n);
        ncand[sl] = 0;
        for (int k = 0; k < p->slot[sl].n; k++) {
            int ci = p->slot[sl].concepts[k];
            for (int i = 0; i < s->ncm[ci] && ncand[sl] < n; i++) {
                cand[sl][ncand[sl]] = s->cm[ci][i];
                if (!use_negation) cand[sl][ncand[sl]].neg = 0;
                ncand[sl]++;
            }
        }
    }
    gr__search q = {p, s->wpos, s->barriers, cand, ncand, chosen, 0, GR__SEARCH_BUDGET};
    if (gr__dfs(&q, 0, 1 << 30, -1)) return 1;
    q.allow_neg = 1;
    q.budget = GR__SEARCH_BUDGET;
    if (use_negation && gr__dfs(&q, 0, 1 << 30, -1)) return 2;
    return 0;
}

/* Best result over a list of patterns: 1 beats 2 beats 0. */
static int gr__patterns_eval(gr__ctx *c, gr__sent *s, const gr__pat *pats, int npat,
                             int use_negation) {
    int best = 0;
    for (int i = 0; i < npat && best != 1; i++) {
        int r = gr__pattern_eval(c, s, &pats[i], use_negation);
        if (r == 1 || (r == 2 && best == 0)) best = r;
    }
    return best;
}

// ---------------------------------------------------------------------------------------------
// >>prose  copy detection (n-grams of the prompt and rubric text), list sentences, density

static uint64_t gr__ngram_hash(gr__tok *const *t, int n) {
    uint64_t h = gr__fnv1a((const char *)&n, sizeof n, 0xcbf29ce484222325ULL);
    for (int i = 0; i < n; i++) {
        h = gr__fnv1a(t[i]->s, strlen(t[i]->s), h);
        h = gr__fnv1a("\x1f", 1, h);
    }
    return h | 1; /* 0 marks an empty slot */
}

static void gr__ngram_insert(gr__ctx *c, uint64_t h) {
    if ((c->ngram_n + 1) * 2 > c->ngram_cap) {
        size_t ncap = c->ngram_cap ? c->ngram_cap * 2 : 4096;
        uint64_t *nt = (uint64_t *)calloc(ncap, sizeof *nt);
        if (nt == NULL) gr__fail(c, MC_ERR_NO_MEMORY, "grader: out of memory");
        for (size_t i = 0; i < c->ngram_cap; i++) {
            if (c->ngram[i] == 0) continue;
            size_t k = c->ngram[i] & (ncap - 1);
            while (nt[k] != 0)
                k = (k + 1) & (ncap - 1);
            nt[k] = c->ngram[i];
        }
        free(c->ngram);
        c->ngram = nt;
        c->ngram_cap = ncap;
    }
    size_t k = h & (c->ngram_cap - 1);
    while (c->ngram[k] != 0) {
        if (c->ngram[k] == h) return;
        k = (k + 1) & (c->ngram_cap - 1);
    }
    c->ngram[k] = h;
    c->ngram_n++;
}

static int gr__ngram_has(const gr__ctx *c, uint64_t h) {
    if (c->ngram_cap == 0) return 0;
    size_t k = h & (c->ngram_cap - 1);
    while (c->ngram[k] != 0) {
        if (c->ngram[k] == h) return 1;
        k = (k + 1) & (c->ngram_cap - 1);
    }
    return 0;
}

/* Content tokens of a text (words, numbers, CJK characters) as pointers. */
static gr__tok **gr__content_tokens(gr__ctx *c, gr__tok *tok, int ntok, int *n) {
    gr__tok **out = (gr__tok **)gr__alloc(c, sizeof(gr__tok *) * (size_t)(ntok + 1));
    *n = 0;
    for (int i = 0; i < ntok; i++)
        if (gr__is_content(&tok[i])) out[(*n)++] = &tok[i];
    return out;
}

static void gr__add_prompt_text(gr__ctx *c, const char *text) {
    char *norm = gr__normalize(c, text, strlen(text));
    int ntok = 0, n = 0;
    gr__tok *tok = gr__tokenize(c, norm, 0, &ntok);
    gr__tok **ct = gr__content_tokens(c, tok, ntok, &n);
    for (int len = 2; len <= 5; len++)
        for (int i = 0; i + len <= n; i++)
            gr__ngram_insert(c, gr__ngram_hash(ct + i, len));
}

/* Every string of the rubric (prompts, template, needs, feedback) except the concept lists
   and language rules: a sentence made of these is a copy, not an answer. */
static void gr__add_prompt_json(gr__ctx *c, const cJSON *j, int depth) {
    if (j == NULL || depth > 16) return;
    if (cJSON_IsString(j) && j->valuestring != NULL) {
        gr__add_prompt_text(c, j->valuestring);
        return;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, j) {
        if (depth == 0 && e->string != NULL &&
            (!strcmp(e->string, "concepts") || !strcmp(e->string, "text") ||
             !strcmp(e->string, "parts")))
            continue;
        gr__add_prompt_json(c, e, depth + 1);
    }
}

static int gr__is_copy(gr__ctx *c, gr__sent *s) {
    int n = 0;
    gr__tok **ct = gr__content_tokens(c, s->tok, s->ntok, &n);
    if (n < 2) return 0;
    if (n < 5) return gr__ngram_has(c, gr__ngram_hash(ct, n));
    int hits = 0, total = 0;
    for (int i = 0; i + 5 <= n; i++, total++)
        hits += gr__ngram_has(c, gr__ngram_hash(ct + i, 5));
    return (double)hits >= c->R.rules.copy_overlap * total;
}

/* Distinct rubric terms in a sentence (alternatives of concepts that rubric points use). */
static int gr__distinct_terms(gr__ctx *c, const gr__sent *s) {
    const char *seen[64];
    int n = 0;
    for (int k = 0; k < c->R.nconcepts; k++) {
        if (!c->R.concepts[k].is_term) continue;
        for (int i = 0; i < s->ncm[k] && n < 64; i++) {
            const char *src = c->R.concepts[k].alt[s->cm[k][i].alt].src;
            int dup = 0;
            for (int j = 0; j < n && !dup; j++)
                dup = strcmp(seen[j], src) == 0;
            if (!dup) seen[n++] = src;
        }
    }
    return n;
}

/* Term occurrences: matches of term concepts, overlapping ones merged into one. */
static int gr__term_occurrences(gr__ctx *c, const gr__sent *s) {
    if (s->ntok == 0) return 0;
    int *maxend = (int *)gr__alloc(c, sizeof(int) * (size_t)s->ntok);
    for (int k = 0; k < c->R.nconcepts; k++) {
        if (!c->R.concepts[k].is_term) continue;
        for (int i = 0; i < s->ncm[k]; i++) {
            const gr__match *m = &s->cm[k][i];
            if (m->end > maxend[m->start]) maxend[m->start] = m->end;
        }
    }
    int occ = 0, cur_end = -1;
    for (int t = 0; t < s->ntok; t++) {
        if (maxend[t] == 0) continue;
        if (t >= cur_end) {
            occ++;
            cur_end = maxend[t];
        } else if (maxend[t] > cur_end) {
            cur_end = maxend[t];
        }
    }
    return occ;
}

enum { GR__IGN_NONE, GR__IGN_COPY, GR__IGN_LIST, GR__IGN_LONG };
static const char *const gr__ignore_reason[] = {"", "copies the prompt or rubric text",
                                                "a list of rubric terms without a connective",
                                                "too long to be one sentence"};

static void gr__classify(gr__ctx *c, gr__sent *s) {
    gr__analyse_sentence(c, s);
    if (s->ntok > (int)c->R.rules.max_sentence_tokens)
        s->ignored = GR__IGN_LONG;
    else if (gr__is_copy(c, s))
        s->ignored = GR__IGN_COPY;
    else if (gr__distinct_terms(c, s) >= (int)c->R.rules.list_min_terms &&
             s->ncm[c->R.c_connective] == 0)
        s->ignored = GR__IGN_LIST;
}

/* Printable excerpt of a sentence: at most ~60 columns, cut on a character boundary. */
static char *gr__excerpt(gr__ctx *c, const char *raw) {
    size_t n = strlen(raw), i = 0;
    int cols = 0;
    while (i < n && cols < 44) {
        ucs4_t uc;
        int m = u8_mbtouc(&uc, (const uint8_t *)raw + i, n - i);
        if (m <= 0) m = 1;
        cols += gr__is_cjk(uc) || (uc >= 0xFF00 && uc <= 0xFFEF) ? 2 : 1;
        i += (size_t)m;
    }
    gr__sb b = {0};
    gr__sb_add(c, &b, "\"");
    gr__sb_addn(c, &b, raw, i);
    gr__sb_add(c, &b, i < n ? " ...\"" : "\"");
    return b.s;
}

// ---------------------------------------------------------------------------------------------
// >>prose  items

static gr__item *gr__new_item(gr__ctx *c, const char *id, const char *kind, const char *tag,
                              int part, double max) {
    gr__item *it = GR__PUSH(c, c->items, c->nitems, c->capitems);
    memset(it, 0, sizeof *it);
    snprintf(it->id, sizeof it->id, "%s", id);
    it->kind = kind;
    it->tag = tag;
    it->part = part;
    it->max = max;
    it->detail = gr__strdup(c, "");
    return it;
}

static void gr__more(gr__ctx *c, gr__item *it, const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    gr__sb_add(c, &it->more, buf);
    gr__sb_add(c, &it->more, "\n");
}

static int gr__json_has_string(const cJSON *list, const char *s) {
    const cJSON *e;
    cJSON_ArrayForEach(e,
                       list) if (cJSON_IsString(e) && strcasecmp(e->valuestring, s) == 0) return 1;
    return 0;
}

static gr__sec *gr__sheet_section(gr__ctx *c, int rub) {
    for (int i = 0; i < c->S.nsec; i++)
        if (c->S.sec[i].rub == rub) return &c->S.sec[i];
    return NULL;
}

static int gr__variant_active(gr__ctx *c, const cJSON *variants) {
    return variants == NULL || gr__json_has_string(variants, c->variant);
}

/* Per rubric section: size, density, and the floor. */
typedef struct gr__secstat {
    gr__sec *sec;
    int n_ignored;     /* sentences ignored by the copy / list / length rules */
    int first_ignored; /* index of the first one */
    double words_eq;   /* English words + CJK characters / 2, over counted sentences */
    int words, cjk;
    int floor_ok;
    double density;
    int *misc_matched; /* per misconception: matched somewhere in this section */
} gr__secstat;

static void gr__section_stats(gr__ctx *c, gr__secstat *st) {
    gr__sec *sec = st->sec;
    int occ = 0;
    if (sec != NULL) {
        for (int i = 0; i < sec->nsent; i++) {
            gr__sent *s = &sec->sent[i];
            gr__classify(c, s);
            if (s->ignored) {
                if (st->n_ignored++ == 0) st->first_ignored = i;
                continue;
            }
            st->words += s->words;
            st->cjk += s->cjk;
            occ += gr__term_occurrences(c, s);
        }
    }
    st->words_eq = st->words + st->cjk / 2.0;
    st->floor_ok = st->words >= c->R.rules.floor_en_words ||
                   st->cjk >= c->R.rules.floor_cjk_chars ||
                   st->words_eq >= c->R.rules.floor_en_words;
    st->density = st->words_eq > 0 ? occ / st->words_eq : 0;
}

/* Why a section scores nothing: empty, everything ignored, or below the length floor. */
static const char *gr__floor_text(gr__ctx *c, const gr__secstat *st) {
    gr__sb b = {0};
    if (st->sec == NULL || st->sec->nsent == 0) {
        gr__sb_add(c, &b, "the section has no text");
        return b.s;
    }
    gr__sb_printf(c, &b,
                  "section has %d words / %d CJK characters; the floor is %.0f English words or "
                  "%.0f CJK characters",
                  st->words, st->cjk, c->R.rules.floor_en_words, c->R.rules.floor_cjk_chars);
    if (st->n_ignored > 0) {
        const gr__sent *s = &st->sec->sent[st->first_ignored];
        gr__sb_printf(c, &b, "\n%d sentence%s not counted, e.g. line %d: %s", st->n_ignored,
                      st->n_ignored == 1 ? "" : "s", s->line, gr__ignore_reason[s->ignored]);
    }
    return b.s;
}

static const char *gr__floor_label(const gr__secstat *st) {
    if (st->sec == NULL || st->sec->nsent == 0) return "section empty";
    if (st->words + st->cjk == 0) return "nothing gradable";
    return "below the length floor";
}

/* ---- misconceptions ---- */

typedef struct gr__mcstate {
    int fired;
    int line;
    int part;
    const char *excerpt;
    gr__sb why;
} gr__mcstate;

/* A bracketed group list attributed to a group kind ("DP group [0,1]") that this run did not
   measure for that kind. */
static int gr__wrong_claim(gr__ctx *c, gr__sent *s, const gr__misc *m, gr__sb *why) {
    gr__blist *lists = NULL;
    gr__num *nums = NULL;
    int nl = 0, lc = 0, nn = 0, nc = 0;
    gr__extract_values(c, s->norm, &lists, &nl, &lc, &nums, &nn, &nc);
    for (int li = 0; li < nl; li++) {
        int tokidx = gr__tok_at(s, lists[li].start);
        const gr__claimkind *best = NULL;
        const gr__match *bm = NULL;
        for (int k = 0; k < c->R.nclaims; k++) {
            const gr__claimkind *ck = &c->R.claims[k];
            for (int i = 0; i < s->ncm[ck->concept]; i++) {
                const gr__match *mt = &s->cm[ck->concept][i];
                if (mt->end > tokidx ||
                    s->wpos[tokidx] - s->wpos[mt->end] > c->R.rules.claim_distance)
                    continue;
                if (bm == NULL || mt->end > bm->end ||
                    (mt->end == bm->end && mt->start < bm->start)) {
                    bm = mt;
                    best = ck;
                }
            }
        }
        if (best == NULL || best->path == NULL || gr__negated_at(c, s, tokidx)) continue;
        int mine = 0;
        for (int k = 0; k < m->nclaims && !mine; k++)
        mine = m->claims[k] == best->concept;
        if (!mine) continue;
        const cJSON *meas = gr__path(c->results, best->path);
        if (!cJSON_IsArray(meas)) continue;
        for (int g = 0; g < lists[li].ninner; g++) {
            if (lists[li].inner_len[g] < 2) continue;
            int found = 0;
            const cJSON *e;
            cJSON_ArrayForEach(e, meas) {
                char *mg = gr__json_canon(c, e);
                if (mg != NULL && strcmp(mg, lists[li].inner[g]) == 0) found = 1;
            }
            if (!found) {
                gr__sb_printf(c, why, "%s group %s was not measured; measured %s = %s",
                              c->R.concepts[best->concept].id, lists[li].inner[g], best->path,
                              gr__json_short(c, meas, 60));
                return 1;
            }
        }
    }
    return 0;
}

static int gr__misc_in_scope(const gr__misc *m, const gr__rubric *R, int rub) {
    return m->scope == NULL || gr__json_has_string(m->scope, R->sec[rub].id);
}

static void gr__detect_misconceptions(gr__ctx *c, gr__secstat *stats, gr__mcstate *mcs) {
    const gr__rubric *R = &c->R;
    for (int mi = 0; mi < R->nmisc; mi++) {
        const gr__misc *m = &R->misc[mi];
        for (int r = 0; r < R->nsec; r++) {
            gr__sec *sec = stats[r].sec;
            if (sec == NULL || !gr__misc_in_scope(m, R, r)) continue;
            for (int i = 0; i < sec->nsent; i++) {
                gr__sent *s = &sec->sent[i];
                if (s->ignored) continue;
                gr__sb why = {0};
                int hit = 0;
                for (int p = 0; p < m->npat && !hit; p++) {
                    int res = gr__pattern_eval(c, s, &m->pat[p], 1);
                    hit = m->pat[p].negated ? res == 2 : res == 1;
                    if (hit && m->pat[p].negated)
                        gr__sb_add(c, &why, "negated form of a rubric statement");
                }
                if (!hit && m->nclaims > 0) hit = gr__wrong_claim(c, s, m, &why);
                if (!hit) continue;
                stats[r].misc_matched[mi] = 1;
                if (!mcs[mi].fired) {
                    mcs[mi].fired = 1;
                    mcs[mi].line = s->line;
                    mcs[mi].part = R->sec[r].part;
                    mcs[mi].excerpt = gr__excerpt(c, s->raw);
                    mcs[mi].why = why;
                }
            }
        }
    }
}

/* ---- explanation points ---- */

typedef struct gr__pstate {
    int active;
    int *cand; /* sentence indices with a positive match */
    int ncand, capcand;
    int neg_line; /* a sentence that matched only in negated form */
    int ign_line; /* an ignored sentence that would have matched */
    int ign_reason;
    int sent; /* assigned sentence, -1 if none */
} gr__pstate;

static int gr__kuhn(int p, gr__pstate *ps, int *owner, char *seen) {
    for (int i = 0; i < ps[p].ncand; i++) {
        int s = ps[p].cand[i];
        if (seen[s]) continue;
        seen[s] = 1;
        if (owner[s] < 0 || gr__kuhn(owner[s], ps, owner, seen)) {
            owner[s] = p;
            ps[p].sent = s;
            return 1;
        }
    }
    return 0;
}

static int gr__cmp_points_desc(const void *a, const void *b, void *arg) {
    const gr__point *pts = (const gr__point *)arg;
    double x = pts[*(const int *)a].points, y = pts[*(const int *)b].points;
    return (x < y) - (x > y);
}

static void gr__score_section_points(gr__ctx *c, int r, gr__secstat *st) {
    const gr__rubric *R = &c->R;
    gr__sec *sec = st->sec;
    int np = R->npoints;
    gr__pstate *ps = (gr__pstate *)gr__alloc(c, sizeof(gr__pstate) * (size_t)(np + 1));
    int *order = (int *)gr__alloc(c, sizeof(int) * (size_t)(np + 1));
    int nord = 0;
    double section_max = 0;
    for (int p = 0; p < np; p++) {
        const gr__point *pt = &R->points[p];
        ps[p].sent = -1;
        if (pt->section != r || !gr__variant_active(c, pt->variants)) continue;
        ps[p].active = 1;
        section_max += pt->points;
        order[nord++] = p;
        if (sec == NULL || !st->floor_ok) continue;
        for (int i = 0; i < sec->nsent; i++) {
            gr__sent *s = &sec->sent[i];
            if (s->ignored) {
                if (ps[p].ign_line == 0 && s->ignored != GR__IGN_LONG &&
                    gr__patterns_eval(c, s, pt->pat, pt->npat, pt->use_negation) == 1) {
                    ps[p].ign_line = s->line;
                    ps[p].ign_reason = s->ignored;
                }
                continue;
            }
            int res = gr__patterns_eval(c, s, pt->pat, pt->npat, pt->use_negation);
            if (res == 1)
                *GR__PUSH(c, ps[p].cand, ps[p].ncand, ps[p].capcand) = i;
            else if (res == 2 && ps[p].neg_line == 0)
                ps[p].neg_line = s->line;
        }
    }
    if (nord == 0) return;
    /* One point per sentence: a maximum matching, the heavier points tried first. */
    qsort_r(order, (size_t)nord, sizeof *order, gr__cmp_points_desc, R->points);
    if (sec != NULL && sec->nsent > 0) {
        int *owner = (int *)gr__alloc(c, sizeof(int) * (size_t)sec->nsent);
        char *seen = (char *)gr__alloc(c, (size_t)sec->nsent);
        for (int i = 0; i < sec->nsent; i++)
            owner[i] = -1;
        for (int k = 0; k < nord; k++) {
            memset(seen, 0, (size_t)sec->nsent);
            gr__kuhn(order[k], ps, owner, seen);
        }
    }
    double earned = 0;
    for (int p = 0; p < np; p++) {
        if (!ps[p].active || ps[p].sent < 0) continue;
        const gr__point *pt = &R->points[p];
        int contradicted = 0;
        for (int mi = 0; mi < R->nmisc && !contradicted; mi++)
            contradicted = st->misc_matched[mi] && gr__json_has_string(R->misc[mi].pairs, pt->id);
        if (!contradicted) earned += pt->points;
    }
    int capped =
        st->density > R->rules.density_cap && earned > R->rules.density_factor * section_max;
    double scale = capped ? R->rules.density_factor * section_max / earned : 1.0;
    for (int p = 0; p < np; p++) {
        if (!ps[p].active) continue;
        const gr__point *pt = &R->points[p];
        gr__item *it = gr__new_item(c, pt->id, "expl", "EXPL", R->sec[r].part, pt->points);
        if (sec == NULL) {
            it->detail = gr__strdup(c, "section missing");
            gr__more(c, it, "add the heading \"### %s %s\" and answer there", R->sec[r].id,
                     R->sec[r].title);
            continue;
        }
        if (!st->floor_ok) {
            it->detail = gr__strdup(c, gr__floor_label(st));
            gr__more(c, it, "%s", gr__floor_text(c, st));
            gr__more(c, it, "need: %s", pt->need);
            continue;
        }
        if (ps[p].sent < 0) {
            it->detail = gr__strdup(c, "not found");
            if (ps[p].ncand > 0) {
                gr__more(c, it,
                         "line %d matches, but that sentence already earned another point (one "
                         "point per sentence)",
                         sec->sent[ps[p].cand[0]].line);
            } else if (ps[p].neg_line > 0) {
                gr__more(c, it, "line %d matches only in negated form", ps[p].neg_line);
            } else if (ps[p].ign_line > 0) {
                gr__more(c, it, "line %d ignored: %s", ps[p].ign_line,
                         gr__ignore_reason[ps[p].ign_reason]);
            }
            gr__more(c, it, "need: %s", pt->need);
            continue;
        }
        const gr__sent *s = &sec->sent[ps[p].sent];
        it->line = s->line;
        gr__sb d = {0};
        gr__sb_printf(c, &d, "line %d %s", s->line, gr__excerpt(c, s->raw));
        it->detail = d.s;
        int contradicted = -1;
        for (int mi = 0; mi < R->nmisc && contradicted < 0; mi++)
            if (st->misc_matched[mi] && gr__json_has_string(R->misc[mi].pairs, pt->id))
                contradicted = mi;
        if (contradicted >= 0) {
            gr__more(c, it,
                     "contradicted: %s (%s) also appears in this section, so the point scores 0",
                     R->misc[contradicted].id, R->misc[contradicted].title);
            continue;
        }
        it->score = pt->points * scale;
        if (capped)
            gr__more(
                c, it,
                "section capped at %.0f%%: rubric terms are %.0f%% of its words (limit %.0f%%)",
                R->rules.density_factor * 100, st->density * 100, R->rules.density_cap * 100);
    }
}

/* ---- evidence ---- */

static int gr__num_matches(double quoted, int decimals, double measured) {
    if (decimals == 0) return fabs(quoted - measured) < 1e-9;
    return fabs(quoted - measured) <= 0.5 * pow(10.0, -decimals) + 1e-9;
}

static void gr__score_evidence(gr__ctx *c, const gr__evid *e, const gr__secstat *st) {
    const gr__rubric *R = &c->R;
    gr__item *it = gr__new_item(c, e->id, "evid", "EVID", R->sec[e->section].part, e->points);
    gr__sec *sec = st->sec;
    if (sec == NULL) {
        it->detail = gr__strdup(c, "section missing");
        gr__more(c, it, "add the heading \"### %s %s\"; need: %s", R->sec[e->section].id,
                 R->sec[e->section].title, e->need);
        return;
    }
    if (!st->floor_ok) {
        it->detail = gr__strdup(c, gr__floor_label(st));
        gr__more(c, it, "%s", gr__floor_text(c, st));
        gr__more(c, it, "need: %s", e->need);
        return;
    }
    gr__facts F = {0}, ign = {0};
    gr__flatten(c, gr__path(c->results, e->facts_path), &F, 0);
    const cJSON *p;
    cJSON_ArrayForEach(p, e->ignore_paths) if (cJSON_IsString(p))
        gr__flatten(c, gr__path(c->results, p->valuestring), &ign, 0);
    cJSON_ArrayForEach(p, e->ignore_numbers) if (cJSON_IsNumber(p))
        gr__facts_add_num(c, &ign, p->valuedouble);

    gr__sb ok = {0}, bad = {0};
    int nok = 0, nbad = 0, first_line = 0;
    const char *seen[256];
    int nseen = 0;
    for (int i = 0; i < sec->nsent; i++) {
        gr__sent *s = &sec->sent[i];
        if (s->ignored == GR__IGN_COPY || s->ignored == GR__IGN_LONG) continue;
        gr__blist *lists = NULL;
        gr__num *nums = NULL;
        int nl = 0, lc = 0, nn = 0, nc = 0;
        gr__extract_values(c, s->norm, &lists, &nl, &lc, &nums, &nn, &nc);
        for (int k = 0; k < nl + nn; k++) {
            const char *key;
            int verified = 0;
            if (k < nl) {
                key = lists[k].canon;
                for (int f = 0; f < F.nlist && !verified; f++)
                    verified = strcmp(F.list[f], key) == 0;
            } else {
                const gr__num *x = &nums[k - nl];
                int config = 0;
                for (int f = 0; f < ign.nnum && !config; f++)
                    config = fabs(ign.num[f] - x->v) < 1e-9;
                if (config) continue; /* configuration, not a measurement */
                key = gr__strdup(c, x->text);
                for (int f = 0; f < F.nnum && !verified; f++)
                    verified = gr__num_matches(x->v, x->decimals, F.num[f]);
            }
            int dup = 0;
            for (int j = 0; j < nseen && !dup; j++)
                dup = strcmp(seen[j], key) == 0;
            if (dup || nseen >= 256) continue;
            seen[nseen++] = key;
            gr__sb *dst = verified ? &ok : &bad;
            gr__sb_printf(c, dst, "%s\"%s\"", dst->len ? ", " : "", key);
            if (verified) {
                nok++;
                if (first_line == 0) first_line = s->line;
            } else {
                nbad++;
            }
        }
    }
    it->line = first_line;
    it->score = fmin(e->points, e->per_value * nok);
    gr__sb d = {0};
    gr__sb_printf(c, &d, "%d value%s quoted, %d verified", nok + nbad, nok + nbad == 1 ? "" : "s",
                  nok);
    it->detail = d.s;
    if (nok > 0) gr__more(c, it, "verified: %s", gr__sb_str(&ok));
    if (nbad > 0) gr__more(c, it, "value not from this run: %s", gr__sb_str(&bad));
    if (it->score < e->points) gr__more(c, it, "need: %s", e->need);
}

/* ---- quality ---- */

static void gr__score_quality(gr__ctx *c, const gr__quality *q, const gr__secstat *stats) {
    const gr__rubric *R = &c->R;
    gr__item *it = gr__new_item(c, q->id, "quality", "QUAL", q->part, q->points);
    gr__sb why = {0};
    const cJSON *sid;
    cJSON_ArrayForEach(sid, q->sections) {
        int r = cJSON_IsString(sid) ? gr__rsec_index(R, sid->valuestring) : -1;
        if (r < 0) continue;
        if (stats[r].sec == NULL)
            gr__sb_printf(c, &why, "%s missing; ", R->sec[r].id);
        else if (!stats[r].floor_ok)
            gr__sb_printf(c, &why, "%s below the length floor; ", R->sec[r].id);
    }
    for (int r = 0; r < R->nsec; r++) {
        if (R->sec[r].part != q->part) continue;
        for (int mi = 0; mi < R->nmisc; mi++)
            if (stats[r].misc_matched[mi])
                gr__sb_printf(c, &why, "%s in %s; ", R->misc[mi].id, R->sec[r].id);
    }
    if (why.len == 0) {
        it->score = q->points;
        it->detail = gr__strdup(c, "floors met, no misconception");
    } else {
        it->detail = gr__strdup(c, "not earned");
        gr__more(c, it, "%s", gr__sb_str(&why));
        gr__more(c, it, "need: %s", q->need);
    }
}

/* ---- predictions ---- */

static const gr__pv *gr__find_pv(const gr__pv *pv, int n, const char *key) {
    for (int i = 0; i < n; i++)
        if (strcmp(pv[i].key, key) == 0) return &pv[i];
    return NULL;
}

static void gr__score_prediction_group(gr__ctx *c, const cJSON *g, gr__pv *const *pv,
                                       const int *npv) {
    const char *gid = gr__jstr(g, "id", "P");
    int part = gr__part_from_name(gr__jstr(g, "part", "main"));
    if (part == GR__PART_OTHER) part = GR__PART_MAIN;
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(g, "items");
    const cJSON *byv = cJSON_GetObjectItemCaseSensitive(g, "by_variant");
    if (byv != NULL) items = cJSON_GetObjectItemCaseSensitive(byv, c->variant);
    if (!cJSON_IsArray(items)) {
        gr__item *it = gr__new_item(c, gid, "pred", "PRED", part, gr__jnum(g, "points", 0));
        it->detail = gr__strdup(c, "no items for this variant");
        gr__more(c, it, "the rubric has no prediction items for variant \"%s\"", c->variant);
        return;
    }
    const cJSON *x;
    cJSON_ArrayForEach(x, items) {
        gr__pitem pi;
        memset(&pi, 0, sizeof pi);
        snprintf(pi.key, sizeof pi.key, "%s", gr__jstr(x, "key", "?"));
        snprintf(pi.id, sizeof pi.id, "%.15s.%.31s", gid, pi.key);
        pi.type = gr__jstr(x, "type", "exact");
        pi.path = gr__jstr(x, "path", "");
        pi.points = gr__jnum(x, "points", 0);
        pi.spec = (cJSON *)x;
        gr__verdict v;
        memset(&v, 0, sizeof v);
        const gr__pv *val = gr__find_pv(pv[part], npv[part], pi.key);
        gr__item *it = gr__new_item(c, pi.id, "pred", "PRED", part, pi.points);
        it->line = val != NULL ? val->line : 0;
        gr__sb why = {0};
        if (val != NULL && !val->placeholder && !gr__prediction_locked(c, c->lock, val, &why)) {
            c->n_unlocked++;
            it->detail = gr__strdup(c, "0: not locked");
            gr__more(c, it, "%s", gr__sb_str(&why));
            continue;
        }
        gr__judge(c, &pi, val, &v);
        it->score = v.frac * pi.points;
        it->detail = gr__strdup(c, gr__sb_str(&v.detail));
        if (v.more.len) gr__more(c, it, "%s", gr__sb_str(&v.more));
    }
}

static void gr__score_predictions(gr__ctx *c) {
    gr__pv *pv[2] = {NULL, NULL};
    int npv[2] = {0, 0}, cap[2] = {0, 0};
    for (int i = 0; i < c->S.npb; i++) {
        int part = c->S.pb[i].part == GR__PART_FOLLOWUP ? 1 : 0;
        gr__parse_pred_block(c, &c->S.pb[i], &pv[part], &npv[part], &cap[part]);
    }
    const cJSON *g;
    cJSON_ArrayForEach(g, c->R.predictions) gr__score_prediction_group(c, g, pv, npv);
}

/* ---- penalties ---- */

static void gr__misconception_items(gr__ctx *c, const gr__mcstate *mcs) {
    const gr__rubric *R = &c->R;
    double left = R->rules.penalty_cap;
    for (int mi = 0; mi < R->nmisc; mi++) {
        const gr__misc *m = &R->misc[mi];
        int part = mcs[mi].fired ? mcs[mi].part : GR__PART_MAIN;
        if (!mcs[mi].fired && m->scope != NULL) { /* report it where it could have fired */
            int r = gr__rsec_index(R, cJSON_IsString(cJSON_GetArrayItem(m->scope, 0))
                                          ? cJSON_GetArrayItem(m->scope, 0)->valuestring
                                          : "");
            if (r >= 0) part = R->sec[r].part;
        }
        gr__item *it = gr__new_item(c, m->id, "misc", "MISC", part, 0);
        if (!mcs[mi].fired) {
            it->detail = gr__strdup(c, "did not fire");
            continue;
        }
        double pen = fmin(m->penalty, left);
        left -= pen;
        it->fired = 1;
        it->score = -pen;
        it->line = mcs[mi].line;
        gr__sb d = {0};
        gr__sb_printf(c, &d, "%s: line %d %s", m->title, mcs[mi].line, mcs[mi].excerpt);
        it->detail = d.s;
        if (mcs[mi].why.len) gr__more(c, it, "%s", gr__sb_str(&mcs[mi].why));
        gr__sb meas = {0};
        const cJSON *p;
        cJSON_ArrayForEach(p, m->refute) if (cJSON_IsString(p))
            gr__sb_printf(c, &meas, "%s%s=%s", meas.len ? "; " : "", p->valuestring,
                          gr__json_short(c, gr__path(c->results, p->valuestring), 50));
        if (meas.len) gr__more(c, it, "measured: %s", gr__sb_str(&meas));
        if (m->feedback[0]) gr__more(c, it, "%s", m->feedback);
        if (m->citation[0]) gr__more(c, it, "see %s", m->citation);
        if (pen < m->penalty)
            gr__more(c, it, "penalty reduced: the total is capped at %.2f", R->rules.penalty_cap);
    }
}

// ---------------------------------------------------------------------------------------------
// >>report

static int gr__display_width(const char *s) {
    int w = 0;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        ucs4_t uc;
        int m = u8_mbtouc(&uc, (const uint8_t *)s + i, n - i);
        if (m <= 0) m = 1;
        w += gr__is_cjk(uc) || (uc >= 0xFF00 && uc <= 0xFFEF) || (uc >= 0x3000 && uc <= 0x303F) ? 2
                                                                                                : 1;
        i += (size_t)m;
    }
    return w;
}

static void gr__dots(gr__ctx *c, gr__sb *out, int from, int to) {
    gr__sb_add(c, out, " ");
    for (int i = from + 1; i < to - 1; i++)
        gr__sb_add(c, out, ".");
    gr__sb_add(c, out, " ");
}

static void gr__print_item(gr__ctx *c, gr__sb *out, const gr__item *it) {
    gr__sb row = {0};
    gr__sb_printf(c, &row, "[%s] %s", it->tag, it->id);
    int col = gr__display_width(gr__sb_str(&row));
    if (col < 34) {
        gr__dots(c, &row, col, 35);
        col = 35;
    } else {
        gr__sb_add(c, &row, " ");
        col++;
    }
    gr__sb_add(c, &row, it->detail);
    col += gr__display_width(it->detail);
    char score[32];
    if (strcmp(it->kind, "misc") == 0)
        snprintf(score, sizeof score, "%.2f", it->score == 0 ? 0.0 : it->score);
    else
        snprintf(score, sizeof score, "%.2f/%.2f", it->score, it->max);
    int target = GR__TABLE_WIDTH - (int)strlen(score);
    if (col + 2 < target)
        gr__dots(c, &row, col, target);
    else
        gr__sb_add(c, &row, " ");
    gr__sb_add(c, &row, score);
    gr__sb_add(c, out, gr__sb_str(&row));
    gr__sb_add(c, out, "\n");
    const char *m = gr__sb_str(&it->more);
    while (*m != '\0') {
        const char *nl = strchr(m, '\n');
        size_t len = nl != NULL ? (size_t)(nl - m) : strlen(m);
        gr__sb_add(c, out, "       ");
        gr__sb_addn(c, out, m, len);
        gr__sb_add(c, out, "\n");
        m += len + (nl != NULL);
    }
}

static void gr__print_part(gr__ctx *c, gr__sb *out, int part) {
    static const char *const kinds[] = {"pred", "expl", "evid", "quality", "misc"};
    int fired = 0, nmisc = 0;
    for (int k = 0; k < 5; k++) {
        for (int i = 0; i < c->nitems; i++) {
            const gr__item *it = &c->items[i];
            if (it->part != part || strcmp(it->kind, kinds[k]) != 0) continue;
            if (strcmp(it->kind, "misc") == 0) {
                nmisc++;
                if (!it->fired) continue;
                fired++;
            }
            gr__print_item(c, out, it);
        }
    }
    if (nmisc > 0 && fired == 0) gr__sb_add(c, out, "[MISC] no misconception fired\n");
}

static char *gr__config_line(gr__ctx *c) {
    gr__sb b = {0};
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(c->results, "config");
    const cJSON *f;
    cJSON_ArrayForEach(f, c->R.header_fields) {
        if (!cJSON_IsString(f)) continue;
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, f->valuestring);
        if (cJSON_IsNumber(v))
            gr__sb_printf(c, &b, " %s=%g", f->valuestring, v->valuedouble);
        else if (cJSON_IsString(v))
            gr__sb_printf(c, &b, " %s=%s", f->valuestring, v->valuestring);
    }
    return b.s != NULL ? b.s : gr__strdup(c, "");
}

typedef struct gr__totals {
    double main, main_max, fu, fu_max, penalty;
    int locked, filled, near_empty, unlocked;
} gr__totals;

static double gr__round2(double x) { return floor(x * 100.0 + 0.5 + 1e-9) / 100.0; }

static void gr__sum(gr__ctx *c, gr__totals *t) {
    double pos[2] = {0, 0}, pen[2] = {0, 0};
    for (int i = 0; i < c->nitems; i++) {
        const gr__item *it = &c->items[i];
        int p = it->part == GR__PART_FOLLOWUP ? 1 : 0;
        if (it->score < 0)
            pen[p] += -it->score;
        else
            pos[p] += it->score;
    }
    t->main = gr__round2(fmax(0.0, pos[0] - pen[0]));
    t->fu = gr__round2(fmax(0.0, pos[1] - pen[1]));
    t->penalty = pen[0] + pen[1];
    t->main_max = c->R.max_main;
    t->fu_max = c->R.max_followup;
}

static void gr__print_report(gr__ctx *c, FILE *out, const gr__totals *t) {
    if (out == NULL) return;
    gr__sb b = {0};
    const gr__rubric *R = &c->R;
    gr__sb_printf(c, &b, "%s / %s %s  nonce=%s probe=%s followup=%s  locked=%s\n", R->lab,
                  R->question, gr__config_line(c), gr__jstr(c->results, "nonce", "?"),
                  gr__json_short(c, cJSON_GetObjectItemCaseSensitive(c->results, "probe_rank"), 8),
                  c->variant[0] ? c->variant : "?",
                  t->locked   ? "yes"
                  : t->filled ? "NO"
                              : "no (no predictions)");
    if (t->unlocked > 0 || (t->filled > 0 && c->lock->mode == GR__LOCK_NONE))
        gr__sb_printf(c, &b,
                      "PREDICTIONS NOT LOCKED: %d prediction%s earn 0 (absent at the first "
                      "measured run or changed since; see [PRED] lines)\n",
                      t->unlocked, t->unlocked == 1 ? "" : "s");
    else if (c->lock->mode == GR__LOCK_LEDGER)
        gr__sb_printf(c, &b, "predictions locked at %s (ledger %s)\n", c->lock->locked_at,
                      c->lock->ledger_path);
    if (c->warnings.len) gr__sb_add(c, &b, gr__sb_str(&c->warnings));
    gr__print_part(c, &b, GR__PART_MAIN);
    const cJSON *var = cJSON_GetObjectItemCaseSensitive(R->variants, c->variant);
    gr__sb sep = {0};
    gr__sb_printf(c, &sep, "-- follow-up %s: %s ", c->variant, gr__jstr(var, "title", ""));
    while (gr__display_width(gr__sb_str(&sep)) < GR__TABLE_WIDTH)
        gr__sb_add(c, &sep, "-");
    gr__sb_printf(c, &b, "%s\n", gr__sb_str(&sep));
    gr__print_part(c, &b, GR__PART_FOLLOWUP);
    for (int i = 0; i < GR__TABLE_WIDTH; i++)
        gr__sb_add(c, &b, "-");
    gr__sb_printf(c, &b, "\nMain %.2f/%g   Follow-up %.2f/%g", t->main, t->main_max, t->fu,
                  t->fu_max);
    if (t->penalty > 0) gr__sb_printf(c, &b, "   (penalties -%.2f included)", t->penalty);
    gr__sb_printf(c, &b, "   heuristic grader; rubric %s%s%s\n", R->version,
                  R->source_version[0] ? ", " : "", R->source_version);
    if (t->near_empty) {
        const cJSON *l;
        gr__sb_add(c, &b, "\nWhat to do next:\n");
        cJSON_ArrayForEach(
            l, cJSON_GetObjectItemCaseSensitive(R->root, "next_steps")) if (cJSON_IsString(l))
            gr__sb_printf(c, &b, "  %s\n", l->valuestring);
        gr__sb_add(c, &b, "\n");
    }
    gr__sb_printf(c, &b, "Total %.2f/%g\n", gr__round2(t->main + t->fu), t->main_max + t->fu_max);
    fputs(gr__sb_str(&b), out);
    fflush(out);
}

static char *gr__item_output(gr__ctx *c, const gr__item *it) {
    gr__sb b = {0};
    gr__sb_add(c, &b, it->detail);
    if (it->more.len) {
        gr__sb_add(c, &b, "\n");
        gr__sb_add(c, &b, gr__sb_str(&it->more));
        while (b.len > 0 && b.s[b.len - 1] == '\n')
            b.s[--b.len] = '\0';
    }
    return b.s;
}

static void gr__write_grade_json(gr__ctx *c, const char *path, const gr__totals *t) {
    if (path == NULL) return;
    cJSON *root = gr__keep_json(c, cJSON_CreateObject());
    if (root == NULL) gr__fail(c, MC_ERR_NO_MEMORY, "grader: out of memory");
    cJSON_AddStringToObject(root, "lab", c->R.lab);
    cJSON_AddStringToObject(root, "question", c->R.question);
    cJSON_AddStringToObject(root, "rubric_version", c->R.version);
    cJSON_AddNumberToObject(root, "score", gr__round2(t->main + t->fu));
    cJSON_AddNumberToObject(root, "max_score", t->main_max + t->fu_max);
    cJSON *m = cJSON_AddObjectToObject(root, "main");
    cJSON_AddNumberToObject(m, "score", t->main);
    cJSON_AddNumberToObject(m, "max_score", t->main_max);
    cJSON *f = cJSON_AddObjectToObject(root, "followup");
    cJSON_AddNumberToObject(f, "score", t->fu);
    cJSON_AddNumberToObject(f, "max_score", t->fu_max);
    cJSON_AddStringToObject(f, "variant", c->variant);
    cJSON_AddNumberToObject(root, "penalties", gr__round2(t->penalty));
    cJSON_AddBoolToObject(root, "predictions_locked", t->locked);
    cJSON_AddStringToObject(root, "nonce", gr__jstr(c->results, "nonce", ""));
    cJSON_AddStringToObject(root, "visibility", "visible");
    cJSON *tests = cJSON_AddArrayToObject(root, "tests");
    for (int i = 0; i < c->nitems; i++) {
        const gr__item *it = &c->items[i];
        cJSON *o = cJSON_CreateObject();
        if (o == NULL) gr__fail(c, MC_ERR_NO_MEMORY, "grader: out of memory");
        cJSON_AddItemToArray(tests, o);
        cJSON_AddStringToObject(o, "name", it->id);
        cJSON_AddStringToObject(o, "kind", it->kind);
        cJSON_AddStringToObject(o, "part", gr__part_name[it->part == GR__PART_FOLLOWUP]);
        cJSON_AddNumberToObject(o, "score", gr__round2(it->score));
        cJSON_AddNumberToObject(o, "max_score", it->max);
        if (it->line > 0) cJSON_AddNumberToObject(o, "line", it->line);
        cJSON_AddStringToObject(o, "output", gr__item_output(c, it));
    }
    char *text = cJSON_Print(root);
    if (text == NULL) gr__fail(c, MC_ERR_NO_MEMORY, "grader: out of memory");
    FILE *fp = fopen(path, "w");
    if (fp == NULL) {
        free(text);
        gr__warn(c, "warning: cannot write %s", path);
        return;
    }
    fputs(text, fp);
    fputs("\n", fp);
    fclose(fp);
    free(text);
}

static int gr__fill_report(gr__ctx *c, gr_report *r, const gr__totals *t) {
    memset(r, 0, sizeof *r);
    r->main_score = t->main;
    r->main_max = t->main_max;
    r->followup_score = t->fu;
    r->followup_max = t->fu_max;
    r->total = gr__round2(t->main + t->fu);
    r->total_max = t->main_max + t->fu_max;
    r->penalty_total = gr__round2(t->penalty);
    r->locked = t->locked;
    r->n_pred_unlocked = t->unlocked;
    r->predictions_filled = t->filled;
    r->near_empty = t->near_empty;
    snprintf(r->nonce, sizeof r->nonce, "%s", gr__jstr(c->results, "nonce", ""));
    r->probe_rank = (int)gr__jnum(c->results, "probe_rank", -1);
    snprintf(r->variant, sizeof r->variant, "%s", c->variant);
    r->items = (gr_item *)calloc((size_t)(c->nitems + 1), sizeof(gr_item));
    if (r->items == NULL) return MC_ERR_NO_MEMORY;
    for (int i = 0; i < c->nitems; i++) {
        const gr__item *it = &c->items[i];
        gr_item *o = &r->items[i];
        snprintf(o->id, sizeof o->id, "%s", it->id);
        snprintf(o->kind, sizeof o->kind, "%s", it->kind);
        snprintf(o->part, sizeof o->part, "%s", gr__part_name[it->part == GR__PART_FOLLOWUP]);
        o->score = it->score;
        o->max_score = it->max;
        o->line = it->line;
        o->fired = it->fired;
        o->output = strdup(gr__item_output(c, it));
        r->n_items = i + 1;
        if (o->output == NULL) return MC_ERR_NO_MEMORY;
    }
    return MC_OK;
}

// ---------------------------------------------------------------------------------------------
// >>api

static void gr__load_results(gr__ctx *c, const char *path) {
    size_t n = 0;
    char *text = gr__read_file(path, GR__MAX_JSON_BYTES, &n, NULL);
    const char *run = gr__jstr(c->R.root, "run_command", "the lab");
    if (text == NULL)
        gr__fail(
            c, MC_ERR_IO,
            "%s not found: run `%s` first (it measures the facts this sheet is graded against)",
            path != NULL ? path : "(results path not given)", run);
    c->results = gr__keep_json(c, cJSON_Parse(text));
    free(text);
    if (c->results == NULL)
        gr__fail(c, MC_ERR_IO, "%s is not valid JSON: run `%s` again", path, run);
    c->facts = cJSON_GetObjectItemCaseSensitive(c->results, "facts");
    if (!cJSON_IsObject(c->facts))
        gr__fail(c, MC_ERR_IO, "%s has no \"facts\" object: run `%s` again", path, run);
}

static void gr__pick_variant(gr__ctx *c) {
    const char *v = gr__jstr(c->results, "followup_variant", NULL);
    if (v == NULL) v = gr__jstr(gr__path(c->results, "facts.followup"), "variant", NULL);
    if (v == NULL && c->S.has_header) v = c->S.variant;
    snprintf(c->variant, sizeof c->variant, "%s", v != NULL ? v : "");
    if (c->S.has_header && c->S.variant[0] && strcmp(c->S.variant, c->variant) != 0)
        gr__warn(c,
                 "warning: the sheet's follow-up is %s but the run measured %s; the follow-up is "
                 "graded as %s",
                 c->S.variant, c->variant, c->variant);
    const char *rn = gr__jstr(c->results, "nonce", NULL);
    if (c->S.has_header && rn != NULL && strcmp(rn, c->S.nonce) != 0)
        gr__warn(c,
                 "warning: the sheet's nonce %s differs from the run's nonce %s (results of "
                 "another sheet?)",
                 c->S.nonce, rn);
    const char *rv = gr__jstr(c->results, "rubric_version", NULL);
    if (rv != NULL && strcmp(rv, c->R.version) != 0)
        gr__warn(c, "warning: results were written for rubric %s, grading with %s", rv,
                 c->R.version);
}

/* Decides how predictions are checked: the ledger when there is one (results format 2, or
   any results with a ledger beside them), else the hash a format-1 results file recorded at
   its run. The header line reports the outcome. */
static void gr__lock_state(gr__ctx *c, const char *ledger_path, gr__totals *t) {
    gr__lockstate *L = (gr__lockstate *)gr__alloc(c, sizeof *L);
    c->lock = L;
    L->ledger_path = ledger_path;
    char hex[17];
    gr__sheet_pred_hash(c, hex, &t->filled);
    const char *nonce = gr__jstr(c->results, "nonce", "");
    int format = (int)gr__jnum(c->results, "results_format", 1);
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(c->results, "predictions");
    cJSON *ledger = gr__ledger_load(c, ledger_path);
    if (ledger != NULL || format >= 2) {
        const cJSON *entry = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(ledger, "nonces"), nonce);
        if (entry != NULL) {
            L->mode = GR__LOCK_LEDGER;
            L->keys = cJSON_GetObjectItemCaseSensitive(entry, "keys");
            L->locked_at = gr__jstr(entry, "locked_at", "?");
            return;
        }
        gr__sb why = {0};
        gr__sb_printf(c, &why,
                      ledger == NULL ? "no prediction ledger at %s: nothing was locked before a "
                                       "measured run (run the lab; its first run locks them)"
                                     : "the ledger %s has no lock for nonce %s (run the lab for "
                                       "this sheet; its first run locks the predictions)",
                      ledger_path, nonce);
        L->mode = GR__LOCK_NONE;
        L->why_none = why.s;
        return;
    }
    const char *stored = gr__jstr(pr, "hash", NULL);
    if (stored == NULL) {
        L->mode = GR__LOCK_NONE;
        L->why_none = gr__strdup(c, "the results record no predictions (run the lab again)");
        return;
    }
    L->mode = GR__LOCK_LEGACY;
    L->legacy_present = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pr, "present_at_run"));
    L->legacy_ok = L->legacy_present && strcasecmp(stored, hex) == 0;
    L->locked_at = gr__jstr(pr, "time", "?");
}

/* GR_GRADE_DEBUG=1: per-section sizes and densities, and every sentence with its concepts, on
   stderr (for writing rubrics and fixtures). */
static void gr__debug_sections(gr__ctx *c, const gr__secstat *stats) {
    const gr__rubric *R = &c->R;
    for (int r = 0; r < R->nsec; r++) {
        const gr__sec *sec = stats[r].sec;
        fprintf(stderr, "[debug] %s: %d words, %d cjk, density %.2f, floor %s\n", R->sec[r].id,
                stats[r].words, stats[r].cjk, stats[r].density,
                stats[r].floor_ok ? "ok" : "NOT met");
        for (int i = 0; sec != NULL && i < sec->nsent; i++) {
            const gr__sent *s = &sec->sent[i];
            fprintf(stderr, "[debug]   line %d%s%s:", s->line, s->ignored ? " IGNORED " : "",
                    gr__ignore_reason[s->ignored]);
            for (int k = 0; k < R->nconcepts; k++)
                if (s->ncm != NULL && s->ncm[k] > 0)
                    fprintf(stderr, " %s%s", R->concepts[k].id, s->cm[k][0].neg ? "(neg)" : "");
            fprintf(stderr, "\n");
        }
    }
}

static void gr__grade_all(gr__ctx *c, const gr_grade_desc *d, FILE *out, gr_report *report) {
    gr__load_rubric(c, d->rubric_path);
    gr__load_results(c, d->results_path);
    size_t n = 0;
    int truncated = 0, missing = 0;
    c->answers_path = d->answers_path;
    char *text = gr__read_sheet(c, d->answers_path, &n, &truncated, &missing);
    if (!missing) {
        if (truncated)
            gr__warn(c, "warning: %s is larger than %zu bytes; only the start is graded",
                     d->answers_path, n);
        gr__parse_sheet(c, text, n);
    } else {
        gr__warn(c, "no answer sheet at %s: run `%s --init` to create it",
                 d->answers_path ? d->answers_path : "(none)",
                 gr__jstr(c->R.root, "lab_binary", "./lab"));
    }
    gr__pick_variant(c);
    gr__add_prompt_json(c, c->R.root, 0);

    gr__totals t;
    memset(&t, 0, sizeof t);
    char ledger_path[4200];
    if (d->ledger_path != NULL)
        snprintf(ledger_path, sizeof ledger_path, "%s", d->ledger_path);
    else
        gr_ledger_path_for(d->results_path, ledger_path, sizeof ledger_path);
    gr__lock_state(c, gr__strdup(c, ledger_path), &t);
    gr__score_predictions(c);
    t.unlocked = c->n_unlocked;
    t.locked = t.filled > 0 && c->n_unlocked == 0 && c->lock->mode != GR__LOCK_NONE;

    const gr__rubric *R = &c->R;
    gr__secstat *stats = (gr__secstat *)gr__alloc(c, sizeof(gr__secstat) * (size_t)(R->nsec + 1));
    double written = 0;
    for (int r = 0; r < R->nsec; r++) {
        stats[r].sec = gr__sheet_section(c, r);
        stats[r].misc_matched = (int *)gr__alloc(c, sizeof(int) * (size_t)(R->nmisc + 1));
        gr__section_stats(c, &stats[r]);
        written += stats[r].words_eq;
        if (stats[r].sec != NULL && stats[r].sec->dropped > 0)
            gr__warn(c, "warning: section %s has more than %d sentences; the rest is not graded",
                     R->sec[r].id, GR__MAX_SENTENCES_PER_SECTION);
    }
    if (getenv("GR_GRADE_DEBUG") != NULL) gr__debug_sections(c, stats);
    gr__mcstate *mcs = (gr__mcstate *)gr__alloc(c, sizeof(gr__mcstate) * (size_t)(R->nmisc + 1));
    gr__detect_misconceptions(c, stats, mcs);
    for (int r = 0; r < R->nsec; r++)
        gr__score_section_points(c, r, &stats[r]);
    for (int e = 0; e < R->nevid; e++)
        gr__score_evidence(c, &R->evid[e], &stats[R->evid[e].section]);
    for (int q = 0; q < R->nquality; q++)
        gr__score_quality(c, &R->quality[q], stats);
    gr__misconception_items(c, mcs);

    gr__sum(c, &t);
    t.near_empty = t.filled == 0 && written < R->rules.floor_en_words;
    gr__print_report(c, out, &t);
    gr__write_grade_json(c, d->grade_out_path, &t);
    if (report != NULL) {
        int rc = gr__fill_report(c, report, &t);
        if (rc != MC_OK) {
            gr_report_free(report);
            gr__fail(c, rc, "grader: out of memory");
        }
    }
}

int gr_grade(const gr_grade_desc *desc, gr_report *report) {
    if (report != NULL) memset(report, 0, sizeof *report);
    if (desc == NULL) return MC_ERR_INVALID_ARG;
    FILE *out = desc->quiet ? NULL : desc->out != NULL ? desc->out : stdout;
    gr__ctx *c = gr__ctx_new();
    if (c == NULL) return MC_ERR_NO_MEMORY;
    int rc = setjmp(c->jmp);
    if (rc != 0) {
        if (out != NULL) fprintf(out, "grader: %s\n", c->err);
        gr__ctx_free(c);
        return rc;
    }
    gr__grade_all(c, desc, out, report);
    gr__ctx_free(c);
    return MC_OK;
}

void gr_report_free(gr_report *report) {
    if (report == NULL) return;
    for (int i = 0; i < report->n_items; i++)
        free(report->items[i].output);
    free(report->items);
    report->items = NULL;
    report->n_items = 0;
}

int gr_prediction_hash(const char *answers_path, char hex_out[17], int *n_filled) {
    if (hex_out == NULL) return MC_ERR_INVALID_ARG;
    hex_out[0] = '\0';
    int filled = 0;
    gr__ctx *c = gr__ctx_new();
    if (c == NULL) return MC_ERR_NO_MEMORY;
    int rc = setjmp(c->jmp);
    if (rc != 0) {
        gr__ctx_free(c);
        return rc;
    }
    size_t n = 0;
    int missing = 0;
    c->answers_path = answers_path;
    char *text = gr__read_sheet(c, answers_path, &n, NULL, &missing);
    if (missing) gr__fail(c, MC_ERR_IO, "no answer sheet at %s", answers_path);
    gr__parse_sheet(c, text, n);
    gr__sheet_pred_hash(c, hex_out, &filled);
    gr__ctx_free(c);
    if (n_filled != NULL) *n_filled = filled;
    return MC_OK;
}

int gr_ledger_lock(const char *ledger_path, const char *rubric_path, const char *answers_path,
                   const char *nonce, gr_lock_info *info) {
    gr_lock_info scratch;
    gr_lock_info *volatile inf = info != NULL ? info : &scratch;
    memset(inf, 0, sizeof *inf);
    gr__ctx *c = gr__ctx_new();
    if (c == NULL) {
        snprintf(inf->message, sizeof inf->message, "grader: out of memory");
        return MC_ERR_NO_MEMORY;
    }
    int rc = setjmp(c->jmp);
    if (rc != 0) {
        snprintf(inf->message, sizeof inf->message, "%.500s", c->err);
        gr__ctx_free(c);
        return rc;
    }
    gr__load_rubric(c, rubric_path);
    char path[4200];
    if (ledger_path != NULL)
        snprintf(path, sizeof path, "%s", ledger_path);
    else
        snprintf(path, sizeof path, "results/%s.ledger.json", c->R.lab);
    gr__ledger_lock(c, path, answers_path, nonce, inf);
    gr__ctx_free(c);
    return MC_OK;
}

int gr_ledger_locked_value(const char *ledger_path, const char *nonce, const char *key,
                           char *value, size_t cap) {
    if (value != NULL && cap > 0) value[0] = '\0';
    gr__ctx *c = gr__ctx_new();
    if (c == NULL) return MC_ERR_NO_MEMORY;
    volatile int found = 0;
    int rc = setjmp(c->jmp);
    if (rc != 0) {
        fprintf(stderr, "%s\n", c->err);
        gr__ctx_free(c);
        return rc;
    }
    const cJSON *root = gr__ledger_load(c, ledger_path != NULL ? ledger_path : "");
    const cJSON *entry =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "nonces"), nonce);
    const cJSON *v =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(entry, "keys"), key);
    if (cJSON_IsString(v)) {
        found = 1;
        if (value != NULL && cap > 0) snprintf(value, cap, "%s", v->valuestring);
    }
    gr__ctx_free(c);
    return found;
}

static void gr__rubric_items(gr__ctx *c, const char *rubric_path, gr_rubric_item **out,
                             int *count) {
    gr__load_rubric(c, rubric_path);
    const gr__rubric *R = &c->R;
    gr_rubric_item *items = NULL;
    int n = 0, cap = 0;
    /* Rubric format 1: prediction groups, the sections' point groups, evidence, quality,
       misconceptions, each reported under its id prefix ("A1" for "A1.tp_contiguous"). */
    const cJSON *g;
    cJSON_ArrayForEach(g, R->predictions) {
        gr_rubric_item *it = GR__PUSH(c, items, n, cap);
        memset(it, 0, sizeof *it);
        snprintf(it->id, sizeof it->id, "%s", gr__jstr(g, "id", "P"));
        snprintf(it->part, sizeof it->part, "%s", gr__jstr(g, "part", "main"));
        snprintf(it->title, sizeof it->title, "predictions %s", it->id);
    }
    for (int r = 0; r < R->nsec; r++) {
        gr_rubric_item *it = GR__PUSH(c, items, n, cap);
        memset(it, 0, sizeof *it);
        snprintf(it->id, sizeof it->id, "%s", R->sec[r].id);
        snprintf(it->part, sizeof it->part, "%s", gr__part_name[R->sec[r].part]);
        snprintf(it->title, sizeof it->title, "%s", R->sec[r].title);
        for (int p = 0; p < R->npoints; p++)
            if (R->points[p].section == r) it->max_score += R->points[p].points;
        for (int e = 0; e < R->nevid; e++)
            if (R->evid[e].section == r) it->max_score += R->evid[e].points;
    }
    for (int q = 0; q < R->nquality; q++) {
        gr_rubric_item *it = GR__PUSH(c, items, n, cap);
        memset(it, 0, sizeof *it);
        snprintf(it->id, sizeof it->id, "%s", R->quality[q].id);
        snprintf(it->part, sizeof it->part, "%s", gr__part_name[R->quality[q].part == GR__PART_FOLLOWUP]);
        snprintf(it->title, sizeof it->title, "quality");
        it->max_score = R->quality[q].points;
    }
    for (int m = 0; m < R->nmisc; m++) {
        gr_rubric_item *it = GR__PUSH(c, items, n, cap);
        memset(it, 0, sizeof *it);
        snprintf(it->id, sizeof it->id, "%s", R->misc[m].id);
        snprintf(it->part, sizeof it->part, "main");
        snprintf(it->title, sizeof it->title, "%s", R->misc[m].title);
        it->is_penalty = 1;
    }
    *out = (gr_rubric_item *)malloc(sizeof(gr_rubric_item) * (size_t)(n + 1));
    if (*out == NULL) gr__fail(c, MC_ERR_NO_MEMORY, "grader: out of memory");
    if (n > 0) memcpy(*out, items, sizeof(gr_rubric_item) * (size_t)n);
    *count = n;
}

int gr_rubric_items(const char *rubric_path, gr_rubric_item **items) {
    if (items == NULL) return MC_ERR_INVALID_ARG;
    *items = NULL;
    gr__ctx *c = gr__ctx_new();
    if (c == NULL) return MC_ERR_NO_MEMORY;
    int n = 0;
    int rc = setjmp(c->jmp);
    if (rc != 0) {
        fprintf(stderr, "grader: %s\n", c->err);
        free(*items);
        *items = NULL;
        gr__ctx_free(c);
        return rc;
    }
    gr__rubric_items(c, rubric_path, items, &n);
    gr__ctx_free(c);
    return n;
}

int gr_read_header(const char *answers_path, char nonce_out[17], int *probe_rank,
                         char variant_out[8]) {
    size_t n = 0;
    char *text = gr__read_file(answers_path, GR__MAX_SHEET_BYTES, &n, NULL);
    if (text == NULL) return MC_ERR_IO;
    char nonce[17] = {0}, variant[8] = {0};
    int probe = -1;
    int ok = gr__parse_header_text(text, nonce, &probe, variant);
    free(text);
    if (!ok) return MC_ERR_INVALID_DESC;
    if (nonce_out != NULL) memcpy(nonce_out, nonce, sizeof nonce);
    if (probe_rank != NULL) *probe_rank = probe;
    if (variant_out != NULL) memcpy(variant_out, variant, sizeof variant);
    return MC_OK;
}

/* Replaces every "{name}" in text by its value. */
static char *gr__substitute(gr__ctx *c, const char *text, const char *const *names,
                            const char *const *values, int n) {
    gr__sb b = {0};
    for (const char *p = text; *p != '\0';) {
        int done = 0;
        if (*p == '{') {
            for (int i = 0; i < n && !done; i++) {
                size_t len = strlen(names[i]);
                if (strncmp(p + 1, names[i], len) == 0 && p[len + 1] == '}') {
                    gr__sb_add(c, &b, values[i]);
                    p += len + 2;
                    done = 1;
                }
            }
        }
        if (!done) gr__sb_addn(c, &b, p++, 1);
    }
    return b.s != NULL ? b.s : gr__strdup(c, "");
}

static char *gr__join_lines(gr__ctx *c, const cJSON *lines) {
    gr__sb b = {0};
    const cJSON *l;
    cJSON_ArrayForEach(l, lines) {
        if (!cJSON_IsString(l)) continue;
        if (b.len) gr__sb_add(c, &b, "\n");
        gr__sb_add(c, &b, l->valuestring);
    }
    return b.s != NULL ? b.s : gr__strdup(c, "");
}

static int gr__has_content_beyond_template(gr__ctx *c, const char *text, size_t n) {
    gr__parse_sheet(c, text, n);
    for (int i = 0; i < c->S.nsec; i++)
        if (c->S.sec[i].nsent > 0) return 1;
    char hex[17];
    int filled = 0;
    gr__sheet_pred_hash(c, hex, &filled);
    return filled > 0;
}

static int gr__write_template(gr__ctx *c, const char *rubric_path, const char *answers_path,
                              const char *nonce, int probe_rank, const char *variant, int force) {
    size_t n = 0;
    char *rt = gr__read_file(rubric_path, GR__MAX_JSON_BYTES, &n, NULL);
    if (rt == NULL)
        gr__fail(c, MC_ERR_IO, "rubric %s cannot be read", rubric_path ? rubric_path : "(null)");
    cJSON *root = gr__keep_json(c, cJSON_Parse(rt));
    free(rt);
    if (root == NULL) gr__fail(c, MC_ERR_INVALID_DESC, "rubric %s is not valid JSON", rubric_path);
    const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(root, "template");
    if (!cJSON_IsArray(tmpl))
        gr__fail(c, MC_ERR_INVALID_DESC, "rubric %s has no \"template\" lines", rubric_path);
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(root, "pred_template");
    const cJSON *var = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(root, "variants"), variant);
    char probe[16];
    snprintf(probe, sizeof probe, "%d", probe_rank);
    const char *names[] = {"nonce", "probe_rank", "variant", "variant_title", "variant_question"};
    const char *values[] = {nonce, probe, variant, gr__jstr(var, "title", ""),
                            gr__jstr(var, "question", "")};
    const char *blocks[] = {"pred_main", "pred_followup"};
    const char *bodies[] = {gr__join_lines(c, cJSON_GetObjectItemCaseSensitive(pt, "main")),
                            gr__join_lines(c, cJSON_GetObjectItemCaseSensitive(pt, variant))};
    char *text = gr__substitute(c, gr__join_lines(c, tmpl), blocks, bodies, 2);
    text = gr__substitute(c, text, names, values, 5);

    size_t en = 0;
    char *existing = gr__read_file(answers_path, GR__MAX_SHEET_BYTES, &en, NULL);
    if (existing != NULL) {
        char *copy = gr__strndup(c, existing, en);
        free(existing);
        if (!force && gr__has_content_beyond_template(c, copy, en)) return 1;
    }
    FILE *f = fopen(answers_path, "w");
    if (f == NULL) gr__fail(c, MC_ERR_IO, "cannot write %s", answers_path);
    fputs(text, f);
    fputs("\n", f);
    if (fclose(f) != 0) gr__fail(c, MC_ERR_IO, "cannot write %s", answers_path);
    return 0;
}

int gr_write_template(const char *rubric_path, const char *answers_path, const char *nonce,
                            int probe_rank, const char *variant, int force) {
    if (answers_path == NULL || nonce == NULL || variant == NULL) return MC_ERR_INVALID_ARG;
    gr__ctx *c = gr__ctx_new();
    if (c == NULL) return MC_ERR_NO_MEMORY;
    int rc = setjmp(c->jmp);
    if (rc == 0)
        rc = gr__write_template(c, rubric_path, answers_path, nonce, probe_rank, variant, force);
    gr__ctx_free(c);
    return rc;
}
