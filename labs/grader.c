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
     >>api         mc_grade, prediction hash, header, template */
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

#include <cjson/cJSON.h>
#include <cmark.h>
#include <unicase.h>
#include <uninorm.h>
#include <unistr.h>

#include "megatron_c.h"

/* Inputs larger than this are read in part (a sheet is a few kilobytes). */
#define MC__MAX_SHEET_BYTES ((size_t)4 << 20)
#define MC__MAX_JSON_BYTES ((size_t)16 << 20)
/* Sentences beyond this many per section are not analysed (protects against pathological
   sheets; real sections have a few dozen). */
#define MC__MAX_SENTENCES_PER_SECTION 2000
#define MC__MAX_CANDIDATES 64    /* concept matches considered per pattern slot */
#define MC__SEARCH_BUDGET 200000 /* pattern-search steps per sentence and pattern */
#define MC__TABLE_WIDTH 96

enum { MC__PART_OTHER = -1, MC__PART_MAIN = 0, MC__PART_FOLLOWUP = 1 };
static const char *const mc__part_name[2] = {"main", "followup"};

// ---------------------------------------------------------------------------------------------
// >>memory

typedef struct mc__chunk {
    struct mc__chunk *next;
    size_t used, cap;
    max_align_t data[];
} mc__chunk;

typedef struct mc__ctx mc__ctx;

typedef struct mc__sb { /* growable string in the arena */
    char *s;
    size_t len, cap;
} mc__sb;

/* The grading context: the arena, the error exit and everything the grading builds. Defined
   further down (after the rubric, sheet and item types). */
struct mc__ctx;

static void *mc__alloc(mc__ctx *c, size_t n);
static void mc__fail(mc__ctx *c, int code, const char *fmt, ...);

static char *mc__strndup(mc__ctx *c, const char *s, size_t n) {
    char *d = (char *)mc__alloc(c, n + 1);
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

static char *mc__strdup(mc__ctx *c, const char *s) {
    return mc__strndup(c, s != NULL ? s : "", s != NULL ? strlen(s) : 0);
}

/* Returns arr with room for one more element (elements live in the arena; the old block is
   left behind, which is fine for a short-lived grading). */
static void *mc__grow(mc__ctx *c, void *arr, size_t elem, int n, int *cap) {
    if (n < *cap) return arr;
    int ncap = *cap > 0 ? *cap * 2 : 8;
    void *p = mc__alloc(c, elem * (size_t)ncap);
    if (arr != NULL && n > 0) memcpy(p, arr, elem * (size_t)n);
    *cap = ncap;
    return p;
}
#define MC__PUSH(c, arr, n, cap)                                                                   \
    ((arr) = mc__grow((c), (arr), sizeof *(arr), (n), &(cap)), &(arr)[(n)++])

static void mc__sb_addn(mc__ctx *c, mc__sb *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t ncap = b->cap > 0 ? b->cap * 2 : 256;
        while (ncap < b->len + n + 1)
            ncap *= 2;
        char *p = (char *)mc__alloc(c, ncap);
        if (b->len > 0) memcpy(p, b->s, b->len);
        b->s = p;
        b->cap = ncap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

static void mc__sb_add(mc__ctx *c, mc__sb *b, const char *s) { mc__sb_addn(c, b, s, strlen(s)); }

static void mc__sb_printf(mc__ctx *c, mc__sb *b, const char *fmt, ...) {
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        mc__sb_addn(c, b, small, (size_t)n);
        return;
    }
    char *big = (char *)mc__alloc(c, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    mc__sb_addn(c, b, big, (size_t)n);
}

static const char *mc__sb_str(const mc__sb *b) { return b->s != NULL ? b->s : ""; }

/* Reads at most max bytes of a file into malloc'd memory (NUL-terminated). NULL when the file
   cannot be opened. *truncated is set when the file was longer. */
static char *mc__read_file(const char *path, size_t max, size_t *len, int *truncated) {
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

enum { MC__T_WORD, MC__T_NUM, MC__T_CJK, MC__T_SYM };

typedef struct mc__tok {
    uint8_t kind;
    uint8_t barrier; /* , : ( ) 、 - a clause boundary that negation does not cross */
    uint8_t prefix;  /* pattern tokens only: "creat*" matches any word starting with "creat" */
    int start, len;  /* bytes in the normalised text */
    char *s;         /* the token text */
    char *stem;      /* words: light stem */
} mc__tok;

static int mc__is_cjk(ucs4_t u) {
    return (u >= 0x3400 && u <= 0x4DBF) || (u >= 0x4E00 && u <= 0x9FFF) ||
           (u >= 0xF900 && u <= 0xFAFF) || (u >= 0x20000 && u <= 0x2FA1F) ||
           (u >= 0x3040 && u <= 0x30FF);
}

/* 0: separator, 1: symbol token, 2: barrier token (commas, colons, parentheses: clause
   boundaries that negation does not cross). Symbols are kept because a few concepts are
   symbols ("/" for "divided by", "×" for a product). */
static int mc__symbol_class(ucs4_t u) {
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
static char *mc__valid_utf8(mc__ctx *c, const char *s, size_t n, size_t *out_n) {
    char *o = (char *)mc__alloc(c, n + 1);
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
static char *mc__normalize(mc__ctx *c, const char *s, size_t n) {
    size_t vn = 0;
    char *v = mc__valid_utf8(c, s, n, &vn);
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
    char *o = (char *)mc__alloc(c, sn * 2 + 8);
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
static char *mc__stem(mc__ctx *c, const char *w, int n) {
    char buf[64];
    if (n <= 0 || n >= (int)sizeof buf) return mc__strndup(c, w, n > 0 ? (size_t)n : 0);
    memcpy(buf, w, (size_t)n);
    int len = n;
#define MC__ENDS(sfx)                                                                              \
    (len > (int)strlen(sfx) && memcmp(buf + len - strlen(sfx), sfx, strlen(sfx)) == 0)
    if (len > 4 && MC__ENDS("ies")) {
        len -= 3;
        buf[len++] = 'y';
    } else if (len > 3 && buf[len - 1] == 's' && buf[len - 2] != 's') {
        len--;
    }
    if (len > 5 && MC__ENDS("ing"))
        len -= 3;
    else if (len > 4 && MC__ENDS("ed"))
        len -= 2;
    if (len > 4 && buf[len - 1] == 'e') len--;
    if (len > 3 && buf[len - 1] == buf[len - 2] && strchr("aeiouls", buf[len - 1]) == NULL) len--;
#undef MC__ENDS
    return mc__strndup(c, buf, (size_t)len);
}

/* Tokenises normalised text. In pattern mode a '*' right after a word marks a prefix. */
static mc__tok *mc__tokenize(mc__ctx *c, const char *t, int pattern_mode, int *ntok) {
    mc__tok *tok = NULL;
    int n = 0, cap = 0;
    size_t len = strlen(t);
    for (size_t i = 0; i < len;) {
        unsigned char ch = (unsigned char)t[i];
        if (ch >= 'a' && ch <= 'z') {
            size_t j = i;
            while (j < len && t[j] >= 'a' && t[j] <= 'z')
                j++;
            mc__tok *k = MC__PUSH(c, tok, n, cap);
            memset(k, 0, sizeof *k);
            k->kind = MC__T_WORD;
            k->start = (int)i;
            k->len = (int)(j - i);
            k->s = mc__strndup(c, t + i, j - i);
            k->stem = mc__stem(c, t + i, (int)(j - i));
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
            mc__tok *k = MC__PUSH(c, tok, n, cap);
            memset(k, 0, sizeof *k);
            k->kind = MC__T_NUM;
            k->start = (int)i;
            k->len = (int)(j - i);
            k->s = mc__strndup(c, t + i, j - i);
            i = j;
            continue;
        }
        ucs4_t uc;
        int m = u8_mbtouc(&uc, (const uint8_t *)t + i, len - i);
        if (m <= 0) m = 1;
        int sym = mc__symbol_class(uc);
        if (mc__is_cjk(uc) || sym != 0) {
            mc__tok *k = MC__PUSH(c, tok, n, cap);
            memset(k, 0, sizeof *k);
            k->kind = mc__is_cjk(uc) ? MC__T_CJK : MC__T_SYM;
            k->barrier = sym == 2;
            k->start = (int)i;
            k->len = m;
            k->s = mc__strndup(c, t + i, (size_t)m);
        }
        i += (size_t)m;
    }
    *ntok = n;
    return tok;
}

static int mc__is_content(const mc__tok *t) { return t->kind != MC__T_SYM; }

/* Weight of a token for "within N tokens": a Chinese character is about half a word. */
static double mc__tok_weight(const mc__tok *t) {
    return t->kind == MC__T_CJK ? 0.5 : t->kind == MC__T_SYM ? 0.0 : 1.0;
}

// ---------------------------------------------------------------------------------------------
// >>rubric

typedef struct mc__alt {
    char *src; /* as written in the rubric */
    int is_re;
    regex_t *re;
    mc__tok *pt; /* pattern tokens */
    int npt;
} mc__alt;

typedef struct mc__concept {
    char id[48];
    mc__alt *alt;
    int nalt, capalt;
    int is_term; /* used by a rubric point: counts for the list and density rules */
} mc__concept;

typedef struct mc__slot { /* one conjunct of a pattern: any of these concepts */
    int *concepts;
    int n;
} mc__slot;

typedef struct mc__pat {
    mc__slot *slot;
    int nslot;
    int *unless; /* concepts that, anywhere in the sentence, stop the pattern */
    int nunless;
    int window;  /* 0 = whole sentence; else max token distance first..last */
    int ordered; /* slots must appear in the given order */
    int negated; /* misconceptions: matches only the negated form of the conjunction */
    int clause;  /* the conjunction may not span a comma (one clause) */
} mc__pat;

typedef struct mc__rsec { /* a rubric section (free text) */
    char id[16];
    int part;
    const char *title;
    const char *prompt;
    const char *kind; /* "expl" | "evid" */
} mc__rsec;

typedef struct mc__pitem { /* one prediction item */
    char key[64];
    char id[48];
    const char *type;
    const char *path;
    double points;
    cJSON *spec; /* the rubric object (values, fields, tolerances, partial) */
} mc__pitem;

typedef struct mc__point {
    char id[48];
    int section; /* index into rsec */
    double points;
    mc__pat *pat;
    int npat;
    int use_negation;
    const char *need;
    const char *title;
    cJSON *variants; /* NULL = every variant */
} mc__point;

typedef struct mc__misc {
    char id[16];
    const char *title;
    double penalty;
    mc__pat *pat;
    int npat;
    int *claims; /* claim-kind concepts whose wrong group lists fire this */
    int nclaims;
    cJSON *scope;  /* section ids */
    cJSON *pairs;  /* rubric point ids this contradicts */
    cJSON *refute; /* fact paths printed as the refutation */
    const char *feedback;
    const char *citation;
} mc__misc;

typedef struct mc__evid {
    char id[48];
    int section;
    double points, per_value;
    const char *facts_path;
    cJSON *ignore_paths;
    cJSON *ignore_numbers;
    const char *need;
} mc__evid;

typedef struct mc__quality {
    char id[48];
    int part;
    double points;
    cJSON *sections;
    const char *need;
} mc__quality;

typedef struct mc__claimkind {
    int concept;
    const char *path; /* NULL: lists after this word are not group claims */
} mc__claimkind;

typedef struct mc__rules {
    double negation_window, list_min_terms, density_cap, density_factor;
    double floor_en_words, floor_cjk_chars, copy_overlap, penalty_cap, unlocked_factor;
    double max_sentence_tokens, claim_distance;
} mc__rules;

typedef struct mc__rubric {
    cJSON *root;
    const char *lab, *question, *title, *version, *source_version;
    double max_main, max_followup;
    mc__rules rules;
    mc__concept *concepts;
    int nconcepts, capconcepts;
    int c_neg, c_neg_except, c_connective;
    mc__rsec *sec;
    int nsec, capsec;
    mc__point *points;
    int npoints, cappoints;
    mc__misc *misc;
    int nmisc, capmisc;
    mc__evid *evid;
    int nevid, capevid;
    mc__quality *quality;
    int nquality, capquality;
    mc__claimkind *claims;
    int nclaims, capclaims;
    cJSON *predictions; /* array, read when scoring (variant-dependent) */
    cJSON *parts;       /* {"main": [...], "followup": [...]} heading keywords */
    cJSON *variants;    /* {"F1": {"title", "question"}} */
    cJSON *header_fields;
} mc__rubric;

// ---------------------------------------------------------------------------------------------
// >>sheet types

typedef struct mc__match {
    int start, end; /* token range [start, end) */
    int alt;
    int neg; /* a negator stands within the window before it */
} mc__match;

typedef struct mc__sent {
    char *raw; /* as written (soft line breaks become spaces), trimmed */
    int line;
    char *norm;
    mc__tok *tok;
    int ntok;
    int words, cjk; /* English words and numbers, CJK characters */
    double *wpos;   /* wpos[i]: weighted position of token i (CJK 0.5, symbols 0, words 1) */
    int *barriers;  /* barriers[i]: barrier tokens among tokens 0..i-1 */
    int ignored;    /* 0, or why: 1 copy of the prompt/rubric, 2 list of terms, 3 too long */
    mc__match **cm; /* per concept, computed on first use */
    int *ncm;
} mc__sent;

typedef struct mc__sec {
    char *heading;
    int line;
    int part;
    int rub; /* rubric section index, -1 if none */
    mc__sent *sent;
    int nsent, capsent;
    int dropped; /* sentences beyond the per-section limit */
} mc__sec;

typedef struct mc__predblock {
    int part;
    int line;
    char *text;
} mc__predblock;

typedef struct mc__sheet {
    int present;
    int truncated;
    mc__sec *sec;
    int nsec, capsec;
    mc__predblock *pb;
    int npb, cappb;
    int has_header;
    char nonce[17];
    int probe;
    char variant[8];
} mc__sheet;

typedef struct mc__pv { /* one "key: value" of a pred block */
    char key[64];
    char *value;
    int line;
    int placeholder;
} mc__pv;

typedef struct mc__item {
    char id[48];
    const char *kind; /* pred | expl | misc | evid | quality */
    const char *tag;  /* PRED | EXPL | MISC | EVID | QUAL */
    int part;
    double score, max;
    int line;
    int fired;
    char *detail; /* short, on the table line */
    mc__sb more;  /* further lines: excerpt, need, measured, citation */
} mc__item;

struct mc__ctx {
    mc__chunk *chunks;
    jmp_buf jmp;
    char err[1024];
    regex_t **regs;
    int nregs, capregs;
    cJSON **jsons;
    int njsons, capjsons;
    cmark_node *doc;
    cmark_iter *iters[2];
    mc__rubric R;
    mc__sheet S;
    cJSON *results;
    cJSON *facts;
    char variant[8];
    mc__item *items;
    int nitems, capitems;
    mc__sb warnings;
    /* prompt n-grams (copy detection) */
    uint64_t *ngram;
    size_t ngram_cap, ngram_n;
};

static void *mc__alloc(mc__ctx *c, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    mc__chunk *ch = c->chunks;
    if (ch == NULL || ch->cap - ch->used < n) {
        size_t cap = n > ((size_t)64 << 10) ? n : ((size_t)64 << 10);
        ch = (mc__chunk *)malloc(sizeof(mc__chunk) + cap);
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

static void mc__fail(mc__ctx *c, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    longjmp(c->jmp, code);
}

static void mc__ctx_free(mc__ctx *c) {
    for (int i = 0; i < c->nregs; i++)
        regfree(c->regs[i]);
    for (int i = 0; i < c->njsons; i++)
        cJSON_Delete(c->jsons[i]);
    for (int i = 0; i < 2; i++)
        if (c->iters[i] != NULL) cmark_iter_free(c->iters[i]);
    if (c->doc != NULL) cmark_node_free(c->doc);
    free(c->ngram);
    mc__chunk *ch = c->chunks;
    while (ch != NULL) {
        mc__chunk *next = ch->next;
        free(ch);
        ch = next;
    }
    free(c);
}

static mc__ctx *mc__ctx_new(void) { return (mc__ctx *)calloc(1, sizeof(mc__ctx)); }

/* Keeps a cJSON tree until the grading ends. */
static cJSON *mc__keep_json(mc__ctx *c, cJSON *j) {
    if (j != NULL) *MC__PUSH(c, c->jsons, c->njsons, c->capjsons) = j;
    return j;
}

static void mc__warn(mc__ctx *c, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    mc__sb_add(c, &c->warnings, buf);
    mc__sb_add(c, &c->warnings, "\n");
}

// ---------------------------------------------------------------------------------------------
// >>rubric loading

static const char *mc__jstr(const cJSON *o, const char *key, const char *def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) && v->valuestring != NULL ? v->valuestring : def;
}

static double mc__jnum(const cJSON *o, const char *key, double def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

static int mc__part_from_name(const char *s) {
    if (s == NULL) return MC__PART_OTHER;
    if (strcmp(s, "main") == 0) return MC__PART_MAIN;
    if (strcmp(s, "followup") == 0) return MC__PART_FOLLOWUP;
    return MC__PART_OTHER;
}

static int mc__concept_index(const mc__rubric *R, const char *id) {
    for (int i = 0; i < R->nconcepts; i++)
        if (strcmp(R->concepts[i].id, id) == 0) return i;
    return -1;
}

static void mc__add_alt(mc__ctx *c, mc__concept *k, const char *src) {
    mc__alt *a = MC__PUSH(c, k->alt, k->nalt, k->capalt);
    memset(a, 0, sizeof *a);
    a->src = mc__strdup(c, src);
    if (strncmp(src, "re:", 3) == 0) {
        a->is_re = 1;
        a->re = (regex_t *)mc__alloc(c, sizeof(regex_t));
        int rc = regcomp(a->re, src + 3, REG_EXTENDED);
        if (rc != 0) {
            char msg[256];
            regerror(rc, a->re, msg, sizeof msg);
            mc__fail(c, MC_ERR_INVALID_DESC,
                     "rubric: concept %s, alternative \"%s\": bad regular expression (%s)", k->id,
                     src, msg);
        }
        *MC__PUSH(c, c->regs, c->nregs, c->capregs) = a->re;
        return;
    }
    char *norm = mc__normalize(c, src, strlen(src));
    a->pt = mc__tokenize(c, norm, 1, &a->npt);
    if (a->npt == 0)
        mc__fail(c, MC_ERR_INVALID_DESC,
                 "rubric: concept %s, alternative \"%s\" has no word, number or CJK character",
                 k->id, src);
}

static void mc__add_alts(mc__ctx *c, mc__concept *k, const cJSON *list, const char *where) {
    const cJSON *v;
    if (list == NULL) return;
    if (!cJSON_IsArray(list))
        mc__fail(c, MC_ERR_INVALID_DESC, "rubric: %s must be a list of strings", where);
    cJSON_ArrayForEach(v, list) {
        if (!cJSON_IsString(v))
            mc__fail(c, MC_ERR_INVALID_DESC, "rubric: %s must hold strings only", where);
        mc__add_alt(c, k, v->valuestring);
    }
}

static mc__concept *mc__new_concept(mc__ctx *c, const char *id) {
    mc__rubric *R = &c->R;
    if (strlen(id) >= sizeof R->concepts[0].id)
        mc__fail(c, MC_ERR_INVALID_DESC, "rubric: concept id \"%s\" is longer than 47 characters",
                 id);
    if (mc__concept_index(R, id) >= 0)
        mc__fail(c, MC_ERR_INVALID_DESC, "rubric: concept %s is defined twice", id);
    mc__concept *k = MC__PUSH(c, R->concepts, R->nconcepts, R->capconcepts);
    memset(k, 0, sizeof *k);
    snprintf(k->id, sizeof k->id, "%s", id);
    return k;
}

static void mc__load_concepts(mc__ctx *c, const cJSON *root) {
    const cJSON *concepts = cJSON_GetObjectItemCaseSensitive(root, "concepts");
    if (!cJSON_IsObject(concepts))
        mc__fail(c, MC_ERR_INVALID_DESC,
                 "rubric: \"concepts\" must be an object of concept groups");
    const cJSON *g;
    cJSON_ArrayForEach(g, concepts) {
        char where[128];
        mc__concept *k = mc__new_concept(c, g->string);
        if (cJSON_IsArray(g)) {
            snprintf(where, sizeof where, "concepts.%s", g->string);
            mc__add_alts(c, k, g, where);
        } else if (cJSON_IsObject(g)) {
            static const char *const langs[] = {"en", "zh", "re"};
            for (int i = 0; i < 3; i++) {
                snprintf(where, sizeof where, "concepts.%s.%s", g->string, langs[i]);
                const cJSON *list = cJSON_GetObjectItemCaseSensitive(g, langs[i]);
                if (i == 2 && list != NULL) { /* "re": patterns without the "re:" prefix */
                    const cJSON *v;
                    cJSON_ArrayForEach(v, list) {
                        if (!cJSON_IsString(v))
                            mc__fail(c, MC_ERR_INVALID_DESC, "rubric: %s must hold strings", where);
                        char buf[1024];
                        snprintf(buf, sizeof buf, "re:%s", v->valuestring);
                        mc__add_alt(c, k, buf);
                    }
                } else {
                    mc__add_alts(c, k, list, where);
                }
            }
        } else {
            mc__fail(c, MC_ERR_INVALID_DESC,
                     "rubric: concepts.%s must be a list or an object {en, zh, re}", g->string);
        }
        if (k->nalt == 0)
            mc__fail(c, MC_ERR_INVALID_DESC, "rubric: concept %s has no alternatives", k->id);
    }
    /* The language rules become concepts too, so one matcher serves everything. */
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text");
    static const char *const special[3][2] = {{"__NEG", "negators"},
                                              {"__NEG_EXCEPT", "negator_exceptions"},
                                              {"__CONNECTIVE", "connectives"}};
    for (int i = 0; i < 3; i++) {
        mc__concept *k = mc__new_concept(c, special[i][0]);
        char where[64];
        snprintf(where, sizeof where, "text.%s", special[i][1]);
        mc__add_alts(c, k, cJSON_GetObjectItemCaseSensitive(text, special[i][1]), where);
    }
    c->R.c_neg = mc__concept_index(&c->R, "__NEG");
    c->R.c_neg_except = mc__concept_index(&c->R, "__NEG_EXCEPT");
    c->R.c_connective = mc__concept_index(&c->R, "__CONNECTIVE");
}

static int mc__need_concept(mc__ctx *c, const char *id, const char *where) {
    int k = mc__concept_index(&c->R, id);
    if (k < 0)
        mc__fail(c, MC_ERR_INVALID_DESC, "rubric: %s names unknown concept \"%s\"", where, id);
    return k;
}

/* "ADJ|STRIDED" -> the two concept indices. */
static void mc__parse_slot(mc__ctx *c, const char *spec, mc__slot *slot, const char *where) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", spec);
    int cap = 0;
    for (char *save = NULL, *p = strtok_r(buf, "|", &save); p != NULL;
         p = strtok_r(NULL, "|", &save))
        *MC__PUSH(c, slot->concepts, slot->n, cap) = mc__need_concept(c, p, where);
    if (slot->n == 0)
        mc__fail(c, MC_ERR_INVALID_DESC, "rubric: %s has an empty concept slot", where);
}

static void mc__parse_patterns(mc__ctx *c, const cJSON *list, mc__pat **out, int *nout,
                               const char *where, int mark_terms) {
    int cap = 0;
    *out = NULL;
    *nout = 0;
    if (list == NULL) return;
    if (!cJSON_IsArray(list))
        mc__fail(c, MC_ERR_INVALID_DESC, "rubric: %s.patterns must be a list", where);
    const cJSON *p;
    cJSON_ArrayForEach(p, list) {
        mc__pat *pat = MC__PUSH(c, *out, *nout, cap);
        memset(pat, 0, sizeof *pat);
        const cJSON *all = cJSON_GetObjectItemCaseSensitive(p, "all");
        if (!cJSON_IsArray(all) || cJSON_GetArraySize(all) == 0)
            mc__fail(c, MC_ERR_INVALID_DESC,
                     "rubric: %s: each pattern needs \"all\": [concept, ...] (one or more)", where);
        int scap = 0;
        const cJSON *s;
        cJSON_ArrayForEach(s, all) {
            if (!cJSON_IsString(s))
                mc__fail(c, MC_ERR_INVALID_DESC, "rubric: %s: \"all\" holds concept names", where);
            mc__slot *slot = MC__PUSH(c, pat->slot, pat->nslot, scap);
            memset(slot, 0, sizeof *slot);
            mc__parse_slot(c, s->valuestring, slot, where);
            if (mark_terms)
                for (int i = 0; i < slot->n; i++)
                    c->R.concepts[slot->concepts[i]].is_term = 1;
        }
        int ucap = 0;
        const cJSON *un = cJSON_GetObjectItemCaseSensitive(p, "unless");
        cJSON_ArrayForEach(s, un) {
            if (cJSON_IsString(s))
                *MC__PUSH(c, pat->unless, pat->nunless, ucap) =
                    mc__need_concept(c, s->valuestring, where);
        }
        pat->window = (int)mc__jnum(p, "window", 0);
        pat->ordered = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "ordered"));
        pat->negated = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "negated"));
        pat->clause = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "clause"));
    }
}

static int mc__rsec_index(const mc__rubric *R, const char *id) {
    for (int i = 0; i < R->nsec; i++)
        if (strcasecmp(R->sec[i].id, id) == 0) return i;
    return -1;
}

static void mc__load_sections(mc__ctx *c, const cJSON *root) {
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "sections");
    if (!cJSON_IsArray(list))
        mc__fail(c, MC_ERR_INVALID_DESC,
                 "rubric: \"sections\" must be a list of {id, part, title}");
    const cJSON *s;
    cJSON_ArrayForEach(s, list) {
        const char *id = mc__jstr(s, "id", NULL);
        if (id == NULL || strlen(id) >= 16)
            mc__fail(c, MC_ERR_INVALID_DESC,
                     "rubric: every section needs an \"id\" (under 16 characters)");
        mc__rsec *r = MC__PUSH(c, c->R.sec, c->R.nsec, c->R.capsec);
        memset(r, 0, sizeof *r);
        snprintf(r->id, sizeof r->id, "%s", id);
        r->part = mc__part_from_name(mc__jstr(s, "part", NULL));
        if (r->part == MC__PART_OTHER)
            mc__fail(c, MC_ERR_INVALID_DESC,
                     "rubric: section %s: \"part\" must be \"main\" or \"followup\"", id);
        r->title = mc__jstr(s, "title", "");
        r->prompt = mc__jstr(s, "prompt", "");
        r->kind = mc__jstr(s, "kind", "expl");
    }
}

static int mc__need_section(mc__ctx *c, const cJSON *o, const char *where) {
    const char *sid = mc__jstr(o, "section", NULL);
    int si = sid != NULL ? mc__rsec_index(&c->R, sid) : -1;
    if (si < 0)
        mc__fail(c, MC_ERR_INVALID_DESC, "rubric: %s: \"section\" (%s) is not one of the sections",
                 where, sid != NULL ? sid : "missing");
    return si;
}

static void mc__copy_id(mc__ctx *c, char *dst, size_t cap, const cJSON *o, const char *what) {
    const char *id = mc__jstr(o, "id", NULL);
    if (id == NULL || strlen(id) >= cap)
        mc__fail(c, MC_ERR_INVALID_DESC,
                 "rubric: every %s needs an \"id\" shorter than %zu characters", what, cap);
    snprintf(dst, cap, "%s", id);
}

static void mc__load_points(mc__ctx *c, const cJSON *root) {
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(root, "points")) {
        mc__point *pt = MC__PUSH(c, c->R.points, c->R.npoints, c->R.cappoints);
        memset(pt, 0, sizeof *pt);
        mc__copy_id(c, pt->id, sizeof pt->id, p, "point");
        char where[64];
        snprintf(where, sizeof where, "point %s", pt->id);
        pt->section = mc__need_section(c, p, where);
        pt->points = mc__jnum(p, "points", -1);
        if (!(pt->points >= 0))
            mc__fail(c, MC_ERR_INVALID_DESC, "rubric: point %s needs \"points\" >= 0", pt->id);
        mc__parse_patterns(c, cJSON_GetObjectItemCaseSensitive(p, "patterns"), &pt->pat, &pt->npat,
                           pt->id, 1);
        if (pt->npat == 0)
            mc__fail(c, MC_ERR_INVALID_DESC, "rubric: point %s needs at least one pattern", pt->id);
        const cJSON *neg = cJSON_GetObjectItemCaseSensitive(p, "negation");
        pt->use_negation = !cJSON_IsFalse(neg);
        pt->need = mc__jstr(p, "need", "");
        pt->title = mc__jstr(p, "title", "");
        pt->variants = cJSON_GetObjectItemCaseSensitive(p, "variants");
    }
}

static void mc__load_misconceptions(mc__ctx *c, const cJSON *root) {
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(root, "misconceptions")) {
        mc__misc *m = MC__PUSH(c, c->R.misc, c->R.nmisc, c->R.capmisc);
        memset(m, 0, sizeof *m);
        mc__copy_id(c, m->id, sizeof m->id, p, "misconception");
        m->title = mc__jstr(p, "title", "");
        m->penalty = mc__jnum(p, "penalty", -1);
        if (!(m->penalty >= 0))
            mc__fail(c, MC_ERR_INVALID_DESC, "rubric: misconception %s needs \"penalty\" >= 0",
                     m->id);
        mc__parse_patterns(c, cJSON_GetObjectItemCaseSensitive(p, "patterns"), &m->pat, &m->npat,
                           m->id, 0);
        int cap = 0;
        const cJSON *k;
        cJSON_ArrayForEach(k, cJSON_GetObjectItemCaseSensitive(p, "claims")) {
            if (cJSON_IsString(k))
                *MC__PUSH(c, m->claims, m->nclaims, cap) =
                    mc__need_concept(c, k->valuestring, m->id);
        }
        if (m->npat == 0 && m->nclaims == 0)
            mc__fail(c, MC_ERR_INVALID_DESC, "rubric: misconception %s needs patterns or claims",
                     m->id);
        m->scope = cJSON_GetObjectItemCaseSensitive(p, "sections");
        m->pairs = cJSON_GetObjectItemCaseSensitive(p, "pairs_with");
        m->refute = cJSON_GetObjectItemCaseSensitive(p, "refute");
        m->feedback = mc__jstr(p, "feedback", "");
        m->citation = mc__jstr(p, "citation", "");
    }
}

static void mc__load_evidence_quality(mc__ctx *c, const cJSON *root) {
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(root, "evidence")) {
        mc__evid *e = MC__PUSH(c, c->R.evid, c->R.nevid, c->R.capevid);
        memset(e, 0, sizeof *e);
        mc__copy_id(c, e->id, sizeof e->id, p, "evidence item");
        char where[64];
        snprintf(where, sizeof where, "evidence %s", e->id);
        e->section = mc__need_section(c, p, where);
        e->points = mc__jnum(p, "points", 1.0);
        e->per_value = mc__jnum(p, "per_value", 0.5);
        e->facts_path = mc__jstr(p, "facts", "facts");
        e->ignore_paths = cJSON_GetObjectItemCaseSensitive(p, "ignore_paths");
        e->ignore_numbers = cJSON_GetObjectItemCaseSensitive(p, "ignore_numbers");
        e->need = mc__jstr(p, "need", "");
    }
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(root, "quality")) {
        mc__quality *q = MC__PUSH(c, c->R.quality, c->R.nquality, c->R.capquality);
        memset(q, 0, sizeof *q);
        mc__copy_id(c, q->id, sizeof q->id, p, "quality item");
        q->part = mc__part_from_name(mc__jstr(p, "part", "followup"));
        q->points = mc__jnum(p, "points", 0.5);
        q->sections = cJSON_GetObjectItemCaseSensitive(p, "sections");
        q->need = mc__jstr(p, "need", "");
    }
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(root, "claim_kinds")) {
        mc__claimkind *k = MC__PUSH(c, c->R.claims, c->R.nclaims, c->R.capclaims);
        k->concept = mc__need_concept(c, mc__jstr(p, "concept", "?"), "claim_kinds");
        k->path = mc__jstr(p, "path", NULL);
    }
}

static void mc__load_rules(mc__ctx *c, const cJSON *root) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(root, "rules");
    mc__rules *x = &c->R.rules;
    x->negation_window = mc__jnum(r, "negation_window", 3);
    x->list_min_terms = mc__jnum(r, "list_min_terms", 6);
    x->density_cap = mc__jnum(r, "density_cap", 0.35);
    x->density_factor = mc__jnum(r, "density_factor", 0.5);
    x->floor_en_words = mc__jnum(r, "floor_en_words", 40);
    x->floor_cjk_chars = mc__jnum(r, "floor_cjk_chars", 80);
    x->copy_overlap = mc__jnum(r, "copy_overlap", 0.8);
    x->penalty_cap = mc__jnum(r, "penalty_cap", 3.0);
    x->unlocked_factor = mc__jnum(r, "unlocked_factor", 0.5);
    x->max_sentence_tokens = mc__jnum(r, "max_sentence_tokens", 400);
    x->claim_distance = mc__jnum(r, "claim_distance", 8);
}

/* Parses the rubric file (JSON text) into c->R. Fails with a message naming the field. */
static void mc__load_rubric_text(mc__ctx *c, const char *path, const char *text) {
    cJSON *root = mc__keep_json(c, cJSON_Parse(text));
    if (root == NULL) {
        const char *at = cJSON_GetErrorPtr();
        mc__fail(c, MC_ERR_INVALID_DESC, "rubric %s is not valid JSON (near \"%.30s\")", path,
                 at != NULL ? at : "?");
    }
    mc__rubric *R = &c->R;
    R->root = root;
    R->lab = mc__jstr(root, "lab", "lab");
    R->question = mc__jstr(root, "question", "");
    R->title = mc__jstr(root, "title", "");
    R->version = mc__jstr(root, "rubric_version", "?");
    R->source_version = mc__jstr(root, "source_version", "");
    const cJSON *max = cJSON_GetObjectItemCaseSensitive(root, "max");
    R->max_main = mc__jnum(max, "main", 10);
    R->max_followup = mc__jnum(max, "followup", 5);
    R->predictions = cJSON_GetObjectItemCaseSensitive(root, "predictions");
    R->parts = cJSON_GetObjectItemCaseSensitive(root, "parts");
    R->variants = cJSON_GetObjectItemCaseSensitive(root, "variants");
    R->header_fields = cJSON_GetObjectItemCaseSensitive(root, "header_fields");
    mc__load_rules(c, root);
    mc__load_concepts(c, root);
    mc__load_sections(c, root);
    mc__load_points(c, root);
    mc__load_misconceptions(c, root);
    mc__load_evidence_quality(c, root);
}

static void mc__load_rubric(mc__ctx *c, const char *path) {
    size_t n = 0;
    char *text = mc__read_file(path, MC__MAX_JSON_BYTES, &n, NULL);
    if (text == NULL)
        mc__fail(c, MC_ERR_IO, "rubric %s cannot be read (run from the repository root)",
                 path != NULL ? path : "(null)");
    char *copy = mc__strndup(c, text, n);
    free(text);
    mc__load_rubric_text(c, path, copy);
}

// ---------------------------------------------------------------------------------------------
// >>sheet

/* Finds "nonce: X ; probe_rank: N ; followup: FV" inside an HTML comment. */
static int mc__parse_header_text(const char *s, char nonce[17], int *probe, char variant[8]) {
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
static void mc__heading_id(const char *norm, char *out, size_t cap) {
    while (*norm != '\0' && !isalnum((unsigned char)*norm))
        norm++;
    size_t n = 0;
    while (n + 1 < cap && isalnum((unsigned char)norm[n])) {
        out[n] = norm[n];
        n++;
    }
    out[n] = '\0';
}

static int mc__heading_part(mc__ctx *c, const char *norm) {
    static const char *const defaults[2][3] = {{"predictions", "main", NULL},
                                               {"follow", NULL, NULL}};
    while (*norm == ' ')
        norm++;
    for (int part = 0; part < 2; part++) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(c->R.parts, mc__part_name[part]);
        if (list != NULL) {
            const cJSON *kw;
            cJSON_ArrayForEach(kw, list) {
                if (!cJSON_IsString(kw)) continue;
                char *k = mc__normalize(c, kw->valuestring, strlen(kw->valuestring));
                if (k[0] != '\0' && strncmp(norm, k, strlen(k)) == 0) return part;
            }
        } else {
            for (int i = 0; defaults[part][i] != NULL; i++)
                if (strncmp(norm, defaults[part][i], strlen(defaults[part][i])) == 0) return part;
        }
    }
    return MC__PART_OTHER;
}

/* Text of a node's inline content: soft breaks become '\x01' (a space that counts a line),
   hard breaks '\n' (a sentence end). */
static char *mc__inline_text(mc__ctx *c, cmark_node *node, size_t *len) {
    mc__sb b = {0};
    cmark_iter *it = cmark_iter_new(node);
    if (it == NULL) mc__fail(c, MC_ERR_NO_MEMORY, "grader: out of memory");
    c->iters[1] = it;
    cmark_event_type ev;
    while ((ev = cmark_iter_next(it)) != CMARK_EVENT_DONE) {
        if (ev != CMARK_EVENT_ENTER) continue;
        cmark_node *n = cmark_iter_get_node(it);
        switch (cmark_node_get_type(n)) {
        case CMARK_NODE_TEXT:
        case CMARK_NODE_CODE: {
            const char *lit = cmark_node_get_literal(n);
            if (lit != NULL) mc__sb_add(c, &b, lit);
            break;
        }
        case CMARK_NODE_SOFTBREAK: mc__sb_add(c, &b, "\x01"); break;
        case CMARK_NODE_LINEBREAK: mc__sb_add(c, &b, "\n"); break;
        default: break;
        }
    }
    cmark_iter_free(it);
    c->iters[1] = NULL;
    *len = b.len;
    return b.s != NULL ? b.s : mc__strdup(c, "");
}

static void mc__prepare_sentence(mc__ctx *c, mc__sent *s) {
    s->norm = mc__normalize(c, s->raw, strlen(s->raw));
    s->tok = mc__tokenize(c, s->norm, 0, &s->ntok);
    s->wpos = (double *)mc__alloc(c, sizeof(double) * (size_t)(s->ntok + 1));
    s->barriers = (int *)mc__alloc(c, sizeof(int) * (size_t)(s->ntok + 1));
    double w = 0;
    for (int i = 0; i < s->ntok; i++) {
        s->wpos[i] = w;
        s->barriers[i + 1] = s->barriers[i] + s->tok[i].barrier;
        w += mc__tok_weight(&s->tok[i]);
        if (s->tok[i].kind == MC__T_WORD || s->tok[i].kind == MC__T_NUM)
            s->words++;
        else if (s->tok[i].kind == MC__T_CJK)
            s->cjk++;
    }
    s->wpos[s->ntok] = w;
}

static void mc__add_sentence(mc__ctx *c, mc__sec *sec, const char *text, size_t n, int line) {
    while (n > 0 && (isspace((unsigned char)*text) || *text == '\x01')) {
        text++;
        n--;
    }
    while (n > 0 && (isspace((unsigned char)text[n - 1]) || text[n - 1] == '\x01'))
        n--;
    if (n == 0) return;
    if (sec->nsent >= MC__MAX_SENTENCES_PER_SECTION) {
        sec->dropped++;
        return;
    }
    mc__sent *s = MC__PUSH(c, sec->sent, sec->nsent, sec->capsent);
    memset(s, 0, sizeof *s);
    /* A soft line break becomes a space, except between two non-ASCII characters (Chinese
       text wraps without spaces). */
    char *raw = (char *)mc__alloc(c, n + 1);
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
    mc__prepare_sentence(c, s);
}

/* 1 when the character at text[i] ends a sentence; *adv = its length in bytes. */
static int mc__sentence_end(const char *text, size_t n, size_t i, size_t *adv) {
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
static void mc__add_paragraph(mc__ctx *c, mc__sec *sec, const char *text, size_t n, int line0) {
    size_t start = 0;
    int line = line0; /* line of text[start] */
    for (size_t i = 0; i <= n;) {
        size_t adv = 1;
        int end = i == n ? 1 : mc__sentence_end(text, n, i, &adv);
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
        mc__add_sentence(c, sec, text + start, stop - start, sline);
        for (size_t j = start; j < stop; j++)
            if (text[j] == '\x01' || text[j] == '\n') line++;
        start = stop;
        if (i == n) break;
        i = stop;
    }
}

static mc__sec *mc__new_section(mc__ctx *c, const char *heading, int line, int part, int rub) {
    mc__sheet *S = &c->S;
    if (rub >= 0) /* a repeated heading continues the same rubric section */
        for (int i = 0; i < S->nsec; i++)
            if (S->sec[i].rub == rub) return &S->sec[i];
    mc__sec *sec = MC__PUSH(c, S->sec, S->nsec, S->capsec);
    memset(sec, 0, sizeof *sec);
    sec->heading = mc__strdup(c, heading);
    sec->line = line;
    sec->part = part;
    sec->rub = rub;
    return sec;
}

static void mc__on_heading(mc__ctx *c, cmark_node *node, int *part, int *cur) {
    size_t hl = 0;
    char *htext = mc__inline_text(c, node, &hl);
    for (char *p = htext; *p != '\0'; p++)
        if (*p == '\x01' || *p == '\n') *p = ' ';
    int level = cmark_node_get_heading_level(node);
    int line = cmark_node_get_start_line(node);
    char *norm = mc__normalize(c, htext, hl);
    char hid[16];
    mc__heading_id(norm, hid, sizeof hid);
    int rub = level >= 2 && hid[0] != '\0' ? mc__rsec_index(&c->R, hid) : -1;
    if (rub >= 0) {
        *cur = (int)(mc__new_section(c, htext, line, c->R.sec[rub].part, rub) - c->S.sec);
        return;
    }
    if (level <= 2) *part = level == 1 ? MC__PART_OTHER : mc__heading_part(c, norm);
    if (level <= 3) *cur = (int)(mc__new_section(c, htext, line, *part, -1) - c->S.sec);
    /* deeper headings stay inside the current section */
}

/* Parses the sheet into sections, sentences and pred blocks. */
static void mc__parse_sheet(mc__ctx *c, const char *text, size_t n) {
    mc__sheet *S = &c->S;
    S->present = 1;
    c->doc = cmark_parse_document(text, n, CMARK_OPT_DEFAULT);
    if (c->doc == NULL) mc__fail(c, MC_ERR_NO_MEMORY, "grader: out of memory");
    S->has_header = mc__parse_header_text(text, S->nonce, &S->probe, S->variant);
    int part = MC__PART_OTHER;
    int cur =
        (int)(mc__new_section(c, "(before the first heading)", 1, MC__PART_OTHER, -1) - S->sec);
    cmark_iter *it = cmark_iter_new(c->doc);
    if (it == NULL) mc__fail(c, MC_ERR_NO_MEMORY, "grader: out of memory");
    c->iters[0] = it;
    cmark_event_type ev;
    while ((ev = cmark_iter_next(it)) != CMARK_EVENT_DONE) {
        if (ev != CMARK_EVENT_ENTER) continue;
        cmark_node *node = cmark_iter_get_node(it);
        switch (cmark_node_get_type(node)) {
        case CMARK_NODE_HEADING: mc__on_heading(c, node, &part, &cur); break;
        case CMARK_NODE_PARAGRAPH: {
            size_t len = 0;
            char *t = mc__inline_text(c, node, &len);
            mc__add_paragraph(c, &S->sec[cur], t, len, cmark_node_get_start_line(node));
            break;
        }
        case CMARK_NODE_CODE_BLOCK: {
            const char *info = cmark_node_get_fence_info(node);
            char word[16] = {0};
            if (info != NULL) sscanf(info, "%15s", word);
            if (strcasecmp(word, "pred") != 0) break; /* other code blocks are not prose */
            mc__predblock *b = MC__PUSH(c, S->pb, S->npb, S->cappb);
            int bpart = S->sec[cur].part != MC__PART_OTHER ? S->sec[cur].part : part;
            if (bpart == MC__PART_OTHER) bpart = S->npb == 1 ? MC__PART_MAIN : MC__PART_FOLLOWUP;
            b->part = bpart;
            b->line = cmark_node_get_start_line(node) + 1;
            b->text = mc__strdup(c, cmark_node_get_literal(node));
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

static const cJSON *mc__path(const cJSON *root, const char *path) {
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

static int mc__cmp_long(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

static int mc__cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* "[7,5]" -> "[5,7]": a flat list of integers, sorted. */
static char *mc__canon_ints(mc__ctx *c, long *v, int n) {
    qsort(v, (size_t)n, sizeof *v, mc__cmp_long);
    mc__sb b = {0};
    mc__sb_add(c, &b, "[");
    for (int i = 0; i < n; i++)
        mc__sb_printf(c, &b, i ? ",%ld" : "%ld", v[i]);
    mc__sb_add(c, &b, "]");
    return b.s;
}

static char *mc__canon_nested(mc__ctx *c, char **inner, int n) {
    qsort(inner, (size_t)n, sizeof *inner, mc__cmp_str);
    mc__sb b = {0};
    mc__sb_add(c, &b, "[");
    for (int i = 0; i < n; i++) {
        if (i) mc__sb_add(c, &b, ",");
        mc__sb_add(c, &b, inner[i]);
    }
    mc__sb_add(c, &b, "]");
    return b.s;
}

/* A bracketed list in text: flat [a,b] or nested [[a,b],[c,d]]; inner lists canonical. */
typedef struct mc__blist {
    size_t start, end; /* bytes in the text */
    int nested;
    char **inner;
    int *inner_len;
    int ninner;
    char *canon;
} mc__blist;

static void mc__skip_ws(const char *s, size_t n, size_t *i) {
    while (*i < n && (s[*i] == ' ' || s[*i] == '\t'))
        (*i)++;
}

static int mc__list_sep(const char *s, size_t n, size_t *i) {
    mc__skip_ws(s, n, i);
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
static char *mc__parse_flat(mc__ctx *c, const char *s, size_t n, size_t *i, int *len) {
    size_t k = *i;
    if (k >= n || s[k] != '[') return NULL;
    k++;
    long v[512];
    int nv = 0;
    mc__skip_ws(s, n, &k);
    if (k < n && s[k] == ']') return NULL; /* [] says nothing */
    for (;;) {
        mc__skip_ws(s, n, &k);
        if (k >= n || !isdigit((unsigned char)s[k]) || nv >= 512) return NULL;
        long x = 0;
        while (k < n && isdigit((unsigned char)s[k]) && x < 100000000)
            x = x * 10 + (s[k++] - '0');
        if (k < n && (isdigit((unsigned char)s[k]) || s[k] == '.')) return NULL;
        v[nv++] = x;
        if (mc__list_sep(s, n, &k)) continue;
        mc__skip_ws(s, n, &k);
        if (k < n && s[k] == ']') {
            k++;
            break;
        }
        return NULL;
    }
    *i = k;
    *len = nv;
    return mc__canon_ints(c, v, nv);
}

static int mc__parse_blist(mc__ctx *c, const char *s, size_t n, size_t at, mc__blist *out) {
    memset(out, 0, sizeof *out);
    size_t k = at;
    int len = 0;
    char *flat = mc__parse_flat(c, s, n, &k, &len);
    if (flat != NULL) {
        out->start = at;
        out->end = k;
        out->inner = (char **)mc__alloc(c, sizeof(char *));
        out->inner_len = (int *)mc__alloc(c, sizeof(int));
        out->inner[0] = flat;
        out->inner_len[0] = len;
        out->ninner = 1;
        out->canon = flat;
        return 1;
    }
    k = at + 1;
    int cap = 0, lcap = 0, nl = 0;
    for (;;) {
        mc__skip_ws(s, n, &k);
        char *in = mc__parse_flat(c, s, n, &k, &len);
        if (in == NULL) return 0;
        *MC__PUSH(c, out->inner, out->ninner, cap) = in;
        *MC__PUSH(c, out->inner_len, nl, lcap) = len;
        if (mc__list_sep(s, n, &k)) continue;
        mc__skip_ws(s, n, &k);
        if (k < n && s[k] == ']') {
            k++;
            break;
        }
        return 0;
    }
    out->start = at;
    out->end = k;
    out->nested = 1;
    char **copy = (char **)mc__alloc(c, sizeof(char *) * (size_t)out->ninner);
    memcpy(copy, out->inner, sizeof(char *) * (size_t)out->ninner);
    out->canon = mc__canon_nested(c, copy, out->ninner);
    return 1;
}

/* A number quoted in text, with the decimals it was written with. */
typedef struct mc__num {
    double v;
    int decimals;
    char text[32];
    size_t start;
} mc__num;

static int mc__is_unit(const char *w, size_t n) {
    static const char *const units[] = {"s",      "ms",      "us",  "ns",    "sec",  "secs",
                                        "second", "seconds", "mib", "gib",   "kib",  "mb",
                                        "gb",     "kb",      "b",   "bytes", "x",    "st",
                                        "nd",     "rd",      "th",  "ranks", "gpus", NULL};
    for (int i = 0; units[i] != NULL; i++)
        if (strlen(units[i]) == n && strncmp(units[i], w, n) == 0) return 1;
    return 0;
}

/* Extracts bracketed lists and stand-alone numbers ("5.0 s", "#23"; not "F2", "M003"). */
static void mc__extract_values(mc__ctx *c, const char *s, mc__blist **lists, int *nlists, int *lcap,
                               mc__num **nums, int *nnums, int *ncap) {
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        if (s[i] == '[') {
            mc__blist bl;
            if (mc__parse_blist(c, s, n, i, &bl)) {
                *MC__PUSH(c, *lists, *nlists, *lcap) = bl;
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
            int glued_after = (w > j && !mc__is_unit(s + j, w - j)) || (w < n && s[w] == '_');
            if (!glued_before && !glued_after && j - i < 30) {
                mc__num *x = MC__PUSH(c, *nums, *nnums, *ncap);
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
typedef struct mc__facts {
    double *num;
    int nnum, capnum;
    char **list;
    int nlist, caplist;
} mc__facts;

static char *mc__json_canon(mc__ctx *c, const cJSON *j);

static void mc__facts_add_num(mc__ctx *c, mc__facts *F, double v) {
    *MC__PUSH(c, F->num, F->nnum, F->capnum) = v;
}

static void mc__facts_add_list(mc__ctx *c, mc__facts *F, char *canon) {
    if (canon != NULL) *MC__PUSH(c, F->list, F->nlist, F->caplist) = canon;
}

static void mc__flatten(mc__ctx *c, const cJSON *j, mc__facts *F, int depth) {
    if (j == NULL || depth > 32) return;
    if (cJSON_IsNumber(j)) {
        mc__facts_add_num(c, F, j->valuedouble);
    } else if (cJSON_IsString(j) && j->valuestring != NULL) {
        char *norm = mc__normalize(c, j->valuestring, strlen(j->valuestring));
        mc__blist *lists = NULL;
        mc__num *nums = NULL;
        int nl = 0, lc = 0, nn = 0, nc = 0;
        mc__extract_values(c, norm, &lists, &nl, &lc, &nums, &nn, &nc);
        for (int i = 0; i < nl; i++) {
            mc__facts_add_list(c, F, lists[i].canon);
            for (int k = 0; k < lists[i].ninner && lists[i].nested; k++)
                mc__facts_add_list(c, F, lists[i].inner[k]);
        }
        for (int i = 0; i < nn; i++)
            mc__facts_add_num(c, F, nums[i].v);
    } else if (cJSON_IsArray(j) || cJSON_IsObject(j)) {
        /* A list of rank ids counts as a list; its elements are not stand-alone measurements
           (otherwise every small integer would "verify"). */
        char *canon = cJSON_IsArray(j) ? mc__json_canon(c, j) : NULL;
        mc__facts_add_list(c, F, canon);
        const cJSON *e;
        cJSON_ArrayForEach(e, j) {
            if (canon != NULL && cJSON_IsNumber(e)) continue;
            mc__flatten(c, e, F, depth + 1);
        }
    }
}

/* Canonical form of a JSON list of integers, or of a list of such lists; NULL otherwise. */
static char *mc__json_canon(mc__ctx *c, const cJSON *j) {
    if (!cJSON_IsArray(j)) return NULL;
    int n = cJSON_GetArraySize(j);
    if (n == 0) return NULL;
    const cJSON *first = cJSON_GetArrayItem(j, 0);
    if (cJSON_IsNumber(first)) {
        long *v = (long *)mc__alloc(c, sizeof(long) * (size_t)n);
        int k = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, j) {
            if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble)) return NULL;
            v[k++] = (long)e->valuedouble;
        }
        return mc__canon_ints(c, v, k);
    }
    if (cJSON_IsArray(first)) {
        char **inner = (char **)mc__alloc(c, sizeof(char *) * (size_t)n);
        int k = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, j) {
            const cJSON *f = cJSON_GetArrayItem(e, 0);
            if (!cJSON_IsArray(e) || !cJSON_IsNumber(f)) return NULL;
            if ((inner[k++] = mc__json_canon(c, e)) == NULL) return NULL;
        }
        return mc__canon_nested(c, inner, k);
    }
    return NULL;
}

/* Short printable form of a JSON value ("[[0,4],[1,5],[2,6],[3,7]]" cut to cap). */
static char *mc__json_short(mc__ctx *c, const cJSON *j, size_t cap) {
    if (j == NULL) return mc__strdup(c, "(none)");
    char *p = cJSON_PrintUnformatted(j);
    if (p == NULL) return mc__strdup(c, "?");
    char *s = mc__strdup(c, p);
    free(p);
    if (strlen(s) > cap && cap > 3) strcpy(s + cap - 2, "..");
    return s;
}

// ---------------------------------------------------------------------------------------------
// >>predictions

static char *mc__trim(char *s) {
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

/* Removes a '#' comment (outside double quotes) from one line, in place. */
static void mc__strip_comment(char *line) {
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
static int mc__is_placeholder(const char *v) {
    while (isspace((unsigned char)*v))
        v++;
    return *v == '\0' || strchr(v, '?') != NULL || strstr(v, "..") != NULL ||
           strstr(v, "\xE2\x80\xA6") != NULL || strchr(v, '|') != NULL;
}

static int mc__key_line(const char *line, char *key, size_t cap, const char **value) {
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
static void mc__parse_pred_block(mc__ctx *c, const mc__predblock *b, mc__pv **out, int *n,
                                 int *cap) {
    char *text = mc__strdup(c, b->text);
    int line = b->line;
    mc__pv *last = NULL;
    for (char *save = NULL, *ln = strtok_r(text, "\n", &save); ln != NULL;
         ln = strtok_r(NULL, "\n", &save), line++) {
        mc__strip_comment(ln);
        char *t = mc__trim(ln);
        if (*t == '\0') continue;
        char key[64];
        const char *value;
        if (mc__key_line(t, key, sizeof key, &value)) {
            last = NULL;
            for (int i = 0; i < *n; i++) /* a repeated key: the later line wins */
                if (strcmp((*out)[i].key, key) == 0) last = &(*out)[i];
            if (last == NULL) last = MC__PUSH(c, *out, *n, *cap);
            memset(last, 0, sizeof *last);
            snprintf(last->key, sizeof last->key, "%s", key);
            last->value = mc__strdup(c, value);
            last->line = line;
        } else if (last != NULL) {
            mc__sb sb = {0};
            mc__sb_add(c, &sb, last->value);
            mc__sb_add(c, &sb, " ");
            mc__sb_add(c, &sb, t);
            last->value = sb.s;
        }
    }
    for (int i = 0; i < *n; i++) {
        (*out)[i].value = mc__trim((*out)[i].value);
        (*out)[i].placeholder = mc__is_placeholder((*out)[i].value);
    }
}

/* Hash input for one pred block: lines without comments and without any whitespace. */
static void mc__pred_normal_form(mc__ctx *c, const char *block, mc__sb *out) {
    char *text = mc__strdup(c, block);
    for (char *save = NULL, *ln = strtok_r(text, "\n", &save); ln != NULL;
         ln = strtok_r(NULL, "\n", &save)) {
        mc__strip_comment(ln);
        char compact[4096];
        size_t k = 0;
        for (char *p = ln; *p != '\0' && k + 1 < sizeof compact; p++)
            if (!isspace((unsigned char)*p)) compact[k++] = *p;
        compact[k] = '\0';
        if (k == 0) continue;
        mc__sb_add(c, out, compact);
        mc__sb_add(c, out, "\n");
    }
}

static uint64_t mc__fnv1a(const char *s, size_t n, uint64_t h) {
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static void mc__sheet_pred_hash(mc__ctx *c, char hex[17], int *n_filled) {
    mc__sb all = {0};
    *n_filled = 0;
    for (int i = 0; i < c->S.npb; i++) {
        mc__sb_add(c, &all, "--pred--\n");
        mc__pred_normal_form(c, c->S.pb[i].text, &all);
        mc__pv *pv = NULL;
        int n = 0, cap = 0, filled = 0;
        mc__parse_pred_block(c, &c->S.pb[i], &pv, &n, &cap);
        for (int k = 0; k < n; k++)
            filled |= !pv[k].placeholder;
        *n_filled += filled;
    }
    uint64_t h = mc__fnv1a(mc__sb_str(&all), all.len, 0xcbf29ce484222325ULL);
    snprintf(hex, 17, "%016llx", (unsigned long long)h);
}

/* JSON, or JSON with bare words quoted ({tp_rank: 1} and wrong_membership are accepted). */
static cJSON *mc__parse_value(mc__ctx *c, const char *v) {
    cJSON *j = cJSON_ParseWithOpts(v, NULL, 1);
    if (j != NULL) return mc__keep_json(c, j);
    mc__sb b = {0};
    int in_str = 0;
    for (size_t i = 0; v[i] != '\0';) {
        char ch = v[i];
        if (in_str) {
            mc__sb_addn(c, &b, &v[i], 1);
            if (ch == '\\' && v[i + 1] != '\0')
                mc__sb_addn(c, &b, &v[++i], 1);
            else if (ch == '"')
                in_str = 0;
            i++;
        } else if (ch == '"') {
            in_str = 1;
            mc__sb_addn(c, &b, &v[i++], 1);
        } else if (isalpha((unsigned char)ch) || ch == '_') {
            size_t j2 = i;
            while (isalnum((unsigned char)v[j2]) || v[j2] == '_' || v[j2] == '-')
                j2++;
            int literal = (j2 - i == 4 &&
                           (strncmp(v + i, "true", 4) == 0 || strncmp(v + i, "null", 4) == 0)) ||
                          (j2 - i == 5 && strncmp(v + i, "false", 5) == 0);
            if (!literal) mc__sb_add(c, &b, "\"");
            mc__sb_addn(c, &b, v + i, j2 - i);
            if (!literal) mc__sb_add(c, &b, "\"");
            i = j2;
        } else {
            mc__sb_addn(c, &b, &v[i++], 1);
        }
    }
    return mc__keep_json(c, cJSON_ParseWithOpts(mc__sb_str(&b), NULL, 1));
}

static int mc__json_bool(const cJSON *j, int *out) {
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
static int mc__loose_eq(mc__ctx *c, const cJSON *you, const cJSON *meas) {
    if (you == NULL || meas == NULL) return 0;
    if (cJSON_IsNumber(meas))
        return cJSON_IsNumber(you) && fabs(you->valuedouble - meas->valuedouble) <=
                                          1e-9 * fmax(1.0, fabs(meas->valuedouble));
    if (cJSON_IsBool(meas)) {
        int b;
        return mc__json_bool(you, &b) && b == cJSON_IsTrue(meas);
    }
    if (cJSON_IsString(meas))
        return cJSON_IsString(you) && strcasecmp(you->valuestring, meas->valuestring) == 0;
    if (cJSON_IsArray(meas)) {
        char *a = mc__json_canon(c, you), *b = mc__json_canon(c, meas);
        if (a != NULL && b != NULL) return strcmp(a, b) == 0;
    }
    return cJSON_Compare(you, meas, 1);
}

typedef struct mc__verdict {
    double frac;   /* fraction of the item's points */
    mc__sb detail; /* short */
    mc__sb more;   /* extra lines */
} mc__verdict;

static void mc__judge_groups(mc__ctx *c, const cJSON *you, const cJSON *meas, mc__verdict *v) {
    int nm = cJSON_GetArraySize(meas), ny = cJSON_IsArray(you) ? cJSON_GetArraySize(you) : 0;
    char **ym = (char **)mc__alloc(c, sizeof(char *) * (size_t)(ny + 1));
    int *used = (int *)mc__alloc(c, sizeof(int) * (size_t)(ny + 1));
    for (int i = 0; i < ny; i++) {
        const cJSON *g = cJSON_GetArrayItem(you, i);
        ym[i] = cJSON_IsArray(g) && cJSON_IsNumber(cJSON_GetArrayItem(g, 0)) ? mc__json_canon(c, g)
                                                                             : NULL;
    }
    if (ny == 0 || ym[0] == NULL) {
        v->frac = 0;
        mc__sb_add(c, &v->detail, "not a list of groups");
        mc__sb_add(c, &v->more, "write a list of rank lists, e.g. [[0,1],[2,3]]");
        return;
    }
    int exact = 0;
    const char *missed = NULL;
    for (int i = 0; i < nm; i++) {
        char *mg = mc__json_canon(c, cJSON_GetArrayItem(meas, i));
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
        mc__sb_printf(c, &v->detail, "%d/%d groups exact", exact, nm);
    } else {
        mc__sb_printf(c, &v->detail, "%d/%d exact (you: %s..; measured %s..)", exact, denom,
                      wrong != NULL ? wrong : "-", missed != NULL ? missed : "-");
        mc__sb_printf(c, &v->more, "measured: %s", mc__json_short(c, meas, 80));
    }
}

static void mc__judge_fields(mc__ctx *c, const cJSON *you, const cJSON *meas, const cJSON *spec,
                             mc__verdict *v) {
    const cJSON *fields = cJSON_GetObjectItemCaseSensitive(spec, "fields");
    int nf = cJSON_GetArraySize(fields), ok = 0;
    if (!cJSON_IsObject(you)) {
        mc__sb_add(c, &v->detail, "not an object {field: value}");
        return;
    }
    mc__sb wrong = {0};
    const cJSON *f;
    cJSON_ArrayForEach(f, fields) {
        if (!cJSON_IsString(f)) continue;
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(meas, f->valuestring);
        const cJSON *y = cJSON_GetObjectItemCaseSensitive(you, f->valuestring);
        if (mc__loose_eq(c, y, m)) {
            ok++;
        } else {
            mc__sb_printf(c, &wrong, "%s%s: you %s, measured %s", wrong.len ? "; " : "",
                          f->valuestring, y != NULL ? mc__json_short(c, y, 20) : "-",
                          mc__json_short(c, m, 20));
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
    mc__sb_printf(c, &v->detail, "%d/%d fields right", ok, nf);
    if (wrong.len) mc__sb_add(c, &v->more, mc__sb_str(&wrong));
}

static void mc__judge_scalar(mc__ctx *c, const char *type, const cJSON *you, const cJSON *meas,
                             const cJSON *spec, mc__verdict *v) {
    char *ys = mc__json_short(c, you, 30), *ms = mc__json_short(c, meas, 30);
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
            mc__sb_printf(c, &v->detail, "%s is not a listed outcome", ys);
            mc__sb_add(c, &v->more, "allowed: ");
            cJSON_ArrayForEach(e, values) if (cJSON_IsString(e))
                mc__sb_printf(c, &v->more, "%s ", e->valuestring);
            return;
        }
        ok = cJSON_IsString(you) && cJSON_IsString(meas) &&
             !strcasecmp(you->valuestring, meas->valuestring);
    } else if (strcmp(type, "bool") == 0) {
        int b;
        ok = mc__json_bool(you, &b) && cJSON_IsBool(meas) && b == cJSON_IsTrue(meas);
    } else if (strcmp(type, "set") == 0 || strcmp(type, "exact") == 0) {
        ok = mc__loose_eq(c, you, meas);
    } else if (strcmp(type, "numeric") == 0) {
        double rel = mc__jnum(spec, "rel_tol", 0), abs_tol = mc__jnum(spec, "abs_tol", 0);
        if (cJSON_IsNumber(you) && cJSON_IsNumber(meas)) {
            double m = meas->valuedouble;
            ok = fabs(you->valuedouble - m) <= fmax(abs_tol, rel * fabs(m)) + 1e-12;
        }
    } else if (strcmp(type, "interval") == 0) {
        const cJSON *lo = cJSON_GetArrayItem(you, 0), *hi = cJSON_GetArrayItem(you, 1);
        if (!cJSON_IsArray(you) || cJSON_GetArraySize(you) != 2 || !cJSON_IsNumber(lo) ||
            !cJSON_IsNumber(hi) || !cJSON_IsNumber(meas)) {
            mc__sb_add(c, &v->detail, "write an interval [lo, hi]");
            return;
        }
        double l = lo->valuedouble, h = hi->valuedouble, m = meas->valuedouble;
        int contains = l <= m && m <= h;
        double ratio = l > 0 ? h / l : INFINITY;
        v->frac = !contains ? 0.0 : ratio <= 2.0 ? 1.0 : ratio <= 4.0 ? 0.5 : 0.0;
        mc__sb_printf(c, &v->detail, "%s, measured %s%s", ys, ms,
                      !contains     ? " (outside)"
                      : ratio > 4.0 ? " (hi/lo > 4: too wide)"
                      : ratio > 2.0 ? " (hi/lo > 2: half)"
                                    : "");
        return;
    } else {
        mc__sb_printf(c, &v->detail, "rubric type \"%s\" unknown", type);
        return;
    }
    v->frac = ok ? 1.0 : 0.0;
    mc__sb_printf(c, &v->detail, "%s, measured %s", ys, ms);
}

static void mc__judge(mc__ctx *c, const mc__pitem *it, const mc__pv *pv, mc__verdict *v) {
    const cJSON *meas = mc__path(c->results, it->path);
    if (pv == NULL) {
        mc__sb_add(c, &v->detail, "no prediction");
        mc__sb_printf(c, &v->more, "add the line \"%s: ...\" to the pred block", it->key);
        return;
    }
    if (pv->placeholder) {
        mc__sb_add(c, &v->detail, "not filled in");
        return;
    }
    if (meas == NULL || cJSON_IsNull(meas)) {
        mc__sb_printf(c, &v->detail, "not measured in this run");
        mc__sb_printf(c, &v->more, "the results have no %s (run the lab again)", it->path);
        return;
    }
    const cJSON *you = mc__parse_value(c, pv->value);
    if (you == NULL) {
        mc__sb_add(c, &v->detail, "could not read your value");
        mc__sb_printf(c, &v->more, "line %d: \"%.40s\" is not JSON or an enum word", pv->line,
                      pv->value);
        return;
    }
    if (strcmp(it->type, "groups") == 0)
        mc__judge_groups(c, you, meas, v);
    else if (strcmp(it->type, "fields") == 0)
        mc__judge_fields(c, you, meas, it->spec, v);
    else
        mc__judge_scalar(c, it->type, you, meas, it->spec, v);
}

// ---------------------------------------------------------------------------------------------
// >>concepts

static int mc__alt_at(const mc__alt *a, const mc__sent *s, int i) {
    if (i + a->npt > s->ntok) return 0;
    for (int j = 0; j < a->npt; j++) {
        const mc__tok *p = &a->pt[j], *t = &s->tok[i + j];
        if (p->kind != t->kind) return 0;
        if (p->kind == MC__T_WORD) {
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
static int mc__tok_at(const mc__sent *s, size_t off) {
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

static void mc__push_match(mc__ctx *c, mc__match **arr, int *n, int *cap, int start, int end,
                           int alt) {
    mc__match *m = MC__PUSH(c, *arr, *n, *cap);
    m->start = start;
    m->end = end;
    m->alt = alt;
    m->neg = 0;
}

static void mc__find_concept(mc__ctx *c, mc__sent *s, int k) {
    const mc__concept *cp = &c->R.concepts[k];
    mc__match *arr = NULL;
    int n = 0, cap = 0;
    for (int a = 0; a < cp->nalt; a++) {
        const mc__alt *alt = &cp->alt[a];
        if (!alt->is_re) {
            for (int i = 0; i + alt->npt <= s->ntok; i++)
                if (mc__alt_at(alt, s, i)) mc__push_match(c, &arr, &n, &cap, i, i + alt->npt, a);
            continue;
        }
        size_t len = strlen(s->norm), off = 0;
        regmatch_t m;
        while (off < len && regexec(alt->re, s->norm + off, 1, &m, off ? REG_NOTBOL : 0) == 0) {
            size_t b = off + (size_t)m.rm_so, e = off + (size_t)m.rm_eo;
            int ts = mc__tok_at(s, b), te = mc__tok_at(s, e > b ? e - 1 : b) + 1;
            if (te > s->ntok) te = s->ntok;
            if (ts < s->ntok) mc__push_match(c, &arr, &n, &cap, ts, te > ts ? te : ts + 1, a);
            off = e > b ? e : b + 1;
        }
    }
    s->cm[k] = arr;
    s->ncm[k] = n;
}

/* 1 when a negator (not, never, 不, 没有 ...) stands within the negation window before token
   `start`, not across a comma, and is not part of an exception ("不同", "not only"). */
static int mc__negated_at(const mc__ctx *c, const mc__sent *s, int start) {
    const mc__rubric *R = &c->R;
    for (int i = 0; i < s->ncm[R->c_neg]; i++) {
        const mc__match *ng = &s->cm[R->c_neg][i];
        if (ng->end > start) continue;
        int excepted = 0;
        for (int e = 0; e < s->ncm[R->c_neg_except] && !excepted; e++) {
            const mc__match *ex = &s->cm[R->c_neg_except][e];
            excepted = ex->start <= ng->start && ex->end > ng->start;
        }
        if (excepted) continue;
        double d = 0;
        int blocked = 0;
        for (int t = ng->end; t < start && !blocked; t++) {
            blocked = s->tok[t].barrier;
            d += mc__tok_weight(&s->tok[t]);
        }
        if (!blocked && d < R->rules.negation_window) return 1;
    }
    return 0;
}

static void mc__analyse_sentence(mc__ctx *c, mc__sent *s) {
    if (s->cm != NULL) return;
    int nk = c->R.nconcepts;
    s->cm = (mc__match **)mc__alloc(c, sizeof(mc__match *) * (size_t)nk);
    s->ncm = (int *)mc__alloc(c, sizeof(int) * (size_t)nk);
    if (s->ntok > (int)c->R.rules.max_sentence_tokens) return; /* ignored, no matches */
    mc__find_concept(c, s, c->R.c_neg);
    mc__find_concept(c, s, c->R.c_neg_except);
    for (int k = 0; k < nk; k++) {
        if (k == c->R.c_neg || k == c->R.c_neg_except) continue;
        mc__find_concept(c, s, k);
        for (int i = 0; i < s->ncm[k]; i++)
            s->cm[k][i].neg = mc__negated_at(c, s, s->cm[k][i].start);
    }
}

typedef struct mc__search {
    const mc__pat *p;
    const double *wpos;
    const int *barriers; /* barriers[i]: barrier tokens before token i */
    mc__match **cand;
    int *ncand;
    mc__match *chosen;
    int allow_neg;
    int budget;
} mc__search;

static int mc__dfs(mc__search *q, int slot, int minstart, int maxend) {
    if (slot == q->p->nslot) return 1;
    for (int i = 0; i < q->ncand[slot]; i++) {
        if (--q->budget < 0) return 0;
        const mc__match *x = &q->cand[slot][i];
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
        if (mc__dfs(q, slot + 1, ms, me)) return 1;
    }
    return 0;
}

/* 0: no match; 1: the conjunction holds; 2: it holds only in negated form. */
static int mc__pattern_eval(mc__ctx *c, mc__sent *s, const mc__pat *p, int use_negation) {
    mc__analyse_sentence(c, s);
    for (int u = 0; u < p->nunless; u++)
        if (s->ncm[p->unless[u]] > 0) return 0;
    mc__match *cand[16];
    int ncand[16];
    mc__match chosen[16];
    if (p->nslot > 16) return 0;
    for (int sl = 0; sl < p->nslot; sl++) {
        int n = 0;
        for (int k = 0; k < p->slot[sl].n; k++)
            n += s->ncm[p->slot[sl].concepts[k]];
        if (n == 0) return 0;
        if (n > MC__MAX_CANDIDATES) n = MC__MAX_CANDIDATES;
        cand[sl] = (mc__match *)mc__alloc(c, sizeof(mc__match) * (size_t)n);
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
    mc__search q = {p, s->wpos, s->barriers, cand, ncand, chosen, 0, MC__SEARCH_BUDGET};
    if (mc__dfs(&q, 0, 1 << 30, -1)) return 1;
    q.allow_neg = 1;
    q.budget = MC__SEARCH_BUDGET;
    if (use_negation && mc__dfs(&q, 0, 1 << 30, -1)) return 2;
    return 0;
}

/* Best result over a list of patterns: 1 beats 2 beats 0. */
static int mc__patterns_eval(mc__ctx *c, mc__sent *s, const mc__pat *pats, int npat,
                             int use_negation) {
    int best = 0;
    for (int i = 0; i < npat && best != 1; i++) {
        int r = mc__pattern_eval(c, s, &pats[i], use_negation);
        if (r == 1 || (r == 2 && best == 0)) best = r;
    }
    return best;
}

// ---------------------------------------------------------------------------------------------
// >>prose  copy detection (n-grams of the prompt and rubric text), list sentences, density

static uint64_t mc__ngram_hash(mc__tok *const *t, int n) {
    uint64_t h = mc__fnv1a((const char *)&n, sizeof n, 0xcbf29ce484222325ULL);
    for (int i = 0; i < n; i++) {
        h = mc__fnv1a(t[i]->s, strlen(t[i]->s), h);
        h = mc__fnv1a("\x1f", 1, h);
    }
    return h | 1; /* 0 marks an empty slot */
}

static void mc__ngram_insert(mc__ctx *c, uint64_t h) {
    if ((c->ngram_n + 1) * 2 > c->ngram_cap) {
        size_t ncap = c->ngram_cap ? c->ngram_cap * 2 : 4096;
        uint64_t *nt = (uint64_t *)calloc(ncap, sizeof *nt);
        if (nt == NULL) mc__fail(c, MC_ERR_NO_MEMORY, "grader: out of memory");
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

static int mc__ngram_has(const mc__ctx *c, uint64_t h) {
    if (c->ngram_cap == 0) return 0;
    size_t k = h & (c->ngram_cap - 1);
    while (c->ngram[k] != 0) {
        if (c->ngram[k] == h) return 1;
        k = (k + 1) & (c->ngram_cap - 1);
    }
    return 0;
}

/* Content tokens of a text (words, numbers, CJK characters) as pointers. */
static mc__tok **mc__content_tokens(mc__ctx *c, mc__tok *tok, int ntok, int *n) {
    mc__tok **out = (mc__tok **)mc__alloc(c, sizeof(mc__tok *) * (size_t)(ntok + 1));
    *n = 0;
    for (int i = 0; i < ntok; i++)
        if (mc__is_content(&tok[i])) out[(*n)++] = &tok[i];
    return out;
}

static void mc__add_prompt_text(mc__ctx *c, const char *text) {
    char *norm = mc__normalize(c, text, strlen(text));
    int ntok = 0, n = 0;
    mc__tok *tok = mc__tokenize(c, norm, 0, &ntok);
    mc__tok **ct = mc__content_tokens(c, tok, ntok, &n);
    for (int len = 2; len <= 5; len++)
        for (int i = 0; i + len <= n; i++)
            mc__ngram_insert(c, mc__ngram_hash(ct + i, len));
}

/* Every string of the rubric (prompts, template, needs, feedback) except the concept lists
   and language rules: a sentence made of these is a copy, not an answer. */
static void mc__add_prompt_json(mc__ctx *c, const cJSON *j, int depth) {
    if (j == NULL || depth > 16) return;
    if (cJSON_IsString(j) && j->valuestring != NULL) {
        mc__add_prompt_text(c, j->valuestring);
        return;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, j) {
        if (depth == 0 && e->string != NULL &&
            (!strcmp(e->string, "concepts") || !strcmp(e->string, "text") ||
             !strcmp(e->string, "parts")))
            continue;
        mc__add_prompt_json(c, e, depth + 1);
    }
}

static int mc__is_copy(mc__ctx *c, mc__sent *s) {
    int n = 0;
    mc__tok **ct = mc__content_tokens(c, s->tok, s->ntok, &n);
    if (n < 2) return 0;
    if (n < 5) return mc__ngram_has(c, mc__ngram_hash(ct, n));
    int hits = 0, total = 0;
    for (int i = 0; i + 5 <= n; i++, total++)
        hits += mc__ngram_has(c, mc__ngram_hash(ct + i, 5));
    return (double)hits >= c->R.rules.copy_overlap * total;
}

/* Distinct rubric terms in a sentence (alternatives of concepts that rubric points use). */
static int mc__distinct_terms(mc__ctx *c, const mc__sent *s) {
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
static int mc__term_occurrences(mc__ctx *c, const mc__sent *s) {
    if (s->ntok == 0) return 0;
    int *maxend = (int *)mc__alloc(c, sizeof(int) * (size_t)s->ntok);
    for (int k = 0; k < c->R.nconcepts; k++) {
        if (!c->R.concepts[k].is_term) continue;
        for (int i = 0; i < s->ncm[k]; i++) {
            const mc__match *m = &s->cm[k][i];
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

enum { MC__IGN_NONE, MC__IGN_COPY, MC__IGN_LIST, MC__IGN_LONG };
static const char *const mc__ignore_reason[] = {"", "copies the prompt or rubric text",
                                                "a list of rubric terms without a connective",
                                                "too long to be one sentence"};

static void mc__classify(mc__ctx *c, mc__sent *s) {
    mc__analyse_sentence(c, s);
    if (s->ntok > (int)c->R.rules.max_sentence_tokens)
        s->ignored = MC__IGN_LONG;
    else if (mc__is_copy(c, s))
        s->ignored = MC__IGN_COPY;
    else if (mc__distinct_terms(c, s) >= (int)c->R.rules.list_min_terms &&
             s->ncm[c->R.c_connective] == 0)
        s->ignored = MC__IGN_LIST;
}

/* Printable excerpt of a sentence: at most ~60 columns, cut on a character boundary. */
static char *mc__excerpt(mc__ctx *c, const char *raw) {
    size_t n = strlen(raw), i = 0;
    int cols = 0;
    while (i < n && cols < 44) {
        ucs4_t uc;
        int m = u8_mbtouc(&uc, (const uint8_t *)raw + i, n - i);
        if (m <= 0) m = 1;
        cols += mc__is_cjk(uc) || (uc >= 0xFF00 && uc <= 0xFFEF) ? 2 : 1;
        i += (size_t)m;
    }
    mc__sb b = {0};
    mc__sb_add(c, &b, "\"");
    mc__sb_addn(c, &b, raw, i);
    mc__sb_add(c, &b, i < n ? " ...\"" : "\"");
    return b.s;
}

// ---------------------------------------------------------------------------------------------
// >>prose  items

static mc__item *mc__new_item(mc__ctx *c, const char *id, const char *kind, const char *tag,
                              int part, double max) {
    mc__item *it = MC__PUSH(c, c->items, c->nitems, c->capitems);
    memset(it, 0, sizeof *it);
    snprintf(it->id, sizeof it->id, "%s", id);
    it->kind = kind;
    it->tag = tag;
    it->part = part;
    it->max = max;
    it->detail = mc__strdup(c, "");
    return it;
}

static void mc__more(mc__ctx *c, mc__item *it, const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    mc__sb_add(c, &it->more, buf);
    mc__sb_add(c, &it->more, "\n");
}

static int mc__json_has_string(const cJSON *list, const char *s) {
    const cJSON *e;
    cJSON_ArrayForEach(e,
                       list) if (cJSON_IsString(e) && strcasecmp(e->valuestring, s) == 0) return 1;
    return 0;
}

static mc__sec *mc__sheet_section(mc__ctx *c, int rub) {
    for (int i = 0; i < c->S.nsec; i++)
        if (c->S.sec[i].rub == rub) return &c->S.sec[i];
    return NULL;
}

static int mc__variant_active(mc__ctx *c, const cJSON *variants) {
    return variants == NULL || mc__json_has_string(variants, c->variant);
}

/* Per rubric section: size, density, and the floor. */
typedef struct mc__secstat {
    mc__sec *sec;
    int n_ignored;     /* sentences ignored by the copy / list / length rules */
    int first_ignored; /* index of the first one */
    double words_eq;   /* English words + CJK characters / 2, over counted sentences */
    int words, cjk;
    int floor_ok;
    double density;
    int *mc_matched; /* per misconception: matched somewhere in this section */
} mc__secstat;

static void mc__section_stats(mc__ctx *c, mc__secstat *st) {
    mc__sec *sec = st->sec;
    int occ = 0;
    if (sec != NULL) {
        for (int i = 0; i < sec->nsent; i++) {
            mc__sent *s = &sec->sent[i];
            mc__classify(c, s);
            if (s->ignored) {
                if (st->n_ignored++ == 0) st->first_ignored = i;
                continue;
            }
            st->words += s->words;
            st->cjk += s->cjk;
            occ += mc__term_occurrences(c, s);
        }
    }
    st->words_eq = st->words + st->cjk / 2.0;
    st->floor_ok = st->words >= c->R.rules.floor_en_words ||
                   st->cjk >= c->R.rules.floor_cjk_chars ||
                   st->words_eq >= c->R.rules.floor_en_words;
    st->density = st->words_eq > 0 ? occ / st->words_eq : 0;
}

/* Why a section scores nothing: empty, everything ignored, or below the length floor. */
static const char *mc__floor_text(mc__ctx *c, const mc__secstat *st) {
    mc__sb b = {0};
    if (st->sec == NULL || st->sec->nsent == 0) {
        mc__sb_add(c, &b, "the section has no text");
        return b.s;
    }
    mc__sb_printf(c, &b,
                  "section has %d words / %d CJK characters; the floor is %.0f English words or "
                  "%.0f CJK characters",
                  st->words, st->cjk, c->R.rules.floor_en_words, c->R.rules.floor_cjk_chars);
    if (st->n_ignored > 0) {
        const mc__sent *s = &st->sec->sent[st->first_ignored];
        mc__sb_printf(c, &b, "\n%d sentence%s not counted, e.g. line %d: %s", st->n_ignored,
                      st->n_ignored == 1 ? "" : "s", s->line, mc__ignore_reason[s->ignored]);
    }
    return b.s;
}

static const char *mc__floor_label(const mc__secstat *st) {
    if (st->sec == NULL || st->sec->nsent == 0) return "section empty";
    if (st->words + st->cjk == 0) return "nothing gradable";
    return "below the length floor";
}

/* ---- misconceptions ---- */

typedef struct mc__mcstate {
    int fired;
    int line;
    int part;
    const char *excerpt;
    mc__sb why;
} mc__mcstate;

/* A bracketed group list attributed to a group kind ("DP group [0,1]") that this run did not
   measure for that kind. */
static int mc__wrong_claim(mc__ctx *c, mc__sent *s, const mc__misc *m, mc__sb *why) {
    mc__blist *lists = NULL;
    mc__num *nums = NULL;
    int nl = 0, lc = 0, nn = 0, nc = 0;
    mc__extract_values(c, s->norm, &lists, &nl, &lc, &nums, &nn, &nc);
    for (int li = 0; li < nl; li++) {
        int tokidx = mc__tok_at(s, lists[li].start);
        const mc__claimkind *best = NULL;
        const mc__match *bm = NULL;
        for (int k = 0; k < c->R.nclaims; k++) {
            const mc__claimkind *ck = &c->R.claims[k];
            for (int i = 0; i < s->ncm[ck->concept]; i++) {
                const mc__match *mt = &s->cm[ck->concept][i];
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
        if (best == NULL || best->path == NULL || mc__negated_at(c, s, tokidx)) continue;
        int mine = 0;
        for (int k = 0; k < m->nclaims && !mine; k++)
        mine = m->claims[k] == best->concept;
        if (!mine) continue;
        const cJSON *meas = mc__path(c->results, best->path);
        if (!cJSON_IsArray(meas)) continue;
        for (int g = 0; g < lists[li].ninner; g++) {
            if (lists[li].inner_len[g] < 2) continue;
            int found = 0;
            const cJSON *e;
            cJSON_ArrayForEach(e, meas) {
                char *mg = mc__json_canon(c, e);
                if (mg != NULL && strcmp(mg, lists[li].inner[g]) == 0) found = 1;
            }
            if (!found) {
                mc__sb_printf(c, why, "%s group %s was not measured; measured %s = %s",
                              c->R.concepts[best->concept].id, lists[li].inner[g], best->path,
                              mc__json_short(c, meas, 60));
                return 1;
            }
        }
    }
    return 0;
}

static int mc__misc_in_scope(const mc__misc *m, const mc__rubric *R, int rub) {
    return m->scope == NULL || mc__json_has_string(m->scope, R->sec[rub].id);
}

static void mc__detect_misconceptions(mc__ctx *c, mc__secstat *stats, mc__mcstate *mcs) {
    const mc__rubric *R = &c->R;
    for (int mi = 0; mi < R->nmisc; mi++) {
        const mc__misc *m = &R->misc[mi];
        for (int r = 0; r < R->nsec; r++) {
            mc__sec *sec = stats[r].sec;
            if (sec == NULL || !mc__misc_in_scope(m, R, r)) continue;
            for (int i = 0; i < sec->nsent; i++) {
                mc__sent *s = &sec->sent[i];
                if (s->ignored) continue;
                mc__sb why = {0};
                int hit = 0;
                for (int p = 0; p < m->npat && !hit; p++) {
                    int res = mc__pattern_eval(c, s, &m->pat[p], 1);
                    hit = m->pat[p].negated ? res == 2 : res == 1;
                    if (hit && m->pat[p].negated)
                        mc__sb_add(c, &why, "negated form of a rubric statement");
                }
                if (!hit && m->nclaims > 0) hit = mc__wrong_claim(c, s, m, &why);
                if (!hit) continue;
                stats[r].mc_matched[mi] = 1;
                if (!mcs[mi].fired) {
                    mcs[mi].fired = 1;
                    mcs[mi].line = s->line;
                    mcs[mi].part = R->sec[r].part;
                    mcs[mi].excerpt = mc__excerpt(c, s->raw);
                    mcs[mi].why = why;
                }
            }
        }
    }
}

/* ---- explanation points ---- */

typedef struct mc__pstate {
    int active;
    int *cand; /* sentence indices with a positive match */
    int ncand, capcand;
    int neg_line; /* a sentence that matched only in negated form */
    int ign_line; /* an ignored sentence that would have matched */
    int ign_reason;
    int sent; /* assigned sentence, -1 if none */
} mc__pstate;

static int mc__kuhn(int p, mc__pstate *ps, int *owner, char *seen) {
    for (int i = 0; i < ps[p].ncand; i++) {
        int s = ps[p].cand[i];
        if (seen[s]) continue;
        seen[s] = 1;
        if (owner[s] < 0 || mc__kuhn(owner[s], ps, owner, seen)) {
            owner[s] = p;
            ps[p].sent = s;
            return 1;
        }
    }
    return 0;
}

static int mc__cmp_points_desc(const void *a, const void *b, void *arg) {
    const mc__point *pts = (const mc__point *)arg;
    double x = pts[*(const int *)a].points, y = pts[*(const int *)b].points;
    return (x < y) - (x > y);
}

static void mc__score_section_points(mc__ctx *c, int r, mc__secstat *st) {
    const mc__rubric *R = &c->R;
    mc__sec *sec = st->sec;
    int np = R->npoints;
    mc__pstate *ps = (mc__pstate *)mc__alloc(c, sizeof(mc__pstate) * (size_t)(np + 1));
    int *order = (int *)mc__alloc(c, sizeof(int) * (size_t)(np + 1));
    int nord = 0;
    double section_max = 0;
    for (int p = 0; p < np; p++) {
        const mc__point *pt = &R->points[p];
        ps[p].sent = -1;
        if (pt->section != r || !mc__variant_active(c, pt->variants)) continue;
        ps[p].active = 1;
        section_max += pt->points;
        order[nord++] = p;
        if (sec == NULL || !st->floor_ok) continue;
        for (int i = 0; i < sec->nsent; i++) {
            mc__sent *s = &sec->sent[i];
            if (s->ignored) {
                if (ps[p].ign_line == 0 && s->ignored != MC__IGN_LONG &&
                    mc__patterns_eval(c, s, pt->pat, pt->npat, pt->use_negation) == 1) {
                    ps[p].ign_line = s->line;
                    ps[p].ign_reason = s->ignored;
                }
                continue;
            }
            int res = mc__patterns_eval(c, s, pt->pat, pt->npat, pt->use_negation);
            if (res == 1)
                *MC__PUSH(c, ps[p].cand, ps[p].ncand, ps[p].capcand) = i;
            else if (res == 2 && ps[p].neg_line == 0)
                ps[p].neg_line = s->line;
        }
    }
    if (nord == 0) return;
    /* One point per sentence: a maximum matching, the heavier points tried first. */
    qsort_r(order, (size_t)nord, sizeof *order, mc__cmp_points_desc, R->points);
    if (sec != NULL && sec->nsent > 0) {
        int *owner = (int *)mc__alloc(c, sizeof(int) * (size_t)sec->nsent);
        char *seen = (char *)mc__alloc(c, (size_t)sec->nsent);
        for (int i = 0; i < sec->nsent; i++)
            owner[i] = -1;
        for (int k = 0; k < nord; k++) {
            memset(seen, 0, (size_t)sec->nsent);
            mc__kuhn(order[k], ps, owner, seen);
        }
    }
    double earned = 0;
    for (int p = 0; p < np; p++) {
        if (!ps[p].active || ps[p].sent < 0) continue;
        const mc__point *pt = &R->points[p];
        int contradicted = 0;
        for (int mi = 0; mi < R->nmisc && !contradicted; mi++)
            contradicted = st->mc_matched[mi] && mc__json_has_string(R->misc[mi].pairs, pt->id);
        if (!contradicted) earned += pt->points;
    }
    int capped =
        st->density > R->rules.density_cap && earned > R->rules.density_factor * section_max;
    double scale = capped ? R->rules.density_factor * section_max / earned : 1.0;
    for (int p = 0; p < np; p++) {
        if (!ps[p].active) continue;
        const mc__point *pt = &R->points[p];
        mc__item *it = mc__new_item(c, pt->id, "expl", "EXPL", R->sec[r].part, pt->points);
        if (sec == NULL) {
            it->detail = mc__strdup(c, "section missing");
            mc__more(c, it, "add the heading \"### %s %s\" and answer there", R->sec[r].id,
                     R->sec[r].title);
            continue;
        }
        if (!st->floor_ok) {
            it->detail = mc__strdup(c, mc__floor_label(st));
            mc__more(c, it, "%s", mc__floor_text(c, st));
            mc__more(c, it, "need: %s", pt->need);
            continue;
        }
        if (ps[p].sent < 0) {
            it->detail = mc__strdup(c, "not found");
            if (ps[p].ncand > 0) {
                mc__more(c, it,
                         "line %d matches, but that sentence already earned another point (one "
                         "point per sentence)",
                         sec->sent[ps[p].cand[0]].line);
            } else if (ps[p].neg_line > 0) {
                mc__more(c, it, "line %d matches only in negated form", ps[p].neg_line);
            } else if (ps[p].ign_line > 0) {
                mc__more(c, it, "line %d ignored: %s", ps[p].ign_line,
                         mc__ignore_reason[ps[p].ign_reason]);
            }
            mc__more(c, it, "need: %s", pt->need);
            continue;
        }
        const mc__sent *s = &sec->sent[ps[p].sent];
        it->line = s->line;
        mc__sb d = {0};
        mc__sb_printf(c, &d, "line %d %s", s->line, mc__excerpt(c, s->raw));
        it->detail = d.s;
        int contradicted = -1;
        for (int mi = 0; mi < R->nmisc && contradicted < 0; mi++)
            if (st->mc_matched[mi] && mc__json_has_string(R->misc[mi].pairs, pt->id))
                contradicted = mi;
        if (contradicted >= 0) {
            mc__more(c, it,
                     "contradicted: %s (%s) also appears in this section, so the point scores 0",
                     R->misc[contradicted].id, R->misc[contradicted].title);
            continue;
        }
        it->score = pt->points * scale;
        if (capped)
            mc__more(
                c, it,
                "section capped at %.0f%%: rubric terms are %.0f%% of its words (limit %.0f%%)",
                R->rules.density_factor * 100, st->density * 100, R->rules.density_cap * 100);
    }
}

/* ---- evidence ---- */

static int mc__num_matches(double quoted, int decimals, double measured) {
    if (decimals == 0) return fabs(quoted - measured) < 1e-9;
    return fabs(quoted - measured) <= 0.5 * pow(10.0, -decimals) + 1e-9;
}

static void mc__score_evidence(mc__ctx *c, const mc__evid *e, const mc__secstat *st) {
    const mc__rubric *R = &c->R;
    mc__item *it = mc__new_item(c, e->id, "evid", "EVID", R->sec[e->section].part, e->points);
    mc__sec *sec = st->sec;
    if (sec == NULL) {
        it->detail = mc__strdup(c, "section missing");
        mc__more(c, it, "add the heading \"### %s %s\"; need: %s", R->sec[e->section].id,
                 R->sec[e->section].title, e->need);
        return;
    }
    if (!st->floor_ok) {
        it->detail = mc__strdup(c, mc__floor_label(st));
        mc__more(c, it, "%s", mc__floor_text(c, st));
        mc__more(c, it, "need: %s", e->need);
        return;
    }
    mc__facts F = {0}, ign = {0};
    mc__flatten(c, mc__path(c->results, e->facts_path), &F, 0);
    const cJSON *p;
    cJSON_ArrayForEach(p, e->ignore_paths) if (cJSON_IsString(p))
        mc__flatten(c, mc__path(c->results, p->valuestring), &ign, 0);
    cJSON_ArrayForEach(p, e->ignore_numbers) if (cJSON_IsNumber(p))
        mc__facts_add_num(c, &ign, p->valuedouble);

    mc__sb ok = {0}, bad = {0};
    int nok = 0, nbad = 0, first_line = 0;
    const char *seen[256];
    int nseen = 0;
    for (int i = 0; i < sec->nsent; i++) {
        mc__sent *s = &sec->sent[i];
        if (s->ignored == MC__IGN_COPY || s->ignored == MC__IGN_LONG) continue;
        mc__blist *lists = NULL;
        mc__num *nums = NULL;
        int nl = 0, lc = 0, nn = 0, nc = 0;
        mc__extract_values(c, s->norm, &lists, &nl, &lc, &nums, &nn, &nc);
        for (int k = 0; k < nl + nn; k++) {
            const char *key;
            int verified = 0;
            if (k < nl) {
                key = lists[k].canon;
                for (int f = 0; f < F.nlist && !verified; f++)
                    verified = strcmp(F.list[f], key) == 0;
            } else {
                const mc__num *x = &nums[k - nl];
                int config = 0;
                for (int f = 0; f < ign.nnum && !config; f++)
                    config = fabs(ign.num[f] - x->v) < 1e-9;
                if (config) continue; /* configuration, not a measurement */
                key = mc__strdup(c, x->text);
                for (int f = 0; f < F.nnum && !verified; f++)
                    verified = mc__num_matches(x->v, x->decimals, F.num[f]);
            }
            int dup = 0;
            for (int j = 0; j < nseen && !dup; j++)
                dup = strcmp(seen[j], key) == 0;
            if (dup || nseen >= 256) continue;
            seen[nseen++] = key;
            mc__sb *dst = verified ? &ok : &bad;
            mc__sb_printf(c, dst, "%s\"%s\"", dst->len ? ", " : "", key);
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
    mc__sb d = {0};
    mc__sb_printf(c, &d, "%d value%s quoted, %d verified", nok + nbad, nok + nbad == 1 ? "" : "s",
                  nok);
    it->detail = d.s;
    if (nok > 0) mc__more(c, it, "verified: %s", mc__sb_str(&ok));
    if (nbad > 0) mc__more(c, it, "value not from this run: %s", mc__sb_str(&bad));
    if (it->score < e->points) mc__more(c, it, "need: %s", e->need);
}

/* ---- quality ---- */

static void mc__score_quality(mc__ctx *c, const mc__quality *q, const mc__secstat *stats) {
    const mc__rubric *R = &c->R;
    mc__item *it = mc__new_item(c, q->id, "quality", "QUAL", q->part, q->points);
    mc__sb why = {0};
    const cJSON *sid;
    cJSON_ArrayForEach(sid, q->sections) {
        int r = cJSON_IsString(sid) ? mc__rsec_index(R, sid->valuestring) : -1;
        if (r < 0) continue;
        if (stats[r].sec == NULL)
            mc__sb_printf(c, &why, "%s missing; ", R->sec[r].id);
        else if (!stats[r].floor_ok)
            mc__sb_printf(c, &why, "%s below the length floor; ", R->sec[r].id);
    }
    for (int r = 0; r < R->nsec; r++) {
        if (R->sec[r].part != q->part) continue;
        for (int mi = 0; mi < R->nmisc; mi++)
            if (stats[r].mc_matched[mi])
                mc__sb_printf(c, &why, "%s in %s; ", R->misc[mi].id, R->sec[r].id);
    }
    if (why.len == 0) {
        it->score = q->points;
        it->detail = mc__strdup(c, "floors met, no misconception");
    } else {
        it->detail = mc__strdup(c, "not earned");
        mc__more(c, it, "%s", mc__sb_str(&why));
        mc__more(c, it, "need: %s", q->need);
    }
}

/* ---- predictions ---- */

static const mc__pv *mc__find_pv(const mc__pv *pv, int n, const char *key) {
    for (int i = 0; i < n; i++)
        if (strcmp(pv[i].key, key) == 0) return &pv[i];
    return NULL;
}

static void mc__score_prediction_group(mc__ctx *c, const cJSON *g, mc__pv *const *pv,
                                       const int *npv, double factor) {
    const char *gid = mc__jstr(g, "id", "P");
    int part = mc__part_from_name(mc__jstr(g, "part", "main"));
    if (part == MC__PART_OTHER) part = MC__PART_MAIN;
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(g, "items");
    const cJSON *byv = cJSON_GetObjectItemCaseSensitive(g, "by_variant");
    if (byv != NULL) items = cJSON_GetObjectItemCaseSensitive(byv, c->variant);
    if (!cJSON_IsArray(items)) {
        mc__item *it = mc__new_item(c, gid, "pred", "PRED", part, mc__jnum(g, "points", 0));
        it->detail = mc__strdup(c, "no items for this variant");
        mc__more(c, it, "the rubric has no prediction items for variant \"%s\"", c->variant);
        return;
    }
    const cJSON *x;
    cJSON_ArrayForEach(x, items) {
        mc__pitem pi;
        memset(&pi, 0, sizeof pi);
        snprintf(pi.key, sizeof pi.key, "%s", mc__jstr(x, "key", "?"));
        snprintf(pi.id, sizeof pi.id, "%.15s.%.31s", gid, pi.key);
        pi.type = mc__jstr(x, "type", "exact");
        pi.path = mc__jstr(x, "path", "");
        pi.points = mc__jnum(x, "points", 0);
        pi.spec = (cJSON *)x;
        mc__verdict v;
        memset(&v, 0, sizeof v);
        const mc__pv *val = mc__find_pv(pv[part], npv[part], pi.key);
        mc__judge(c, &pi, val, &v);
        mc__item *it = mc__new_item(c, pi.id, "pred", "PRED", part, pi.points);
        it->score = v.frac * pi.points * factor;
        it->line = val != NULL ? val->line : 0;
        it->detail = mc__strdup(c, mc__sb_str(&v.detail));
        if (v.more.len) mc__more(c, it, "%s", mc__sb_str(&v.more));
        if (factor < 1.0 && v.frac > 0)
            mc__more(c, it, "halved: predictions were not locked before the run");
    }
}

static void mc__score_predictions(mc__ctx *c, double factor) {
    mc__pv *pv[2] = {NULL, NULL};
    int npv[2] = {0, 0}, cap[2] = {0, 0};
    for (int i = 0; i < c->S.npb; i++) {
        int part = c->S.pb[i].part == MC__PART_FOLLOWUP ? 1 : 0;
        mc__parse_pred_block(c, &c->S.pb[i], &pv[part], &npv[part], &cap[part]);
    }
    const cJSON *g;
    cJSON_ArrayForEach(g, c->R.predictions) mc__score_prediction_group(c, g, pv, npv, factor);
}

/* ---- penalties ---- */

static void mc__misconception_items(mc__ctx *c, const mc__mcstate *mcs) {
    const mc__rubric *R = &c->R;
    double left = R->rules.penalty_cap;
    for (int mi = 0; mi < R->nmisc; mi++) {
        const mc__misc *m = &R->misc[mi];
        int part = mcs[mi].fired ? mcs[mi].part : MC__PART_MAIN;
        if (!mcs[mi].fired && m->scope != NULL) { /* report it where it could have fired */
            int r = mc__rsec_index(R, cJSON_IsString(cJSON_GetArrayItem(m->scope, 0))
                                          ? cJSON_GetArrayItem(m->scope, 0)->valuestring
                                          : "");
            if (r >= 0) part = R->sec[r].part;
        }
        mc__item *it = mc__new_item(c, m->id, "misc", "MISC", part, 0);
        if (!mcs[mi].fired) {
            it->detail = mc__strdup(c, "did not fire");
            continue;
        }
        double pen = fmin(m->penalty, left);
        left -= pen;
        it->fired = 1;
        it->score = -pen;
        it->line = mcs[mi].line;
        mc__sb d = {0};
        mc__sb_printf(c, &d, "%s: line %d %s", m->title, mcs[mi].line, mcs[mi].excerpt);
        it->detail = d.s;
        if (mcs[mi].why.len) mc__more(c, it, "%s", mc__sb_str(&mcs[mi].why));
        mc__sb meas = {0};
        const cJSON *p;
        cJSON_ArrayForEach(p, m->refute) if (cJSON_IsString(p))
            mc__sb_printf(c, &meas, "%s%s=%s", meas.len ? "; " : "", p->valuestring,
                          mc__json_short(c, mc__path(c->results, p->valuestring), 50));
        if (meas.len) mc__more(c, it, "measured: %s", mc__sb_str(&meas));
        if (m->feedback[0]) mc__more(c, it, "%s", m->feedback);
        if (m->citation[0]) mc__more(c, it, "see %s", m->citation);
        if (pen < m->penalty)
            mc__more(c, it, "penalty reduced: the total is capped at %.2f", R->rules.penalty_cap);
    }
}

// ---------------------------------------------------------------------------------------------
// >>report

static int mc__display_width(const char *s) {
    int w = 0;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        ucs4_t uc;
        int m = u8_mbtouc(&uc, (const uint8_t *)s + i, n - i);
        if (m <= 0) m = 1;
        w += mc__is_cjk(uc) || (uc >= 0xFF00 && uc <= 0xFFEF) || (uc >= 0x3000 && uc <= 0x303F) ? 2
                                                                                                : 1;
        i += (size_t)m;
    }
    return w;
}

static void mc__dots(mc__ctx *c, mc__sb *out, int from, int to) {
    mc__sb_add(c, out, " ");
    for (int i = from + 1; i < to - 1; i++)
        mc__sb_add(c, out, ".");
    mc__sb_add(c, out, " ");
}

static void mc__print_item(mc__ctx *c, mc__sb *out, const mc__item *it) {
    mc__sb row = {0};
    mc__sb_printf(c, &row, "[%s] %s", it->tag, it->id);
    int col = mc__display_width(mc__sb_str(&row));
    if (col < 34) {
        mc__dots(c, &row, col, 35);
        col = 35;
    } else {
        mc__sb_add(c, &row, " ");
        col++;
    }
    mc__sb_add(c, &row, it->detail);
    col += mc__display_width(it->detail);
    char score[32];
    if (strcmp(it->kind, "misc") == 0)
        snprintf(score, sizeof score, "%.2f", it->score == 0 ? 0.0 : it->score);
    else
        snprintf(score, sizeof score, "%.2f/%.2f", it->score, it->max);
    int target = MC__TABLE_WIDTH - (int)strlen(score);
    if (col + 2 < target)
        mc__dots(c, &row, col, target);
    else
        mc__sb_add(c, &row, " ");
    mc__sb_add(c, &row, score);
    mc__sb_add(c, out, mc__sb_str(&row));
    mc__sb_add(c, out, "\n");
    const char *m = mc__sb_str(&it->more);
    while (*m != '\0') {
        const char *nl = strchr(m, '\n');
        size_t len = nl != NULL ? (size_t)(nl - m) : strlen(m);
        mc__sb_add(c, out, "       ");
        mc__sb_addn(c, out, m, len);
        mc__sb_add(c, out, "\n");
        m += len + (nl != NULL);
    }
}

static void mc__print_part(mc__ctx *c, mc__sb *out, int part) {
    static const char *const kinds[] = {"pred", "expl", "evid", "quality", "misc"};
    int fired = 0, nmisc = 0;
    for (int k = 0; k < 5; k++) {
        for (int i = 0; i < c->nitems; i++) {
            const mc__item *it = &c->items[i];
            if (it->part != part || strcmp(it->kind, kinds[k]) != 0) continue;
            if (strcmp(it->kind, "misc") == 0) {
                nmisc++;
                if (!it->fired) continue;
                fired++;
            }
            mc__print_item(c, out, it);
        }
    }
    if (nmisc > 0 && fired == 0) mc__sb_add(c, out, "[MISC] no misconception fired\n");
}

static char *mc__config_line(mc__ctx *c) {
    mc__sb b = {0};
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(c->results, "config");
    const cJSON *f;
    cJSON_ArrayForEach(f, c->R.header_fields) {
        if (!cJSON_IsString(f)) continue;
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, f->valuestring);
        if (cJSON_IsNumber(v))
            mc__sb_printf(c, &b, " %s=%g", f->valuestring, v->valuedouble);
        else if (cJSON_IsString(v))
            mc__sb_printf(c, &b, " %s=%s", f->valuestring, v->valuestring);
    }
    return b.s != NULL ? b.s : mc__strdup(c, "");
}

typedef struct mc__totals {
    double main, main_max, fu, fu_max, penalty;
    int locked, filled, near_empty;
} mc__totals;

static double mc__round2(double x) { return floor(x * 100.0 + 0.5 + 1e-9) / 100.0; }

static void mc__sum(mc__ctx *c, mc__totals *t) {
    double pos[2] = {0, 0}, pen[2] = {0, 0};
    for (int i = 0; i < c->nitems; i++) {
        const mc__item *it = &c->items[i];
        int p = it->part == MC__PART_FOLLOWUP ? 1 : 0;
        if (it->score < 0)
            pen[p] += -it->score;
        else
            pos[p] += it->score;
    }
    t->main = mc__round2(fmax(0.0, pos[0] - pen[0]));
    t->fu = mc__round2(fmax(0.0, pos[1] - pen[1]));
    t->penalty = pen[0] + pen[1];
    t->main_max = c->R.max_main;
    t->fu_max = c->R.max_followup;
}

static void mc__print_report(mc__ctx *c, FILE *out, const mc__totals *t) {
    if (out == NULL) return;
    mc__sb b = {0};
    const mc__rubric *R = &c->R;
    mc__sb_printf(c, &b, "%s / %s %s  nonce=%s probe=%s followup=%s  locked=%s\n", R->lab,
                  R->question, mc__config_line(c), mc__jstr(c->results, "nonce", "?"),
                  mc__json_short(c, cJSON_GetObjectItemCaseSensitive(c->results, "probe_rank"), 8),
                  c->variant[0] ? c->variant : "?",
                  t->locked   ? "yes"
                  : t->filled ? "NO"
                              : "no (no predictions)");
    if (!t->locked && t->filled > 0)
        mc__sb_add(c, &b, "PREDICTIONS NOT LOCKED BEFORE RUN (prediction points halved)\n");
    if (c->warnings.len) mc__sb_add(c, &b, mc__sb_str(&c->warnings));
    mc__print_part(c, &b, MC__PART_MAIN);
    const cJSON *var = cJSON_GetObjectItemCaseSensitive(R->variants, c->variant);
    mc__sb sep = {0};
    mc__sb_printf(c, &sep, "-- follow-up %s: %s ", c->variant, mc__jstr(var, "title", ""));
    while (mc__display_width(mc__sb_str(&sep)) < MC__TABLE_WIDTH)
        mc__sb_add(c, &sep, "-");
    mc__sb_printf(c, &b, "%s\n", mc__sb_str(&sep));
    mc__print_part(c, &b, MC__PART_FOLLOWUP);
    for (int i = 0; i < MC__TABLE_WIDTH; i++)
        mc__sb_add(c, &b, "-");
    mc__sb_printf(c, &b, "\nMain %.2f/%g   Follow-up %.2f/%g", t->main, t->main_max, t->fu,
                  t->fu_max);
    if (t->penalty > 0) mc__sb_printf(c, &b, "   (penalties -%.2f included)", t->penalty);
    mc__sb_printf(c, &b, "   heuristic grader; rubric %s%s%s\n", R->version,
                  R->source_version[0] ? ", " : "", R->source_version);
    if (t->near_empty) {
        const cJSON *l;
        mc__sb_add(c, &b, "\nWhat to do next:\n");
        cJSON_ArrayForEach(
            l, cJSON_GetObjectItemCaseSensitive(R->root, "next_steps")) if (cJSON_IsString(l))
            mc__sb_printf(c, &b, "  %s\n", l->valuestring);
        mc__sb_add(c, &b, "\n");
    }
    mc__sb_printf(c, &b, "Total %.2f/%g\n", mc__round2(t->main + t->fu), t->main_max + t->fu_max);
    fputs(mc__sb_str(&b), out);
    fflush(out);
}

static char *mc__item_output(mc__ctx *c, const mc__item *it) {
    mc__sb b = {0};
    mc__sb_add(c, &b, it->detail);
    if (it->more.len) {
        mc__sb_add(c, &b, "\n");
        mc__sb_add(c, &b, mc__sb_str(&it->more));
        while (b.len > 0 && b.s[b.len - 1] == '\n')
            b.s[--b.len] = '\0';
    }
    return b.s;
}

static void mc__write_grade_json(mc__ctx *c, const char *path, const mc__totals *t) {
    if (path == NULL) return;
    cJSON *root = mc__keep_json(c, cJSON_CreateObject());
    if (root == NULL) mc__fail(c, MC_ERR_NO_MEMORY, "grader: out of memory");
    cJSON_AddStringToObject(root, "lab", c->R.lab);
    cJSON_AddStringToObject(root, "question", c->R.question);
    cJSON_AddStringToObject(root, "rubric_version", c->R.version);
    cJSON_AddNumberToObject(root, "score", mc__round2(t->main + t->fu));
    cJSON_AddNumberToObject(root, "max_score", t->main_max + t->fu_max);
    cJSON *m = cJSON_AddObjectToObject(root, "main");
    cJSON_AddNumberToObject(m, "score", t->main);
    cJSON_AddNumberToObject(m, "max_score", t->main_max);
    cJSON *f = cJSON_AddObjectToObject(root, "followup");
    cJSON_AddNumberToObject(f, "score", t->fu);
    cJSON_AddNumberToObject(f, "max_score", t->fu_max);
    cJSON_AddStringToObject(f, "variant", c->variant);
    cJSON_AddNumberToObject(root, "penalties", mc__round2(t->penalty));
    cJSON_AddBoolToObject(root, "predictions_locked", t->locked);
    cJSON_AddStringToObject(root, "nonce", mc__jstr(c->results, "nonce", ""));
    cJSON_AddStringToObject(root, "visibility", "visible");
    cJSON *tests = cJSON_AddArrayToObject(root, "tests");
    for (int i = 0; i < c->nitems; i++) {
        const mc__item *it = &c->items[i];
        cJSON *o = cJSON_CreateObject();
        if (o == NULL) mc__fail(c, MC_ERR_NO_MEMORY, "grader: out of memory");
        cJSON_AddItemToArray(tests, o);
        cJSON_AddStringToObject(o, "name", it->id);
        cJSON_AddStringToObject(o, "kind", it->kind);
        cJSON_AddStringToObject(o, "part", mc__part_name[it->part == MC__PART_FOLLOWUP]);
        cJSON_AddNumberToObject(o, "score", mc__round2(it->score));
        cJSON_AddNumberToObject(o, "max_score", it->max);
        if (it->line > 0) cJSON_AddNumberToObject(o, "line", it->line);
        cJSON_AddStringToObject(o, "output", mc__item_output(c, it));
    }
    char *text = cJSON_Print(root);
    if (text == NULL) mc__fail(c, MC_ERR_NO_MEMORY, "grader: out of memory");
    FILE *fp = fopen(path, "w");
    if (fp == NULL) {
        free(text);
        mc__warn(c, "warning: cannot write %s", path);
        return;
    }
    fputs(text, fp);
    fputs("\n", fp);
    fclose(fp);
    free(text);
}

static int mc__fill_report(mc__ctx *c, mc_grade_report *r, const mc__totals *t) {
    memset(r, 0, sizeof *r);
    r->main_score = t->main;
    r->main_max = t->main_max;
    r->followup_score = t->fu;
    r->followup_max = t->fu_max;
    r->total = mc__round2(t->main + t->fu);
    r->total_max = t->main_max + t->fu_max;
    r->penalty_total = mc__round2(t->penalty);
    r->locked = t->locked;
    r->predictions_filled = t->filled;
    r->near_empty = t->near_empty;
    snprintf(r->nonce, sizeof r->nonce, "%s", mc__jstr(c->results, "nonce", ""));
    r->probe_rank = (int)mc__jnum(c->results, "probe_rank", -1);
    snprintf(r->variant, sizeof r->variant, "%s", c->variant);
    r->items = (mc_grade_item *)calloc((size_t)(c->nitems + 1), sizeof(mc_grade_item));
    if (r->items == NULL) return MC_ERR_NO_MEMORY;
    for (int i = 0; i < c->nitems; i++) {
        const mc__item *it = &c->items[i];
        mc_grade_item *o = &r->items[i];
        snprintf(o->id, sizeof o->id, "%s", it->id);
        snprintf(o->kind, sizeof o->kind, "%s", it->kind);
        snprintf(o->part, sizeof o->part, "%s", mc__part_name[it->part == MC__PART_FOLLOWUP]);
        o->score = it->score;
        o->max_score = it->max;
        o->line = it->line;
        o->fired = it->fired;
        o->output = strdup(mc__item_output(c, it));
        r->n_items = i + 1;
        if (o->output == NULL) return MC_ERR_NO_MEMORY;
    }
    return MC_OK;
}

// ---------------------------------------------------------------------------------------------
// >>api

static void mc__load_results(mc__ctx *c, const char *path) {
    size_t n = 0;
    char *text = mc__read_file(path, MC__MAX_JSON_BYTES, &n, NULL);
    const char *run = mc__jstr(c->R.root, "run_command", "the lab");
    if (text == NULL)
        mc__fail(
            c, MC_ERR_IO,
            "%s not found: run `%s` first (it measures the facts this sheet is graded against)",
            path != NULL ? path : "(results path not given)", run);
    c->results = mc__keep_json(c, cJSON_Parse(text));
    free(text);
    if (c->results == NULL)
        mc__fail(c, MC_ERR_IO, "%s is not valid JSON: run `%s` again", path, run);
    c->facts = cJSON_GetObjectItemCaseSensitive(c->results, "facts");
    if (!cJSON_IsObject(c->facts))
        mc__fail(c, MC_ERR_IO, "%s has no \"facts\" object: run `%s` again", path, run);
}

static void mc__pick_variant(mc__ctx *c) {
    const char *v = mc__jstr(c->results, "followup_variant", NULL);
    if (v == NULL) v = mc__jstr(mc__path(c->results, "facts.followup"), "variant", NULL);
    if (v == NULL && c->S.has_header) v = c->S.variant;
    snprintf(c->variant, sizeof c->variant, "%s", v != NULL ? v : "");
    if (c->S.has_header && c->S.variant[0] && strcmp(c->S.variant, c->variant) != 0)
        mc__warn(c,
                 "warning: the sheet's follow-up is %s but the run measured %s; the follow-up is "
                 "graded as %s",
                 c->S.variant, c->variant, c->variant);
    const char *rn = mc__jstr(c->results, "nonce", NULL);
    if (c->S.has_header && rn != NULL && strcmp(rn, c->S.nonce) != 0)
        mc__warn(c,
                 "warning: the sheet's nonce %s differs from the run's nonce %s (results of "
                 "another sheet?)",
                 c->S.nonce, rn);
    const char *rv = mc__jstr(c->results, "rubric_version", NULL);
    if (rv != NULL && strcmp(rv, c->R.version) != 0)
        mc__warn(c, "warning: results were written for rubric %s, grading with %s", rv,
                 c->R.version);
}

/* Locked = predictions present at run time and the sheet's pred blocks unchanged since. */
static void mc__lock_state(mc__ctx *c, mc__totals *t) {
    char hex[17];
    mc__sheet_pred_hash(c, hex, &t->filled);
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(c->results, "predictions");
    int present = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pr, "present_at_run"));
    const char *stored = mc__jstr(pr, "hash", "");
    t->locked = t->filled > 0 && present && strcasecmp(stored, hex) == 0;
    if (t->filled > 0 && !t->locked) {
        if (!present)
            mc__warn(c, "predictions were absent when the lab ran and are present now");
        else
            mc__warn(c, "the pred blocks changed after the run (hash %s, recorded %s)", hex,
                     stored);
    }
}

/* MC_GRADE_DEBUG=1: per-section sizes and densities, and every sentence with its concepts, on
   stderr (for writing rubrics and fixtures). */
static void mc__debug_sections(mc__ctx *c, const mc__secstat *stats) {
    const mc__rubric *R = &c->R;
    for (int r = 0; r < R->nsec; r++) {
        const mc__sec *sec = stats[r].sec;
        fprintf(stderr, "[debug] %s: %d words, %d cjk, density %.2f, floor %s\n", R->sec[r].id,
                stats[r].words, stats[r].cjk, stats[r].density,
                stats[r].floor_ok ? "ok" : "NOT met");
        for (int i = 0; sec != NULL && i < sec->nsent; i++) {
            const mc__sent *s = &sec->sent[i];
            fprintf(stderr, "[debug]   line %d%s%s:", s->line, s->ignored ? " IGNORED " : "",
                    mc__ignore_reason[s->ignored]);
            for (int k = 0; k < R->nconcepts; k++)
                if (s->ncm != NULL && s->ncm[k] > 0)
                    fprintf(stderr, " %s%s", R->concepts[k].id, s->cm[k][0].neg ? "(neg)" : "");
            fprintf(stderr, "\n");
        }
    }
}

static void mc__grade_all(mc__ctx *c, const mc_grade_desc *d, FILE *out, mc_grade_report *report) {
    mc__load_rubric(c, d->rubric_path);
    mc__load_results(c, d->results_path);
    size_t n = 0;
    int truncated = 0;
    char *text = mc__read_file(d->answers_path, MC__MAX_SHEET_BYTES, &n, &truncated);
    if (text != NULL) {
        char *copy = mc__strndup(c, text, n);
        free(text);
        if (truncated)
            mc__warn(c, "warning: %s is larger than %zu bytes; only the start is graded",
                     d->answers_path, n);
        mc__parse_sheet(c, copy, n);
    } else {
        mc__warn(c, "no answer sheet at %s: run `%s --init` to create it",
                 d->answers_path ? d->answers_path : "(none)",
                 mc__jstr(c->R.root, "lab_binary", "./lab"));
    }
    mc__pick_variant(c);
    mc__add_prompt_json(c, c->R.root, 0);

    mc__totals t;
    memset(&t, 0, sizeof t);
    mc__lock_state(c, &t);
    mc__score_predictions(c, t.locked || t.filled == 0 ? 1.0 : c->R.rules.unlocked_factor);

    const mc__rubric *R = &c->R;
    mc__secstat *stats = (mc__secstat *)mc__alloc(c, sizeof(mc__secstat) * (size_t)(R->nsec + 1));
    double written = 0;
    for (int r = 0; r < R->nsec; r++) {
        stats[r].sec = mc__sheet_section(c, r);
        stats[r].mc_matched = (int *)mc__alloc(c, sizeof(int) * (size_t)(R->nmisc + 1));
        mc__section_stats(c, &stats[r]);
        written += stats[r].words_eq;
        if (stats[r].sec != NULL && stats[r].sec->dropped > 0)
            mc__warn(c, "warning: section %s has more than %d sentences; the rest is not graded",
                     R->sec[r].id, MC__MAX_SENTENCES_PER_SECTION);
    }
    if (getenv("MC_GRADE_DEBUG") != NULL) mc__debug_sections(c, stats);
    mc__mcstate *mcs = (mc__mcstate *)mc__alloc(c, sizeof(mc__mcstate) * (size_t)(R->nmisc + 1));
    mc__detect_misconceptions(c, stats, mcs);
    for (int r = 0; r < R->nsec; r++)
        mc__score_section_points(c, r, &stats[r]);
    for (int e = 0; e < R->nevid; e++)
        mc__score_evidence(c, &R->evid[e], &stats[R->evid[e].section]);
    for (int q = 0; q < R->nquality; q++)
        mc__score_quality(c, &R->quality[q], stats);
    mc__misconception_items(c, mcs);

    mc__sum(c, &t);
    t.near_empty = t.filled == 0 && written < R->rules.floor_en_words;
    mc__print_report(c, out, &t);
    mc__write_grade_json(c, d->grade_out_path, &t);
    if (report != NULL) {
        int rc = mc__fill_report(c, report, &t);
        if (rc != MC_OK) {
            mc_grade_report_free(report);
            mc__fail(c, rc, "grader: out of memory");
        }
    }
}

int mc_grade(const mc_grade_desc *desc, mc_grade_report *report) {
    if (report != NULL) memset(report, 0, sizeof *report);
    if (desc == NULL) return MC_ERR_INVALID_ARG;
    FILE *out = desc->quiet ? NULL : desc->out != NULL ? desc->out : stdout;
    mc__ctx *c = mc__ctx_new();
    if (c == NULL) return MC_ERR_NO_MEMORY;
    int rc = setjmp(c->jmp);
    if (rc != 0) {
        if (out != NULL) fprintf(out, "grader: %s\n", c->err);
        mc__ctx_free(c);
        return rc;
    }
    mc__grade_all(c, desc, out, report);
    mc__ctx_free(c);
    return MC_OK;
}

void mc_grade_report_free(mc_grade_report *report) {
    if (report == NULL) return;
    for (int i = 0; i < report->n_items; i++)
        free(report->items[i].output);
    free(report->items);
    report->items = NULL;
    report->n_items = 0;
}

int mc_grade_prediction_hash(const char *answers_path, char hex_out[17], int *n_filled) {
    if (hex_out == NULL) return MC_ERR_INVALID_ARG;
    hex_out[0] = '\0';
    int filled = 0;
    size_t n = 0;
    char *text = mc__read_file(answers_path, MC__MAX_SHEET_BYTES, &n, NULL);
    if (text == NULL) return MC_ERR_IO;
    mc__ctx *c = mc__ctx_new();
    if (c == NULL) {
        free(text);
        return MC_ERR_NO_MEMORY;
    }
    int rc = setjmp(c->jmp);
    if (rc != 0) {
        free(text);
        mc__ctx_free(c);
        return rc;
    }
    mc__parse_sheet(c, text, n);
    mc__sheet_pred_hash(c, hex_out, &filled);
    free(text);
    mc__ctx_free(c);
    if (n_filled != NULL) *n_filled = filled;
    return MC_OK;
}

int mc_grade_read_header(const char *answers_path, char nonce_out[17], int *probe_rank,
                         char variant_out[8]) {
    size_t n = 0;
    char *text = mc__read_file(answers_path, MC__MAX_SHEET_BYTES, &n, NULL);
    if (text == NULL) return MC_ERR_IO;
    char nonce[17] = {0}, variant[8] = {0};
    int probe = -1;
    int ok = mc__parse_header_text(text, nonce, &probe, variant);
    free(text);
    if (!ok) return MC_ERR_INVALID_DESC;
    if (nonce_out != NULL) memcpy(nonce_out, nonce, sizeof nonce);
    if (probe_rank != NULL) *probe_rank = probe;
    if (variant_out != NULL) memcpy(variant_out, variant, sizeof variant);
    return MC_OK;
}

/* Replaces every "{name}" in text by its value. */
static char *mc__substitute(mc__ctx *c, const char *text, const char *const *names,
                            const char *const *values, int n) {
    mc__sb b = {0};
    for (const char *p = text; *p != '\0';) {
        int done = 0;
        if (*p == '{') {
            for (int i = 0; i < n && !done; i++) {
                size_t len = strlen(names[i]);
                if (strncmp(p + 1, names[i], len) == 0 && p[len + 1] == '}') {
                    mc__sb_add(c, &b, values[i]);
                    p += len + 2;
                    done = 1;
                }
            }
        }
        if (!done) mc__sb_addn(c, &b, p++, 1);
    }
    return b.s != NULL ? b.s : mc__strdup(c, "");
}

static char *mc__join_lines(mc__ctx *c, const cJSON *lines) {
    mc__sb b = {0};
    const cJSON *l;
    cJSON_ArrayForEach(l, lines) {
        if (!cJSON_IsString(l)) continue;
        if (b.len) mc__sb_add(c, &b, "\n");
        mc__sb_add(c, &b, l->valuestring);
    }
    return b.s != NULL ? b.s : mc__strdup(c, "");
}

static int mc__has_content_beyond_template(mc__ctx *c, const char *text, size_t n) {
    mc__parse_sheet(c, text, n);
    for (int i = 0; i < c->S.nsec; i++)
        if (c->S.sec[i].nsent > 0) return 1;
    char hex[17];
    int filled = 0;
    mc__sheet_pred_hash(c, hex, &filled);
    return filled > 0;
}

static int mc__write_template(mc__ctx *c, const char *rubric_path, const char *answers_path,
                              const char *nonce, int probe_rank, const char *variant, int force) {
    size_t n = 0;
    char *rt = mc__read_file(rubric_path, MC__MAX_JSON_BYTES, &n, NULL);
    if (rt == NULL)
        mc__fail(c, MC_ERR_IO, "rubric %s cannot be read", rubric_path ? rubric_path : "(null)");
    cJSON *root = mc__keep_json(c, cJSON_Parse(rt));
    free(rt);
    if (root == NULL) mc__fail(c, MC_ERR_INVALID_DESC, "rubric %s is not valid JSON", rubric_path);
    const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(root, "template");
    if (!cJSON_IsArray(tmpl))
        mc__fail(c, MC_ERR_INVALID_DESC, "rubric %s has no \"template\" lines", rubric_path);
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(root, "pred_template");
    const cJSON *var = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(root, "variants"), variant);
    char probe[16];
    snprintf(probe, sizeof probe, "%d", probe_rank);
    const char *names[] = {"nonce", "probe_rank", "variant", "variant_title", "variant_question"};
    const char *values[] = {nonce, probe, variant, mc__jstr(var, "title", ""),
                            mc__jstr(var, "question", "")};
    const char *blocks[] = {"pred_main", "pred_followup"};
    const char *bodies[] = {mc__join_lines(c, cJSON_GetObjectItemCaseSensitive(pt, "main")),
                            mc__join_lines(c, cJSON_GetObjectItemCaseSensitive(pt, variant))};
    char *text = mc__substitute(c, mc__join_lines(c, tmpl), blocks, bodies, 2);
    text = mc__substitute(c, text, names, values, 5);

    size_t en = 0;
    char *existing = mc__read_file(answers_path, MC__MAX_SHEET_BYTES, &en, NULL);
    if (existing != NULL) {
        char *copy = mc__strndup(c, existing, en);
        free(existing);
        if (!force && mc__has_content_beyond_template(c, copy, en)) return 1;
    }
    FILE *f = fopen(answers_path, "w");
    if (f == NULL) mc__fail(c, MC_ERR_IO, "cannot write %s", answers_path);
    fputs(text, f);
    fputs("\n", f);
    if (fclose(f) != 0) mc__fail(c, MC_ERR_IO, "cannot write %s", answers_path);
    return 0;
}

int mc_grade_write_template(const char *rubric_path, const char *answers_path, const char *nonce,
                            int probe_rank, const char *variant, int force) {
    if (answers_path == NULL || nonce == NULL || variant == NULL) return MC_ERR_INVALID_ARG;
    mc__ctx *c = mc__ctx_new();
    if (c == NULL) return MC_ERR_NO_MEMORY;
    int rc = setjmp(c->jmp);
    if (rc == 0)
        rc = mc__write_template(c, rubric_path, answers_path, nonce, probe_rank, variant, force);
    mc__ctx_free(c);
    return rc;
}
