/* labs/grader.c - the workbook's answer-sheet grader. How a sheet is graded is described in
   grader.h and in labs/rubric/SCHEMA.md; every rule, phrase and threshold comes from the
   rubric files (labs/rubric/labNN.json and the shared labs/rubric/common/language.json). This
   file only knows how to apply them.

   Sections of this file:
     >>memory      arena + error exit (every allocation of one grading lives in one arena)
     >>text        NFKC + lower-case, tokens (English words, numbers, CJK characters, symbols)
     >>rubric      loading the rubric (items, lexicon, language rules, misconceptions)
     >>sheet       parsing the answer sheet with libcmark (boxes, sentences, list items, pred
                   blocks)
     >>results     the measured facts (results/labNN.json), dot paths, values quoted in text
     >>predictions pred blocks vs facts
     >>ledger      the prediction ledger
     >>analysis    concept matches, clauses, polarity (negation, denial frames, conditionals),
                   predicates, back-references, copies, duplicates, lists
     >>relations   matching a relation (a frame of concept slots) in a sentence
     >>scoring     claims, misconceptions, evidence bindings, predictions, item totals
     >>report      score table, grade.json, report struct
     >>api         gr_grade, the ledger lock, hash, header, template, rubric items */
#include "grader.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <regex.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
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
/* Sentences beyond this many per sheet are not analysed (protects against pathological
   sheets; real sheets have a few hundred at most). */
#define GR__MAX_SENTENCES 4000
#define GR__MAX_CANDIDATES 64    /* concept matches considered per relation slot */
#define GR__SEARCH_BUDGET 100000 /* relation-search steps per sentence and relation */
#define GR__MAX_SLOTS 8
#define GR__TABLE_WIDTH 100

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
    uint8_t barrier; /* , ; : ( ) and dashes: a clause boundary */
    uint8_t prefix;  /* pattern tokens only: "creat*" matches any word starting with "creat" */
    uint8_t exact;   /* pattern tokens only: "calls=" matches "calls" only, not its stem */
    uint8_t ident;   /* part of an identifier ("use" in use_local_synchronization, get_x()) */
    int start, len;  /* bytes in the normalised text */
    char *s;         /* the token text */
    char *stem;      /* words: light stem */
} gr__tok;

static int gr__is_cjk(ucs4_t u) {
    return (u >= 0x3400 && u <= 0x4DBF) || (u >= 0x4E00 && u <= 0x9FFF) ||
           (u >= 0xF900 && u <= 0xFAFF) || (u >= 0x20000 && u <= 0x2FA1F) ||
           (u >= 0x3040 && u <= 0x30FF);
}

/* 0: separator, 1: symbol token, 2: barrier token (commas, semicolons, colons, parentheses,
   dashes: clause boundaries). Symbols are kept because a few concepts are symbols ("/" for
   "divided by", "×" for a product, "#" for a call index). */
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
    case ';':
    case ':':
    case '(':
    case ')':
    case 0x2013:
    case 0x2014: return 2;
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

/* Bytes of "'s" at src[i] (apostrophe, then an 's' that ends the word) when it follows "it",
   "that", "there", "what", "here" or "who" in the output so far: the copula, not a possessive.
   0 otherwise. */
static size_t gr__is_copula_s(const char *src, size_t sn, size_t i, const char *o, size_t k) {
    size_t apo = 0;
    if (src[i] == '\'')
        apo = 1;
    else if (i + 3 <= sn && memcmp(src + i, "\xE2\x80\x99", 3) == 0)
        apo = 3;
    if (apo == 0 || i + apo >= sn || src[i + apo] != 's') return 0;
    if (i + apo + 1 < sn && isalnum((unsigned char)src[i + apo + 1])) return 0;
    static const char *const words[] = {"it", "that", "there", "what", "here", "who", NULL};
    for (int w = 0; words[w] != NULL; w++) {
        size_t lw = strlen(words[w]);
        if (k >= lw && memcmp(o + k - lw, words[w], lw) == 0 &&
            (k == lw || !isalnum((unsigned char)o[k - lw - 1])))
            return apo + 1;
    }
    return 0;
}

/* NFKC + lower-case; "n't" becomes " not" and "it's" "it is" so that negation and the
   denial frames see words. */
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
        size_t apo_s = gr__is_copula_s(src, sn, i, o, k);
        if (apo_s > 0) {
            memcpy(o + k, " is", 3); /* "it's a myth" -> "it is a myth" */
            k += 3;
            i += apo_s - 1; /* past the apostrophe and the 's' (the loop adds one) */
            continue;
        }
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
            k->ident = (i > 0 && (t[i - 1] == '_' || t[i - 1] == '.')) ||
                       (j < len && (t[j] == '_' || t[j] == '(' || (t[j] == '.' && j + 1 < len &&
                                                                   isalpha((unsigned char)t[j + 1]))));
            if (pattern_mode && j < len && t[j] == '*') {
                k->prefix = 1;
                j++;
            } else if (pattern_mode && j < len && t[j] == '=') {
                k->exact = 1;
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
            /* "get_rank()": empty parentheses after a name are call notation, not a clause
               boundary */
            k->barrier = sym == 2 && !(uc == '(' && i + 1 < len && t[i + 1] == ')') &&
                         !(uc == ')' && i > 0 && t[i - 1] == '(');
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
// >>rubric types

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
    gr__alt *excl; /* "not_inside": a match inside one of these words is not the concept
                      ("要是" inside "主要是", "若" inside "若干") */
    int nexcl, capexcl;
    int lexical; /* a lexicon concept (not a language rule): its matches absorb negators */
} gr__concept;

/* Polarity a slot needs: the concept stated (asserted), denied (negated), or either. */
enum { GR__POL_ASSERTED, GR__POL_NEGATED, GR__POL_ANY };
/* Whether a slot may sit in a conditional antecedent ("if ...", "unless ..."). */
enum { GR__HYP_NO, GR__HYP_ONLY, GR__HYP_ANY };

typedef struct gr__slot { /* one concept slot of a relation: any of these concepts */
    int *concepts;
    int n;
    int pol;
    int hyp;
    char *spec; /* as written, for explanations */
} gr__slot;

typedef struct gr__rel { /* a relation: every slot matched, with the constraints below */
    gr__slot slot[GR__MAX_SLOTS];
    int nslot;
    int *unless; /* concepts that, anywhere in the sentence, stop the relation */
    int nunless;
    double window; /* weighted tokens from the first to the last slot; 0 = no limit */
    int clause;    /* every slot in one clause */
    int ordered;   /* slots in the given order */
    int backref;   /* may take slots from the previous sentence when this one refers back */
    int agent, verb; /* slot `agent` must be the doer of slot `verb`: before it, in the same
                        sentence, and not the object of a preposition ("from parallel state");
                        -1 = no such rule */
    char *text;    /* "EVERY_RANK + CREATE + SAME_ORDER", for explanations */
} gr__rel;

typedef struct gr__box { /* one answer box (a heading of the sheet) */
    char id[16];
    int part;
    int graded;
    const char *title;
    const char *prompt; /* the question an older template asked in it (the template file holds
                           the current ones) */
    cJSON *match; /* heading prefixes that mean this box (ids of older templates, titles) */
} gr__box;

typedef struct gr__pitem { /* one prediction */
    char key[64];
    char id[64];
    int item;
    int block; /* part of the pred block it belongs to */
    const char *type;
    const char *path;
    double points;
    cJSON *spec; /* the rubric object (values, fields, tolerances, partial) */
    cJSON *variants; /* follow-up variants it belongs to; NULL = every variant */
} gr__pitem;

typedef struct gr__claim { /* one idea of an item, stated in the text */
    char id[64];
    int item;
    double points;
    gr__rel *rel;
    int nrel;
    int *denies; /* misconceptions whose denial states this idea */
    int ndenies;
    int *same; /* claims of other items that are the same idea: one sentence counts once */
    int nsame;
    cJSON *variants; /* NULL = every variant */
    const char *need;
} gr__claim;

enum {
    GR__BIND_GROUPS, GR__BIND_NUMBER, GR__BIND_ENUM, GR__BIND_MEASURED,
    GR__BIND_VERSION, GR__BIND_COMMIT, GR__BIND_COUNT, GR__BIND_TEXT
};

typedef struct gr__bind { /* a measured value quoted in the text, bound to its quantity */
    char id[64];
    int item;
    double points;
    int type;
    gr__slot quantity;  /* what the value is said to be ("DP group", "call index") */
    gr__slot context;   /* must be named in the sentence or the one before ("Experiment B") */
    int has_context;
    cJSON *context_boxes; /* ...or the sentence stands in one of these boxes (FU3 is about D) */
    const char *path;   /* facts it is checked against */
    const char *rank_path; /* groups: when set, a rank named with the list must be this rank */
    cJSON *values;      /* enum: {"measured value": "CONCEPT|CONCEPT", ...} */
    double per_value;   /* measured: points per distinct verified value */
    cJSON *ignore_paths;   /* measured: parts of the subtree that do not count ("config") */
    cJSON *ignore_numbers; /* measured: numbers too common to verify anything (0, 1) */
    cJSON *paths;       /* version, commit, count, text: further facts that verify it too */
    cJSON *variants;    /* NULL = every variant */
    const char *need;
} gr__bind;

typedef struct gr__misc {
    char id[48];
    int item;
    int part;
    const char *title;
    double penalty;
    gr__rel *rel;
    int nrel;
    cJSON *group_claims; /* [{"kind": "TP", "groups": "facts.groups.tp"}]: wrong lists fire it */
    cJSON *not_in_boxes; /* box ids where it cannot fire (older boxes about other layouts) */
    cJSON *refute;
    cJSON *voids; /* claim ids ("M1.layout_rule") that earn nothing once it fired */
    cJSON *when;  /* {"path", "equals" | "in" | "not_in"}: it applies only where the fact holds */
    int *claims_unless; /* concepts that keep a sentence's group lists from firing it */
    int nclaims_unless;
    const char *feedback;
    const char *citation;
} gr__misc;

typedef struct gr__ritem { /* a rubric item: one of the seed's score points */
    char id[16];
    int part;
    const char *title;
    const char *seed;
    const char *need;
    double points;
    cJSON *boxes; /* the box ids that ask for it */
} gr__ritem;

typedef struct gr__rules {
    double relation_window, bind_distance, max_claims_per_sentence, dedup_similarity;
    double copy_overlap, need_copy_words, list_min_concepts, list_coverage, penalty_cap, anaphor_reach;
    double max_sentence_tokens, post_frame_sentence_tokens, list_function_ratio, list_min_words;
    double short_sentence_words, hedge_factor, list_bare_min_words;
} gr__rules;

/* The language rules, as concepts so that one matcher serves everything. */
typedef struct gr__lang {
    int neg, neg_except, deny_pre, deny_post, report, contrast, cond, cond_neg, brk, anaphor,
        pred, weak_pred, function_words, prepositions, auxiliaries, verb_negators, amb_verb,
        hedges, hedge_breaks, task_frames;
} gr__lang;

typedef struct gr__rubric {
    cJSON *root;
    const char *path;
    const char *lab, *question, *title, *version, *source_version;
    double max_main, max_followup;
    gr__rules rules;
    gr__lang L;
    gr__concept *concepts;
    int nconcepts, capconcepts;
    gr__box *box;
    int nbox, capbox;
    gr__ritem *item;
    int nitem, capitem;
    gr__pitem *pred;
    int npred, cappred;
    gr__claim *claim;
    int nclaim, capclaim;
    gr__bind *bind;
    int nbind, capbind;
    gr__misc *misc;
    int nmisc, capmisc;
    cJSON *parts;    /* {"main": [...], "followup": [...]} heading keywords */
    cJSON *variants; /* {"F1": {"title", "question"}} */
    cJSON *header_fields;
    char *template_path;
    const cJSON *agreement; /* this lab's entry of agreement.json, or NULL */
} gr__rubric;

// ---------------------------------------------------------------------------------------------
// >>sheet types

typedef struct gr__match {
    int start, end; /* token range [start, end) */
    int alt;
    int neg;    /* 1: under an odd number of plain negations ("not", "never", "不") */
    int framed; /* 1: inside a denial or report frame ("a common myth is that ...") */
    int hyp;    /* 1: inside a conditional antecedent or a question */
    int clause; /* clause of its first token */
    int prop;   /* proposition: its clause, or for a conditional antecedent ("if no assert
                   fires,") the clause it conditions ("the config is consistent") */
} gr__match;

enum {
    GR__IGN_NONE,
    GR__IGN_COPY,
    GR__IGN_DUP,
    GR__IGN_LIST,
    GR__IGN_FRAGMENT,
    GR__IGN_LONG,
    GR__IGN_UNGRADED
};
static const char *const gr__ignore_reason[] = {
    "",
    "copies the prompt",
    "repeats an earlier sentence",
    "is a list of terms, not a statement",
    "has no verb (a noun phrase or a bullet of keywords states nothing)",
    "is too long to be one sentence",
    "stands in a box that is not graded"};

typedef struct gr__sent {
    char *raw; /* as written (soft line breaks become spaces), trimmed */
    int line;
    int box;     /* index into the rubric's boxes, -1 = a heading the rubric does not know */
    int part;    /* part of the heading it stands under */
    int in_list; /* a list item of the sheet */
    int para;    /* paragraph (or list item) number: back-references stay inside one */
    char *norm;
    gr__tok *tok;
    int ntok;
    int words, cjk; /* English words and numbers, CJK characters */
    double *wpos;   /* wpos[i]: weighted position of token i (CJK 0.5, symbols 0, words 1) */
    int *clause;    /* clause index of each token */
    int *negd;      /* negations covering each token (plain negators) */
    uint8_t *frame; /* 1: the token lies in the scope of a denial or report frame */
    uint8_t *hyp;   /* 1: the token lies in a conditional antecedent */
    int nclause;
    int ignored;    /* 0, or why (GR__IGN_*) */
    int dup_of;     /* line of the earlier sentence it repeats */
    int has_pred;   /* holds a verb */
    int anaphor;    /* refers back to the sentence before (its first words) */
    int denied_by_next; /* the next sentence is "This is wrong." */
    int question;
    gr__match **cm; /* per concept */
    int *ncm;
    uint8_t *void_clause; /* clauses that state a misconception: they earn nothing */
} gr__sent;

typedef struct gr__predblock {
    int part;
    int line;
    char *text;
} gr__predblock;

typedef struct gr__sheet {
    int present;
    int truncated;
    gr__sent *sent;
    int nsent, capsent;
    int dropped;
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
    char id[64];
    char ritem[16];   /* the rubric item it belongs to ("M1"), "" for none */
    const char *kind; /* item | pred | claim | evid | misc */
    const char *tag;  /* ITEM | PRED | TEXT | EVID | MISC */
    int part;
    double score, max;
    int line;
    int fired;
    char *detail; /* short, on the table line */
    gr__sb more;  /* further lines: excerpt, rule, need, measured, citation */
} gr__item;

struct gr__lockstate;

struct gr__ctx {
    gr__chunk *chunks;
    jmp_buf jmp;
    char err[1024];
    const char *answers_path; /* for messages */
    struct gr__lockstate *lock;
    int n_unlocked; /* filled predictions that earn 0 because of the lock */
    double pred_judged, pred_judged_max; /* locked, filled and measured predictions: earned, max */
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
    uint64_t *ngram;       /* open-addressing table of prompt n-gram hashes */
    uint64_t *ngram_boxes; /* per entry: the boxes whose prompt holds it (bit 63: every box) */
    size_t ngram_cap, ngram_n;
};

// ---------------------------------------------------------------------------------------------
// >>rubric

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
    free(c->ngram_boxes);
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

/* A list of strings, or an object {"en": [...], "zh": [...], "re": [...]} ("re" entries are
   POSIX extended regular expressions over the normalised text). */
/* The words a concept's match must not be a piece of: each a phrase (no regular expression),
   longer than every alternative it is meant to cover. */
static void gr__add_exclusions(gr__ctx *c, gr__concept *k, const cJSON *list, const char *where) {
    const cJSON *v;
    if (!cJSON_IsArray(list))
        gr__fail(c, MC_ERR_INVALID_DESC, "rubric: %s.not_inside must be a list of phrases", where);
    cJSON_ArrayForEach(v, list) {
        if (!cJSON_IsString(v) || strncmp(v->valuestring, "re:", 3) == 0)
            gr__fail(c, MC_ERR_INVALID_DESC,
                     "rubric: %s.not_inside must hold phrases (not regular expressions)", where);
        gr__alt *a = GR__PUSH(c, k->excl, k->nexcl, k->capexcl);
        memset(a, 0, sizeof *a);
        a->src = gr__strdup(c, v->valuestring);
        char *norm = gr__normalize(c, v->valuestring, strlen(v->valuestring));
        a->pt = gr__tokenize(c, norm, 1, &a->npt);
        if (a->npt < 2)
            gr__fail(c, MC_ERR_INVALID_DESC,
                     "rubric: %s.not_inside: \"%s\" must be two or more words or characters",
                     where, v->valuestring);
    }
}

static void gr__add_concept_spec(gr__ctx *c, gr__concept *k, const cJSON *g, const char *where) {
    char w[160];
    if (cJSON_IsArray(g)) {
        gr__add_alts(c, k, g, where);
    } else if (cJSON_IsObject(g)) {
        static const char *const langs[] = {"en", "zh", "re"};
        for (int i = 0; i < 3; i++) {
            snprintf(w, sizeof w, "%s.%s", where, langs[i]);
            const cJSON *list = cJSON_GetObjectItemCaseSensitive(g, langs[i]);
            if (list == NULL) continue;
            if (i < 2) {
                gr__add_alts(c, k, list, w);
                continue;
            }
            const cJSON *v;
            cJSON_ArrayForEach(v, list) {
                if (!cJSON_IsString(v))
                    gr__fail(c, MC_ERR_INVALID_DESC, "rubric: %s must hold strings", w);
                gr__sb b = {0};
                gr__sb_printf(c, &b, "re:%s", v->valuestring);
                gr__add_alt(c, k, b.s);
            }
        }
        const cJSON *inside = cJSON_GetObjectItemCaseSensitive(g, "not_inside");
        if (inside != NULL) gr__add_exclusions(c, k, inside, where);
    } else if (g != NULL) {
        gr__fail(c, MC_ERR_INVALID_DESC,
                 "rubric: %s must be a list of phrases or an object {en, zh, re, not_inside}",
                 where);
    }
}

static void gr__load_lexicon(gr__ctx *c, const cJSON *root) {
    const cJSON *lex = cJSON_GetObjectItemCaseSensitive(root, "lexicon");
    if (!cJSON_IsObject(lex))
        gr__fail(c, MC_ERR_INVALID_DESC, "rubric: \"lexicon\" must be an object of concepts");
    const cJSON *g;
    cJSON_ArrayForEach(g, lex) {
        char where[96];
        snprintf(where, sizeof where, "lexicon.%s", g->string);
        gr__concept *k = gr__new_concept(c, g->string);
        k->lexical = 1;
        gr__add_concept_spec(c, k, g, where);
        if (k->nalt == 0)
            gr__fail(c, MC_ERR_INVALID_DESC, "rubric: concept %s has no phrases", k->id);
    }
}

/* The language rules become concepts named "__<rule>". A rule that is missing is an empty
   concept (it never matches). */
static void gr__load_language(gr__ctx *c, const cJSON *root) {
    const cJSON *lang = cJSON_GetObjectItemCaseSensitive(root, "language");
    if (!cJSON_IsObject(lang))
        gr__fail(c, MC_ERR_INVALID_DESC,
                 "rubric: \"language\" must be an object (include labs/rubric/common/"
                 "language.json)");
    static const char *const names[] = {
        "negators",        "negator_exceptions", "denial_before",      "denial_after",
        "report_frames",   "contrast_markers",   "conditional_markers", "negative_conditionals",
        "clause_breaks",   "anaphors",           "predicates",         "weak_predicates",
        "function_words",  "prepositions",       "auxiliaries",        "verb_negators",
        "ambiguous_verbs", "hedges",          "hedge_breaks",       "task_frames"};
    int *slots[] = {&c->R.L.neg,       &c->R.L.neg_except, &c->R.L.deny_pre, &c->R.L.deny_post,
                    &c->R.L.report,    &c->R.L.contrast,   &c->R.L.cond,     &c->R.L.cond_neg,
                    &c->R.L.brk,       &c->R.L.anaphor,    &c->R.L.pred,     &c->R.L.weak_pred,
                    &c->R.L.function_words, &c->R.L.prepositions, &c->R.L.auxiliaries,
                    &c->R.L.verb_negators, &c->R.L.amb_verb, &c->R.L.hedges,
                    &c->R.L.hedge_breaks, &c->R.L.task_frames};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char id[48], where[96];
        snprintf(id, sizeof id, "__%s", names[i]);
        snprintf(where, sizeof where, "language.%s", names[i]);
        gr__concept *k = gr__new_concept(c, id);
        gr__add_concept_spec(c, k, cJSON_GetObjectItemCaseSensitive(lang, names[i]), where);
        *slots[i] = (int)(k - c->R.concepts);
    }
}

static int gr__need_concept(gr__ctx *c, const char *id, const char *where) {
    int k = gr__concept_index(&c->R, id);
    if (k < 0 || !c->R.concepts[k].lexical)
        gr__fail(c, MC_ERR_INVALID_DESC, "rubric: %s names unknown concept \"%s\"", where, id);
    return k;
}

static char *gr__trim_ws(char *s) {
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

/* "!EVERY_RANK|ALL_RANKS": prefixes ! (must be denied), ~ (either polarity), ? (must stand in a
   conditional antecedent), * (antecedent or not); then concepts separated by |. */
static void gr__parse_slot(gr__ctx *c, const char *spec, gr__slot *slot, int def_hyp,
                           const char *where) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", spec);
    char *p = gr__trim_ws(buf);
    memset(slot, 0, sizeof *slot);
    slot->pol = GR__POL_ASSERTED;
    slot->hyp = def_hyp;
    slot->spec = gr__strdup(c, p);
    for (;; p++) {
        if (*p == '!')
            slot->pol = GR__POL_NEGATED;
        else if (*p == '~')
            slot->pol = GR__POL_ANY;
        else if (*p == '?')
            slot->hyp = GR__HYP_ONLY;
        else if (*p == '*')
            slot->hyp = GR__HYP_ANY;
        else
            break;
    }
    int cap = 0;
    for (char *save = NULL, *t = strtok_r(p, "|", &save); t != NULL; t = strtok_r(NULL, "|", &save))
        *GR__PUSH(c, slot->concepts, slot->n, cap) = gr__need_concept(c, gr__trim_ws(t), where);
    if (slot->n == 0)
        gr__fail(c, MC_ERR_INVALID_DESC, "rubric: %s has an empty concept slot \"%s\"", where, spec);
}

typedef struct gr__reldefaults {
    double window;
    int clause, backref, hyp;
} gr__reldefaults;

/* A relation: "A + B + !C" or {"all": ["A", "B"], "window": 20, "clause": true, ...}. */
static void gr__parse_rel(gr__ctx *c, const cJSON *j, gr__rel *r, const gr__reldefaults *d,
                          const char *where) {
    memset(r, 0, sizeof *r);
    r->window = d->window;
    r->clause = d->clause;
    r->backref = d->backref;
    r->agent = r->verb = -1;
    gr__sb text = {0};
    if (cJSON_IsString(j)) {
        char *buf = gr__strdup(c, j->valuestring);
        for (char *save = NULL, *t = strtok_r(buf, "+", &save); t != NULL;
             t = strtok_r(NULL, "+", &save)) {
            if (r->nslot >= GR__MAX_SLOTS)
                gr__fail(c, MC_ERR_INVALID_DESC, "rubric: %s: more than %d slots", where,
                         GR__MAX_SLOTS);
            gr__parse_slot(c, t, &r->slot[r->nslot++], d->hyp, where);
        }
    } else if (cJSON_IsObject(j)) {
        const cJSON *all = cJSON_GetObjectItemCaseSensitive(j, "all");
        if (!cJSON_IsArray(all) || cJSON_GetArraySize(all) == 0)
            gr__fail(c, MC_ERR_INVALID_DESC,
                     "rubric: %s: a relation needs \"all\": [slot, ...] (one or more)", where);
        const cJSON *s;
        cJSON_ArrayForEach(s, all) {
            if (!cJSON_IsString(s) || r->nslot >= GR__MAX_SLOTS)
                gr__fail(c, MC_ERR_INVALID_DESC,
                         "rubric: %s: \"all\" holds at most %d slot strings", where,
                         GR__MAX_SLOTS);
            gr__parse_slot(c, s->valuestring, &r->slot[r->nslot++], d->hyp, where);
        }
        int cap = 0;
        cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(j, "unless")) {
            if (cJSON_IsString(s))
                *GR__PUSH(c, r->unless, r->nunless, cap) =
                    gr__need_concept(c, s->valuestring, where);
        }
        r->window = gr__jnum(j, "window", d->window);
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "clause");
        if (cJSON_IsBool(b)) r->clause = cJSON_IsTrue(b);
        b = cJSON_GetObjectItemCaseSensitive(j, "ordered");
        if (cJSON_IsBool(b)) r->ordered = cJSON_IsTrue(b);
        b = cJSON_GetObjectItemCaseSensitive(j, "backref");
        if (cJSON_IsBool(b)) r->backref = cJSON_IsTrue(b);
        const cJSON *ag = cJSON_GetObjectItemCaseSensitive(j, "agent");
        if (ag != NULL) {
            const cJSON *a0 = cJSON_GetArrayItem(ag, 0), *a1 = cJSON_GetArrayItem(ag, 1);
            if (!cJSON_IsArray(ag) || !cJSON_IsNumber(a0) || !cJSON_IsNumber(a1) ||
                a0->valueint < 0 || a1->valueint < 0 || a0->valueint >= r->nslot ||
                a1->valueint >= r->nslot || a0->valueint == a1->valueint)
                gr__fail(c, MC_ERR_INVALID_DESC,
                         "rubric: %s: \"agent\" is [doer slot, verb slot], two slot indices", where);
            r->agent = a0->valueint;
            r->verb = a1->valueint;
        }
    } else {
        gr__fail(c, MC_ERR_INVALID_DESC,
                 "rubric: %s: a relation is \"A + B\" or {\"all\": [\"A\", \"B\"], ...}", where);
    }
    if (r->nslot == 0) gr__fail(c, MC_ERR_INVALID_DESC, "rubric: %s: an empty relation", where);
    for (int i = 0; i < r->nslot; i++)
        gr__sb_printf(c, &text, "%s%s", i ? " + " : "", r->slot[i].spec);
    r->text = text.s;
}

static void gr__parse_rels(gr__ctx *c, const cJSON *list, gr__rel **out, int *n,
                           const gr__reldefaults *d, const char *where) {
    int cap = 0;
    *out = NULL;
    *n = 0;
    if (list == NULL) return;
    if (!cJSON_IsArray(list))
        gr__fail(c, MC_ERR_INVALID_DESC, "rubric: %s.relations must be a list", where);
    const cJSON *j;
    cJSON_ArrayForEach(j, list) gr__parse_rel(c, j, GR__PUSH(c, *out, *n, cap), d, where);
}

static void gr__copy_id(gr__ctx *c, char *dst, size_t cap, const cJSON *o, const char *what) {
    const char *id = gr__jstr(o, "id", NULL);
    if (id == NULL || id[0] == '\0' || strlen(id) >= cap)
        gr__fail(c, MC_ERR_INVALID_DESC,
                 "rubric: every %s needs an \"id\" shorter than %zu characters", what, cap);
    snprintf(dst, cap, "%s", id);
}

static int gr__item_index(const gr__rubric *R, const char *id) {
    for (int i = 0; id != NULL && i < R->nitem; i++)
        if (strcmp(R->item[i].id, id) == 0) return i;
    return -1;
}

static int gr__misc_index(const gr__rubric *R, const char *id) {
    for (int i = 0; id != NULL && i < R->nmisc; i++)
        if (strcmp(R->misc[i].id, id) == 0) return i;
    return -1;
}

static void gr__load_boxes(gr__ctx *c, const cJSON *root) {
    const cJSON *b;
    cJSON_ArrayForEach(b, cJSON_GetObjectItemCaseSensitive(root, "boxes")) {
        gr__box *x = GR__PUSH(c, c->R.box, c->R.nbox, c->R.capbox);
        memset(x, 0, sizeof *x);
        gr__copy_id(c, x->id, sizeof x->id, b, "box");
        x->part = gr__part_from_name(gr__jstr(b, "part", NULL));
        if (x->part == GR__PART_OTHER)
            gr__fail(c, MC_ERR_INVALID_DESC, "rubric: box %s: \"part\" must be main or followup",
                     x->id);
        x->title = gr__jstr(b, "title", "");
        x->prompt = gr__jstr(b, "prompt", NULL);
        x->graded = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(b, "graded"));
        x->match = cJSON_GetObjectItemCaseSensitive(b, "match");
    }
}

static void gr__load_predictions(gr__ctx *c, const cJSON *list, int item) {
    const cJSON *x;
    cJSON_ArrayForEach(x, list) {
        gr__pitem *p = GR__PUSH(c, c->R.pred, c->R.npred, c->R.cappred);
        memset(p, 0, sizeof *p);
        const char *key = gr__jstr(x, "key", NULL);
        if (key == NULL || strlen(key) >= sizeof p->key)
            gr__fail(c, MC_ERR_INVALID_DESC, "rubric: item %s: a prediction needs a \"key\"",
                     c->R.item[item].id);
        snprintf(p->key, sizeof p->key, "%s", key);
        snprintf(p->id, sizeof p->id, "%s.%s", c->R.item[item].id, key);
        p->item = item;
        const char *block = gr__jstr(x, "block", NULL);
        p->block = block != NULL ? gr__part_from_name(block) : c->R.item[item].part;
        if (p->block == GR__PART_OTHER) p->block = GR__PART_MAIN;
        p->type = gr__jstr(x, "type", "exact");
        p->path = gr__jstr(x, "path", "");
        p->points = gr__jnum(x, "points", -1);
        if (!(p->points >= 0))
            gr__fail(c, MC_ERR_INVALID_DESC, "rubric: prediction %s needs \"points\" >= 0", p->id);
        p->spec = (cJSON *)x;
        p->variants = cJSON_GetObjectItemCaseSensitive(x, "variants");
    }
}

static void gr__load_claims(gr__ctx *c, const cJSON *list, int item) {
    const cJSON *x;
    gr__reldefaults d = {c->R.rules.relation_window, 0, 1, GR__HYP_NO};
    cJSON_ArrayForEach(x, list) {
        gr__claim *k = GR__PUSH(c, c->R.claim, c->R.nclaim, c->R.capclaim);
        memset(k, 0, sizeof *k);
        char id[48];
        gr__copy_id(c, id, sizeof id, x, "claim");
        snprintf(k->id, sizeof k->id, "%s.%s", c->R.item[item].id, id);
        k->item = item;
        k->points = gr__jnum(x, "points", -1);
        if (!(k->points >= 0))
            gr__fail(c, MC_ERR_INVALID_DESC, "rubric: claim %s needs \"points\" >= 0", k->id);
        gr__parse_rels(c, cJSON_GetObjectItemCaseSensitive(x, "relations"), &k->rel, &k->nrel, &d,
                       k->id);
        k->need = gr__jstr(x, "need", "");
        k->variants = cJSON_GetObjectItemCaseSensitive(x, "variants");
        /* "denies": misconceptions are loaded later; their ids are resolved then */
    }
}

static void gr__load_bindings(gr__ctx *c, const cJSON *list, int item) {
    const cJSON *x;
    cJSON_ArrayForEach(x, list) {
        gr__bind *b = GR__PUSH(c, c->R.bind, c->R.nbind, c->R.capbind);
        memset(b, 0, sizeof *b);
        char id[48];
        gr__copy_id(c, id, sizeof id, x, "evidence binding");
        snprintf(b->id, sizeof b->id, "%s.%s", c->R.item[item].id, id);
        b->item = item;
        b->points = gr__jnum(x, "points", -1);
        if (!(b->points >= 0))
            gr__fail(c, MC_ERR_INVALID_DESC, "rubric: evidence %s needs \"points\" >= 0", b->id);
        const char *type = gr__jstr(x, "type", "number");
        b->type = !strcmp(type, "groups")     ? GR__BIND_GROUPS
                  : !strcmp(type, "enum")     ? GR__BIND_ENUM
                  : !strcmp(type, "number")   ? GR__BIND_NUMBER
                  : !strcmp(type, "measured") ? GR__BIND_MEASURED
                  : !strcmp(type, "version")  ? GR__BIND_VERSION
                  : !strcmp(type, "commit")   ? GR__BIND_COMMIT
                  : !strcmp(type, "count")    ? GR__BIND_COUNT
                  : !strcmp(type, "text")     ? GR__BIND_TEXT
                                              : -1;
        if (b->type < 0)
            gr__fail(c, MC_ERR_INVALID_DESC,
                     "rubric: evidence %s: \"type\" must be groups, number, enum, measured, "
                     "version, commit, count or text (got %s)", b->id, type);
        const char *q = gr__jstr(x, "quantity", NULL);
        if (q == NULL && b->type != GR__BIND_ENUM && b->type != GR__BIND_MEASURED)
            gr__fail(c, MC_ERR_INVALID_DESC, "rubric: evidence %s needs a \"quantity\" slot",
                     b->id);
        if (q != NULL) {
            gr__parse_slot(c, q, &b->quantity, GR__HYP_NO, b->id);
        } else if (b->type == GR__BIND_MEASURED) {
            /* no quantity named: any term of the lexicon beside the value says what it is */
            memset(&b->quantity, 0, sizeof b->quantity);
            b->quantity.pol = GR__POL_ANY;
            b->quantity.hyp = GR__HYP_NO;
            b->quantity.spec = "a term of the lexicon";
            int qcap = 0;
            for (int k = 0; k < c->R.nconcepts; k++)
                if (c->R.concepts[k].lexical)
                    *GR__PUSH(c, b->quantity.concepts, b->quantity.n, qcap) = k;
        }
        b->per_value = gr__jnum(x, "per_value", b->points);
        b->ignore_paths = cJSON_GetObjectItemCaseSensitive(x, "ignore_paths");
        b->ignore_numbers = cJSON_GetObjectItemCaseSensitive(x, "ignore_numbers");
        const char *ctxs = gr__jstr(x, "context", NULL);
        if (ctxs != NULL) {
            gr__parse_slot(c, ctxs, &b->context, GR__HYP_ANY, b->id);
            b->context.pol = GR__POL_ANY;
            b->has_context = 1;
        }
        b->context_boxes = cJSON_GetObjectItemCaseSensitive(x, "context_boxes");
        b->path = gr__jstr(x, "path", NULL);
        if (b->path == NULL)
            gr__fail(c, MC_ERR_INVALID_DESC, "rubric: evidence %s needs a \"path\"", b->id);
        b->rank_path = gr__jstr(x, "rank_path", NULL);
        b->paths = cJSON_GetObjectItemCaseSensitive(x, "paths");
        const cJSON *pp;
        cJSON_ArrayForEach(pp, b->paths) {
            if (!cJSON_IsString(pp))
                gr__fail(c, MC_ERR_INVALID_DESC, "rubric: evidence %s: \"paths\" holds paths",
                         b->id);
        }
        b->values = cJSON_GetObjectItemCaseSensitive(x, "values");
        if (b->type == GR__BIND_ENUM) {
            if (!cJSON_IsObject(b->values))
                gr__fail(c, MC_ERR_INVALID_DESC,
                         "rubric: evidence %s: an enum needs \"values\": {value: \"CONCEPT|...\"}",
                         b->id);
            const cJSON *v;
            cJSON_ArrayForEach(v, b->values) {
                gr__slot tmp;
                if (!cJSON_IsString(v))
                    gr__fail(c, MC_ERR_INVALID_DESC, "rubric: evidence %s: values hold slot strings",
                             b->id);
                gr__parse_slot(c, v->valuestring, &tmp, GR__HYP_NO, b->id); /* checks names */
            }
        }
        b->need = gr__jstr(x, "need", "");
        b->variants = cJSON_GetObjectItemCaseSensitive(x, "variants");
    }
}

static void gr__load_items(gr__ctx *c, const cJSON *root) {
    const cJSON *x;
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(root, "items");
    if (!cJSON_IsArray(items) || cJSON_GetArraySize(items) == 0)
        gr__fail(c, MC_ERR_INVALID_DESC, "rubric: \"items\" must be a non-empty list");
    cJSON_ArrayForEach(x, items) {
        gr__ritem *it = GR__PUSH(c, c->R.item, c->R.nitem, c->R.capitem);
        memset(it, 0, sizeof *it);
        gr__copy_id(c, it->id, sizeof it->id, x, "item");
        if (strchr(it->id, '.') != NULL)
            gr__fail(c, MC_ERR_INVALID_DESC, "rubric: item id %s may not contain a dot", it->id);
        for (int i = 0; i + 1 < c->R.nitem; i++)
            if (strcmp(c->R.item[i].id, it->id) == 0)
                gr__fail(c, MC_ERR_INVALID_DESC, "rubric: item %s is defined twice", it->id);
        it->part = gr__part_from_name(gr__jstr(x, "part", NULL));
        if (it->part == GR__PART_OTHER)
            gr__fail(c, MC_ERR_INVALID_DESC, "rubric: item %s: \"part\" must be main or followup",
                     it->id);
        it->title = gr__jstr(x, "title", "");
        it->seed = gr__jstr(x, "seed", "");
        it->need = gr__jstr(x, "need", "");
        it->points = gr__jnum(x, "points", -1);
        if (!(it->points > 0))
            gr__fail(c, MC_ERR_INVALID_DESC, "rubric: item %s needs \"points\" > 0", it->id);
        it->boxes = cJSON_GetObjectItemCaseSensitive(x, "boxes");
        int idx = c->R.nitem - 1;
        gr__load_predictions(c, cJSON_GetObjectItemCaseSensitive(x, "predictions"), idx);
        gr__load_claims(c, cJSON_GetObjectItemCaseSensitive(x, "claims"), idx);
        gr__load_bindings(c, cJSON_GetObjectItemCaseSensitive(x, "evidence"), idx);
    }
    double sum[2] = {0, 0};
    for (int i = 0; i < c->R.nitem; i++)
        sum[c->R.item[i].part] += c->R.item[i].points;
    if (fabs(sum[0] - c->R.max_main) > 1e-9 || fabs(sum[1] - c->R.max_followup) > 1e-9)
        gr__fail(c, MC_ERR_INVALID_DESC,
                 "rubric: the items' points add up to %g (main) + %g (follow-up), but \"max\" says "
                 "%g + %g",
                 sum[0], sum[1], c->R.max_main, c->R.max_followup);
}

static void gr__load_misconceptions(gr__ctx *c, const cJSON *root) {
    const cJSON *p;
    gr__reldefaults d = {c->R.rules.relation_window, 1, 0, GR__HYP_NO};
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(root, "misconceptions")) {
        gr__misc *m = GR__PUSH(c, c->R.misc, c->R.nmisc, c->R.capmisc);
        memset(m, 0, sizeof *m);
        gr__copy_id(c, m->id, sizeof m->id, p, "misconception");
        m->title = gr__jstr(p, "title", "");
        m->penalty = gr__jnum(p, "penalty", -1);
        if (!(m->penalty >= 0))
            gr__fail(c, MC_ERR_INVALID_DESC, "rubric: misconception %s needs \"penalty\" >= 0",
                     m->id);
        m->item = gr__item_index(&c->R, gr__jstr(p, "item", NULL));
        if (m->item < 0)
            gr__fail(c, MC_ERR_INVALID_DESC,
                     "rubric: misconception %s: \"item\" must name the item it costs", m->id);
        m->part = c->R.item[m->item].part;
        gr__parse_rels(c, cJSON_GetObjectItemCaseSensitive(p, "relations"), &m->rel, &m->nrel, &d,
                       m->id);
        m->group_claims = cJSON_GetObjectItemCaseSensitive(p, "group_claims");
        const cJSON *g;
        cJSON_ArrayForEach(g, m->group_claims) {
            gr__slot tmp;
            gr__parse_slot(c, gr__jstr(g, "kind", "?"), &tmp, GR__HYP_NO, m->id);
            if (gr__jstr(g, "groups", NULL) == NULL)
                gr__fail(c, MC_ERR_INVALID_DESC,
                         "rubric: misconception %s: a group claim needs \"groups\" (a path)", m->id);
        }
        if (m->nrel == 0 && cJSON_GetArraySize(m->group_claims) == 0)
            gr__fail(c, MC_ERR_INVALID_DESC,
                     "rubric: misconception %s needs relations or group_claims", m->id);
        m->not_in_boxes = cJSON_GetObjectItemCaseSensitive(p, "not_in_boxes");
        m->refute = cJSON_GetObjectItemCaseSensitive(p, "refute");
        m->voids = cJSON_GetObjectItemCaseSensitive(p, "voids");
        m->when = cJSON_GetObjectItemCaseSensitive(p, "when");
        if (m->when != NULL &&
            (gr__jstr(m->when, "path", NULL) == NULL ||
             (cJSON_GetObjectItemCaseSensitive(m->when, "equals") == NULL &&
              !cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(m->when, "in")) &&
              !cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(m->when, "not_in")))))
            gr__fail(c, MC_ERR_INVALID_DESC,
                     "rubric: misconception %s: \"when\" needs a \"path\" and one of "
                     "\"equals\", \"in\" or \"not_in\" (a list)", m->id);
        int ucap = 0;
        const cJSON *cu;
        cJSON_ArrayForEach(cu, cJSON_GetObjectItemCaseSensitive(p, "claims_unless")) {
            if (cJSON_IsString(cu))
                *GR__PUSH(c, m->claims_unless, m->nclaims_unless, ucap) =
                    gr__need_concept(c, cu->valuestring, m->id);
        }
        m->feedback = gr__jstr(p, "feedback", "");
        m->citation = gr__jstr(p, "citation", "");
    }
    /* now the claims' "denies" can be resolved */
    const cJSON *it;
    int ci = 0;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(root, "items")) {
        const cJSON *cl;
        cJSON_ArrayForEach(cl, cJSON_GetObjectItemCaseSensitive(it, "claims")) {
            gr__claim *k = &c->R.claim[ci++];
            int cap = 0;
            const cJSON *dn;
            cJSON_ArrayForEach(dn, cJSON_GetObjectItemCaseSensitive(cl, "denies")) {
                int mi = cJSON_IsString(dn) ? gr__misc_index(&c->R, dn->valuestring) : -1;
                if (mi < 0)
                    gr__fail(c, MC_ERR_INVALID_DESC,
                             "rubric: claim %s denies unknown misconception %s", k->id,
                             cJSON_IsString(dn) ? dn->valuestring : "?");
                *GR__PUSH(c, k->denies, k->ndenies, cap) = mi;
            }
            if (k->nrel == 0 && k->ndenies == 0)
                gr__fail(c, MC_ERR_INVALID_DESC, "rubric: claim %s needs relations or denies",
                         k->id);
            const cJSON *si;
            int scap = 0;
            cJSON_ArrayForEach(si, cJSON_GetObjectItemCaseSensitive(cl, "same_idea_as")) {
                int found = -1;
                for (int j = 0; cJSON_IsString(si) && j < c->R.nclaim && found < 0; j++)
                    if (strcmp(c->R.claim[j].id, si->valuestring) == 0) found = j;
                if (found < 0 || found == ci - 1)
                    gr__fail(c, MC_ERR_INVALID_DESC, "rubric: claim %s: same_idea_as names no other "
                             "claim (%s)", k->id, cJSON_IsString(si) ? si->valuestring : "?");
                *GR__PUSH(c, k->same, k->nsame, scap) = found;
            }
        }
    }
    /* the link goes both ways */
    for (int a = 0; a < c->R.nclaim; a++)
        for (int i = 0; i < c->R.claim[a].nsame; i++) {
            gr__claim *b = &c->R.claim[c->R.claim[a].same[i]];
            int back = 0, cap = b->nsame;
            for (int j = 0; j < b->nsame && !back; j++)
                back = b->same[j] == a;
            if (!back) *GR__PUSH(c, b->same, b->nsame, cap) = a;
        }
    for (int mi = 0; mi < c->R.nmisc; mi++) {
        const cJSON *v;
        cJSON_ArrayForEach(v, c->R.misc[mi].voids) {
            int found = 0;
            for (int k = 0; cJSON_IsString(v) && k < c->R.nclaim && !found; k++)
                found = strcmp(c->R.claim[k].id, v->valuestring) == 0;
            if (!found)
                gr__fail(c, MC_ERR_INVALID_DESC, "rubric: misconception %s voids unknown claim %s",
                         c->R.misc[mi].id, cJSON_IsString(v) ? v->valuestring : "?");
        }
    }
}

static void gr__load_rules(gr__ctx *c, const cJSON *root) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(root, "rules");
    gr__rules *x = &c->R.rules;
    x->relation_window = gr__jnum(r, "relation_window", 30);
    x->bind_distance = gr__jnum(r, "bind_distance", 10);
    x->max_claims_per_sentence = gr__jnum(r, "max_claims_per_sentence", 2);
    x->dedup_similarity = gr__jnum(r, "dedup_similarity", 0.8);
    x->copy_overlap = gr__jnum(r, "copy_overlap", 0.6);
    x->need_copy_words = gr__jnum(r, "need_copy_words", 8);
    x->list_min_concepts = gr__jnum(r, "list_min_concepts", 6);
    x->list_coverage = gr__jnum(r, "list_coverage", 0.6);
    x->list_function_ratio = gr__jnum(r, "list_function_ratio", 0.12);
    x->list_min_words = gr__jnum(r, "list_min_words", 10);
    x->list_bare_min_words = gr__jnum(r, "list_bare_min_words", 6);
    x->short_sentence_words = gr__jnum(r, "short_sentence_words", 8);
    x->hedge_factor = gr__jnum(r, "hedge_factor", 0.5);
    x->penalty_cap = gr__jnum(r, "penalty_cap", 4.0);
    x->anaphor_reach = gr__jnum(r, "anaphor_reach", 4);
    x->max_sentence_tokens = gr__jnum(r, "max_sentence_tokens", 200);
    x->post_frame_sentence_tokens = gr__jnum(r, "post_frame_sentence_tokens", 6);
}

static char *gr__dirname(gr__ctx *c, const char *path) {
    const char *slash = path != NULL ? strrchr(path, '/') : NULL;
    return slash != NULL ? gr__strndup(c, path, (size_t)(slash - path)) : gr__strdup(c, ".");
}

static cJSON *gr__load_json_file(gr__ctx *c, const char *path, const char *what) {
    size_t n = 0;
    char *text = gr__read_file(path, GR__MAX_JSON_BYTES, &n, NULL);
    if (text == NULL)
        gr__fail(c, MC_ERR_IO, "%s %s cannot be read (run from the repository root)", what,
                 path != NULL ? path : "(null)");
    cJSON *root = gr__keep_json(c, cJSON_Parse(text));
    if (root == NULL) {
        const char *at = cJSON_GetErrorPtr(); /* points into text: copy before freeing it */
        char near[32];
        snprintf(near, sizeof near, "%.30s", at != NULL ? at : "?");
        free(text);
        gr__fail(c, MC_ERR_INVALID_DESC, "%s %s is not valid JSON (near \"%s\")", what, path,
                 near);
    }
    free(text);
    return root;
}

/* A language rule of the rubric's own ("report_frames": {"en": [...], "zh": [...]}) extends
   the shared one of that name: the shared phrases it lacks are appended, so a lab that adds
   its own frames still gets every phrase added to the shared file later. */
static void gr__extend_language_rule(cJSON *own, const cJSON *shared) {
    const cJSON *lang;
    cJSON_ArrayForEach(lang, shared) {
        if (!cJSON_IsArray(lang)) continue;
        cJSON *mine = cJSON_GetObjectItemCaseSensitive(own, lang->string);
        if (mine == NULL) {
            cJSON_AddItemToObject(own, lang->string, cJSON_Duplicate(lang, 1));
            continue;
        }
        if (!cJSON_IsArray(mine)) continue;
        const cJSON *phrase;
        cJSON_ArrayForEach(phrase, lang) {
            if (!cJSON_IsString(phrase)) continue;
            int have = 0;
            const cJSON *m;
            cJSON_ArrayForEach(m, mine) {
                have |= cJSON_IsString(m) && strcmp(m->valuestring, phrase->valuestring) == 0;
            }
            if (!have) cJSON_AddItemToArray(mine, cJSON_CreateString(phrase->valuestring));
        }
    }
}

/* "include": ["common/language.json"] (paths relative to the rubric's directory, else to
   labs/rubric/ under the working directory): the included file's "language", "lexicon" and
   "rules" entries are added where the rubric has none; a language rule the rubric has is
   extended with the shared phrases (gr__extend_language_rule). */
static void gr__apply_includes(gr__ctx *c, cJSON *root, const char *path) {
    const cJSON *inc;
    char *dir = gr__dirname(c, path);
    cJSON_ArrayForEach(inc, cJSON_GetObjectItemCaseSensitive(root, "include")) {
        if (!cJSON_IsString(inc))
            gr__fail(c, MC_ERR_INVALID_DESC, "rubric %s: \"include\" holds paths", path);
        gr__sb p = {0};
        if (inc->valuestring[0] == '/') {
            gr__sb_add(c, &p, inc->valuestring);
        } else {
            gr__sb_printf(c, &p, "%s/%s", dir, inc->valuestring);
            if (access(p.s, R_OK) != 0) { /* a rubric outside labs/rubric/ (a test's copy) */
                gr__sb q = {0};
                gr__sb_printf(c, &q, "labs/rubric/%s", inc->valuestring);
                if (access(q.s, R_OK) == 0) p = q;
            }
        }
        cJSON *doc = gr__load_json_file(c, p.s, "rubric include");
        static const char *const keys[] = {"language", "lexicon", "rules"};
        for (int k = 0; k < 3; k++) {
            const cJSON *src = cJSON_GetObjectItemCaseSensitive(doc, keys[k]);
            if (!cJSON_IsObject(src)) continue;
            cJSON *dst = cJSON_GetObjectItemCaseSensitive(root, keys[k]);
            if (dst == NULL) dst = cJSON_AddObjectToObject(root, keys[k]);
            const cJSON *e;
            cJSON_ArrayForEach(e, src) {
                cJSON *own = cJSON_GetObjectItemCaseSensitive(dst, e->string);
                if (own == NULL)
                    cJSON_AddItemToObject(dst, e->string, cJSON_Duplicate(e, 1));
                else if (k == 0 && cJSON_IsObject(own) && cJSON_IsObject(e))
                    gr__extend_language_rule(own, e);
            }
        }
    }
}

/* Rubrics of schema 1 (top-level "concepts", "sections", "seed_items", "predictions",
   "points", "evidence") are read through a translation into schema 2, so that they are graded
   by the same rules: concepts -> lexicon, sections -> boxes, seed_items -> items holding their
   predictions, their points as claims (patterns -> relations; "negation": false -> every slot
   of either polarity) and their evidence as "measured" bindings; misconceptions keep their
   patterns as relations, "pairs_with" -> "voids", "sections" -> "not_in_boxes". The shared
   language rules are included; of the old rules only penalty_cap and max_sentence_tokens
   carry over, and max_claims_per_sentence, which schema 1 did not have, may be set. */
static int gr__s1_item_of(const cJSON *items, const char *id) {
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, items) {
        const char *x = gr__jstr(it, "id", "");
        size_t n = strlen(x);
        if (id != NULL && strncmp(id, x, n) == 0 && (id[n] == '\0' || id[n] == '.')) return i;
        i++;
    }
    return -1;
}

/* Schema 1 knew no conditionals: a pattern may stand in an "if ..." part ("If no assert
   fires, the config is consistent" states its implication). */
static cJSON *gr__s1_relations(const cJSON *patterns, int either) {
    cJSON *rels = cJSON_CreateArray();
    const cJSON *p;
    cJSON_ArrayForEach(p, patterns) {
        cJSON *r = cJSON_Duplicate(p, 1);
        cJSON *all = cJSON_GetObjectItemCaseSensitive(r, "all");
        cJSON *na = cJSON_CreateArray();
        const cJSON *sl;
        cJSON_ArrayForEach(sl, all) {
            if (!cJSON_IsString(sl)) continue;
            char buf[512];
            snprintf(buf, sizeof buf, "*%s%s", either ? "~" : "", sl->valuestring);
            cJSON_AddItemToArray(na, cJSON_CreateString(buf));
        }
        if (all == NULL || !cJSON_ReplaceItemInObjectCaseSensitive(r, "all", na))
            cJSON_Delete(na); /* not a pattern: the loader says so */
        cJSON_AddItemToArray(rels, r);
    }
    return rels;
}

static int gr__json_has_string(const cJSON *list, const char *s);

/* Schema-1 rubrics whose "seed_items" is only a text per section: the items are the sections,
   each worth what its predictions, points and evidence add up to. */
static cJSON *gr__s1_items_from_sections(const cJSON *root) {
    cJSON *items = cJSON_CreateArray();
    const cJSON *sec, *x, *p;
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(root, "seed_items");
    cJSON_ArrayForEach(sec, cJSON_GetObjectItemCaseSensitive(root, "sections")) {
        const char *id = gr__jstr(sec, "id", "");
        double pts = 0;
        size_t idn = strlen(id);
        cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(root, "predictions")) {
            const char *pid = gr__jstr(x, "id", "");
            if (strncmp(pid, id, idn) == 0 && (pid[idn] == '\0' || pid[idn] == '.'))
                cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(x, "items"))
                    pts += gr__jnum(p, "points", 0);
        }
        static const char *const lists[] = {"points", "evidence"};
        for (int l = 0; l < 2; l++)
            cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(root, lists[l])) {
                const char *xid = gr__jstr(x, "id", ""), *xs = gr__jstr(x, "section", NULL);
                size_t n = strlen(id);
                if ((xs != NULL && strcmp(xs, id) == 0) ||
                    (xs == NULL && strncmp(xid, id, n) == 0 && xid[n] == '.'))
                    pts += gr__jnum(x, "points", 0);
            }
        if (pts <= 0) continue;
        cJSON *it = cJSON_CreateObject();
        cJSON_AddStringToObject(it, "id", id);
        cJSON_AddStringToObject(it, "part", gr__jstr(sec, "part", "main"));
        cJSON_AddNumberToObject(it, "points", pts);
        cJSON_AddStringToObject(it, "title", gr__jstr(sec, "title", ""));
        cJSON_AddStringToObject(it, "seed", gr__jstr(seed, id, ""));
        cJSON_AddItemToArray(items, it);
    }
    return items;
}

static void gr__from_schema1(gr__ctx *c, cJSON *root, const char *path) {
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(root, "seed_items");
    cJSON *derived = NULL;
    if (!cJSON_IsArray(seed)) seed = derived = gr__keep_json(c, gr__s1_items_from_sections(root));
    if (cJSON_GetArraySize(seed) == 0)
        gr__fail(c, MC_ERR_INVALID_DESC,
                 "rubric %s: no \"schema\": 2, and no schema-1 \"seed_items\" or \"sections\" "
                 "either (see labs/rubric/SCHEMA.md)", path);
    if (cJSON_GetObjectItemCaseSensitive(root, "include") == NULL) {
        cJSON *inc = cJSON_AddArrayToObject(root, "include");
        cJSON_AddItemToArray(inc, cJSON_CreateString("common/language.json"));
    }
    const cJSON *concepts = cJSON_GetObjectItemCaseSensitive(root, "concepts");
    if (concepts != NULL && cJSON_GetObjectItemCaseSensitive(root, "lexicon") == NULL)
        cJSON_AddItemToObject(root, "lexicon", cJSON_Duplicate(concepts, 1));
    /* boxes */
    cJSON *boxes = cJSON_CreateArray();
    const cJSON *x;
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(root, "sections")) {
        cJSON *b = cJSON_CreateObject();
        static const char *const keep[] = {"id", "part", "title", "prompt", "graded", "match"};
        for (size_t k = 0; k < sizeof keep / sizeof keep[0]; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(x, keep[k]);
            if (v != NULL) cJSON_AddItemToObject(b, keep[k], cJSON_Duplicate(v, 1));
        }
        cJSON_AddItemToArray(boxes, b);
    }
    /* items */
    cJSON *items = cJSON_CreateArray();
    cJSON_ArrayForEach(x, seed) {
        cJSON *it = cJSON_CreateObject();
        static const char *const keep[] = {"id", "part", "points", "title", "seed"};
        for (size_t k = 0; k < sizeof keep / sizeof keep[0]; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(x, keep[k]);
            if (v != NULL) cJSON_AddItemToObject(it, keep[k], cJSON_Duplicate(v, 1));
        }
        cJSON *ib = cJSON_AddArrayToObject(it, "boxes");
        cJSON_AddItemToArray(ib, cJSON_CreateString(gr__jstr(x, "id", "")));
        cJSON_AddArrayToObject(it, "predictions");
        cJSON_AddArrayToObject(it, "claims");
        cJSON_AddArrayToObject(it, "evidence");
        cJSON_AddItemToArray(items, it);
    }
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(root, "predictions")) {
        int i = gr__s1_item_of(items, gr__jstr(x, "id", NULL));
        if (i < 0) continue;
        cJSON *dst = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(items, i), "predictions");
        const cJSON *p;
        cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(x, "items")) {
            cJSON *q = cJSON_Duplicate(p, 1);
            const char *part = gr__jstr(x, "part", NULL);
            if (part != NULL && cJSON_GetObjectItemCaseSensitive(q, "block") == NULL)
                cJSON_AddStringToObject(q, "block", part);
            cJSON_AddItemToArray(dst, q);
        }
    }
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(root, "points")) {
        const char *id = gr__jstr(x, "id", "");
        int i = gr__s1_item_of(items, id);
        if (i < 0) i = gr__s1_item_of(items, gr__jstr(x, "section", NULL));
        if (i < 0) continue;
        cJSON *item = cJSON_GetArrayItem(items, i);
        const char *dot = strchr(id, '.');
        char cid[48];
        snprintf(cid, sizeof cid, "%s", dot != NULL ? dot + 1 : id);
        for (char *q = cid; *q; q++)
            if (*q == '.') *q = '_';
        cJSON *cl = cJSON_CreateObject();
        cJSON_AddStringToObject(cl, "id", cid);
        cJSON_AddNumberToObject(cl, "points", gr__jnum(x, "points", 0));
        int either = cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(x, "negation"));
        cJSON_AddItemToObject(cl, "relations",
                              gr__s1_relations(cJSON_GetObjectItemCaseSensitive(x, "patterns"),
                                               either));
        cJSON_AddStringToObject(cl, "need", gr__jstr(x, "need", ""));
        const cJSON *var = cJSON_GetObjectItemCaseSensitive(x, "variants");
        if (var != NULL) cJSON_AddItemToObject(cl, "variants", cJSON_Duplicate(var, 1));
        cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(item, "claims"), cl);
    }
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(root, "evidence")) {
        const char *id = gr__jstr(x, "id", "");
        int i = gr__s1_item_of(items, id);
        if (i < 0) i = gr__s1_item_of(items, gr__jstr(x, "section", NULL));
        if (i < 0) continue;
        const char *dot = strchr(id, '.');
        cJSON *ev = cJSON_CreateObject();
        cJSON_AddStringToObject(ev, "id", dot != NULL ? dot + 1 : id);
        cJSON_AddStringToObject(ev, "type", "measured");
        cJSON_AddStringToObject(ev, "path", gr__jstr(x, "facts", "facts"));
        cJSON_AddNumberToObject(ev, "points", gr__jnum(x, "points", 0));
        cJSON_AddNumberToObject(ev, "per_value", gr__jnum(x, "per_value", gr__jnum(x, "points", 0)));
        static const char *const keep[] = {"ignore_paths", "ignore_numbers", "need", "quantity"};
        for (size_t k = 0; k < sizeof keep / sizeof keep[0]; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(x, keep[k]);
            if (v != NULL) cJSON_AddItemToObject(ev, keep[k], cJSON_Duplicate(v, 1));
        }
        cJSON_AddItemToArray(
            cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(items, i), "evidence"), ev);
    }
    /* misconceptions */
    cJSON *miscs = cJSON_CreateArray();
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(root, "misconceptions")) {
        cJSON *m = cJSON_CreateObject();
        static const char *const keep[] = {"id", "title", "penalty", "refute", "feedback",
                                           "citation", "claims_unless", "group_claims"};
        for (size_t k = 0; k < sizeof keep / sizeof keep[0]; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(x, keep[k]);
            if (v != NULL) cJSON_AddItemToObject(m, keep[k], cJSON_Duplicate(v, 1));
        }
        cJSON_AddItemToObject(m, "relations",
                              gr__s1_relations(cJSON_GetObjectItemCaseSensitive(x, "patterns"), 0));
        const cJSON *pairs = cJSON_GetObjectItemCaseSensitive(x, "pairs_with");
        const cJSON *secs = cJSON_GetObjectItemCaseSensitive(x, "sections");
        int item = -1;
        const cJSON *v;
        cJSON_ArrayForEach(v, pairs) if (item < 0 && cJSON_IsString(v)) item =
            gr__s1_item_of(items, v->valuestring);
        cJSON_ArrayForEach(v, secs) if (item < 0 && cJSON_IsString(v)) item =
            gr__s1_item_of(items, v->valuestring);
        if (item < 0) item = 0;
        cJSON_AddStringToObject(m, "item", gr__jstr(cJSON_GetArrayItem(items, item), "id", ""));
        /* the claims it voids: those of pairs_with that exist as claims */
        cJSON *voids = cJSON_AddArrayToObject(m, "voids");
        cJSON_ArrayForEach(v, pairs) {
            if (!cJSON_IsString(v) || strchr(v->valuestring, '.') == NULL) continue;
            int i = gr__s1_item_of(items, v->valuestring);
            if (i < 0) continue;
            const cJSON *cl;
            char want[64];
            snprintf(want, sizeof want, "%s", strchr(v->valuestring, '.') + 1);
            for (char *q = want; *q; q++)
                if (*q == '.') *q = '_';
            cJSON_ArrayForEach(cl, cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(items, i),
                                                                    "claims"))
                if (strcmp(gr__jstr(cl, "id", ""), want) == 0) {
                    char full[128];
                    snprintf(full, sizeof full, "%s.%s",
                             gr__jstr(cJSON_GetArrayItem(items, i), "id", ""), want);
                    cJSON_AddItemToArray(voids, cJSON_CreateString(full));
                }
        }
        if (cJSON_IsArray(secs)) {
            cJSON *nib = cJSON_AddArrayToObject(m, "not_in_boxes");
            const cJSON *b;
            cJSON_ArrayForEach(b, boxes) {
                const char *bid = gr__jstr(b, "id", "");
                if (!gr__json_has_string(secs, bid))
                    cJSON_AddItemToArray(nib, cJSON_CreateString(bid));
            }
        }
        cJSON_AddItemToArray(miscs, m);
    }
    /* rules: only those whose meaning did not change */
    const cJSON *old = cJSON_GetObjectItemCaseSensitive(root, "rules");
    cJSON *rules = cJSON_CreateObject();
    static const char *const carry[] = {"penalty_cap", "max_sentence_tokens",
                                        "max_claims_per_sentence"};
    for (size_t k = 0; k < sizeof carry / sizeof carry[0]; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(old, carry[k]);
        if (cJSON_IsNumber(v)) cJSON_AddNumberToObject(rules, carry[k], v->valuedouble);
    }
    cJSON_DeleteItemFromObjectCaseSensitive(root, "rules");
    cJSON_AddItemToObject(root, "rules", rules);
    cJSON_DeleteItemFromObjectCaseSensitive(root, "boxes");
    cJSON_AddItemToObject(root, "boxes", boxes);
    cJSON_DeleteItemFromObjectCaseSensitive(root, "items");
    cJSON_AddItemToObject(root, "items", items);
    cJSON_DeleteItemFromObjectCaseSensitive(root, "misconceptions");
    cJSON_AddItemToObject(root, "misconceptions", miscs);
    cJSON_DeleteItemFromObjectCaseSensitive(root, "schema");
    cJSON_AddNumberToObject(root, "schema", 2);
}

/* agreement.json beside the rubric (else labs/rubric/agreement.json under the working
   directory): what `make agreement` measured of this lab's grades against human markers on
   answer sheets the rubric was never tuned on. The report quotes it, so that a learner knows
   how far the grade can be trusted. No file, no entry: the report says nothing of it. */
static void gr__load_agreement(gr__ctx *c, const char *rubric_path) {
    gr__sb p = {0};
    gr__sb_printf(c, &p, "%s/agreement.json", gr__dirname(c, rubric_path));
    if (access(p.s, R_OK) != 0) {
        p = (gr__sb){0};
        gr__sb_add(c, &p, "labs/rubric/agreement.json");
        if (access(p.s, R_OK) != 0) return;
    }
    const cJSON *doc = gr__load_json_file(c, p.s, "agreement file");
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(doc, c->R.lab);
    const cJSON *test = cJSON_GetObjectItemCaseSensitive(e, "test");
    if (e == NULL) return;
    static const char *const need[] = {"sheets", "within_2", "marked_5_down",
                                       "mean_diff_marked_5_down", "marked_12_up",
                                       "mean_diff_marked_12_up"};
    for (size_t k = 0; k < sizeof need / sizeof need[0]; k++)
        if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(test, need[k])))
            gr__fail(c, MC_ERR_INVALID_DESC,
                     "agreement file %s: %s.test.%s must be a number (make agreement writes it)",
                     p.s, c->R.lab, need[k]);
    c->R.agreement = test;
}

static void gr__load_rubric(gr__ctx *c, const char *path) {
    cJSON *root = gr__load_json_file(c, path, "rubric");
    gr__rubric *R = &c->R;
    R->root = root;
    R->path = gr__strdup(c, path);
    int schema = (int)gr__jnum(root, "schema", 1);
    if (schema == 1) gr__from_schema1(c, root, path);
    else if (schema != 2)
        gr__fail(c, MC_ERR_INVALID_DESC,
                 "rubric %s: \"schema\" must be 2 (or 1, read through a translation; see "
                 "labs/rubric/SCHEMA.md)", path);
    gr__apply_includes(c, root, path);
    R->lab = gr__jstr(root, "lab", "lab");
    R->question = gr__jstr(root, "question", "");
    R->title = gr__jstr(root, "title", "");
    R->version = gr__jstr(root, "rubric_version", "?");
    R->source_version = gr__jstr(root, "source_version", "");
    const cJSON *max = cJSON_GetObjectItemCaseSensitive(root, "max");
    R->max_main = gr__jnum(max, "main", 10);
    R->max_followup = gr__jnum(max, "followup", 5);
    R->parts = cJSON_GetObjectItemCaseSensitive(root, "parts");
    R->variants = cJSON_GetObjectItemCaseSensitive(root, "variants");
    R->header_fields = cJSON_GetObjectItemCaseSensitive(root, "header_fields");
    const char *tmpl = gr__jstr(root, "template", NULL);
    if (tmpl != NULL) {
        gr__sb t = {0};
        if (tmpl[0] == '/')
            gr__sb_add(c, &t, tmpl);
        else
            gr__sb_printf(c, &t, "%s/%s", gr__dirname(c, path), tmpl);
        R->template_path = t.s;
    }
    gr__load_rules(c, root);
    gr__load_lexicon(c, root);
    gr__load_language(c, root);
    gr__load_boxes(c, root);
    gr__load_items(c, root);
    gr__load_misconceptions(c, root);
    gr__load_agreement(c, path);
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

/* 1 when the period at text[i] closes an abbreviation that a sentence goes on after ("e.g.",
   "i.e.", "vs.", "Exp. C", "max rel. diff"): the word before it, read back to a space. */
static int gr__abbreviation_at(const char *text, size_t i) {
    static const char *const abbr[] = {"e.g", "i.e", "vs", "cf", "approx", "rel", "resp", "exp",
                                       "fig", "eq", "al", "incl", "esp", "w.r.t", "a.k.a", NULL};
    size_t b = i;
    while (b > 0 && (isalpha((unsigned char)text[b - 1]) || text[b - 1] == '.'))
        b--;
    size_t len = i - b;
    if (len == 0 || len > 7) return 0;
    for (int k = 0; abbr[k] != NULL; k++)
        if (strlen(abbr[k]) == len && strncasecmp(text + b, abbr[k], len) == 0) return 1;
    return 0;
}

/* 1 when the character at text[i] ends a sentence; *adv = its length in bytes. */
static int gr__sentence_end(const char *text, size_t n, size_t i, size_t *adv) {
    unsigned char ch = (unsigned char)text[i];
    *adv = 1;
    if (ch == '\n' || ch == '!' || ch == '?') return 1; /* ';' joins clauses of one sentence */
    if (ch == '.') {
        if (i + 1 >= n) return 1;
        if (gr__abbreviation_at(text, i)) return 0;
        unsigned char next = (unsigned char)text[i + 1];
        return isspace(next) || next == '\x01' || next >= 0x80;
    }
    if (ch >= 0x80) {
        ucs4_t uc;
        int m = u8_mbtouc(&uc, (const uint8_t *)text + i, n - i);
        *adv = m > 0 ? (size_t)m : 1;
        return uc == 0x3002 || uc == 0xFF01 || uc == 0xFF1F || uc == 0xFF61;
    }
    return 0;
}

/* Parser state while walking the document. */
typedef struct gr__walk {
    int part; /* part of the current level-2 heading */
    int box;  /* current box, -1 = none the rubric knows */
    int box_part;
    int para; /* paragraph counter */
} gr__walk;

static void gr__add_sentence(gr__ctx *c, const gr__walk *w, int in_list, const char *text,
                             size_t n, int line) {
    while (n > 0 && (isspace((unsigned char)*text) || *text == '\x01')) {
        text++;
        n--;
    }
    while (n > 0 && (isspace((unsigned char)text[n - 1]) || text[n - 1] == '\x01'))
        n--;
    if (n == 0) return;
    gr__sheet *S = &c->S;
    if (S->nsent >= GR__MAX_SENTENCES) {
        S->dropped++;
        return;
    }
    gr__sent *s = GR__PUSH(c, S->sent, S->nsent, S->capsent);
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
    s->box = w->box;
    s->part = w->box >= 0 ? w->box_part : w->part;
    s->in_list = in_list;
    s->para = w->para;
}

/* Splits a paragraph into sentences on . ! ? ; 。！？； and hard line breaks. */
static void gr__add_paragraph(gr__ctx *c, gr__walk *w, int in_list, const char *text, size_t n,
                              int line0) {
    w->para++;
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
        gr__add_sentence(c, w, in_list, text + start, stop - start, sline);
        for (size_t j = start; j < stop; j++)
            if (text[j] == '\x01' || text[j] == '\n') line++;
        start = stop;
        if (i == n) break;
        i = stop;
    }
}

/* The box a heading opens: its first word is a box id ("M1", "FU2"), or the heading starts
   with one of the box's "match" phrases (titles of older templates: "A3 Creation order"). */
static int gr__box_of_heading(gr__ctx *c, const char *norm) {
    char hid[16];
    gr__heading_id(norm, hid, sizeof hid);
    const gr__rubric *R = &c->R;
    for (int b = 0; b < R->nbox; b++)
        if (hid[0] != '\0' && strcasecmp(R->box[b].id, hid) == 0) return b;
    while (*norm == ' ' || *norm == '#')
        norm++;
    /* the heading as written, then without its first word ("A1 Layout rule" -> "layout rule") */
    const char *after = norm + strcspn(norm, " ");
    while (*after == ' ')
        after++;
    const char *forms[2] = {norm, after};
    for (int f = 0; f < 2; f++)
        for (int b = 0; b < R->nbox; b++) {
            const cJSON *m;
            cJSON_ArrayForEach(m, R->box[b].match) {
                if (!cJSON_IsString(m)) continue;
                char *k = gr__normalize(c, m->valuestring, strlen(m->valuestring));
                size_t kl = strlen(k);
                if (kl > 0 && strncmp(forms[f], k, kl) == 0 && !isalnum((unsigned char)forms[f][kl]))
                    return b;
            }
        }
    return -1;
}

static void gr__on_heading(gr__ctx *c, cmark_node *node, gr__walk *w) {
    size_t hl = 0;
    char *htext = gr__inline_text(c, node, &hl);
    for (char *p = htext; *p != '\0'; p++)
        if (*p == '\x01' || *p == '\n') *p = ' ';
    int level = cmark_node_get_heading_level(node);
    char *norm = gr__normalize(c, htext, hl);
    int box = level >= 2 ? gr__box_of_heading(c, norm) : -1;
    if (level <= 2) w->part = level == 1 ? GR__PART_OTHER : gr__heading_part(c, norm);
    if (box >= 0) {
        w->box = box;
        w->box_part = c->R.box[box].part;
        if (level <= 2) w->part = w->box_part;
        return;
    }
    if (level <= 3) w->box = -1; /* a heading the rubric does not know: its text still counts */
}

/* 1 when node sits inside a list item. */
static int gr__in_list_item(cmark_node *node) {
    for (cmark_node *p = cmark_node_parent(node); p != NULL; p = cmark_node_parent(p))
        if (cmark_node_get_type(p) == CMARK_NODE_ITEM) return 1;
    return 0;
}

/* Parses the sheet into sentences (with their box) and pred blocks. */
static void gr__parse_sheet(gr__ctx *c, const char *text, size_t n) {
    gr__sheet *S = &c->S;
    S->present = 1;
    c->doc = cmark_parse_document(text, n, CMARK_OPT_DEFAULT);
    if (c->doc == NULL) gr__fail(c, MC_ERR_NO_MEMORY, "grader: out of memory");
    S->has_header = gr__parse_header_text(text, S->nonce, &S->probe, S->variant);
    gr__walk w = {GR__PART_OTHER, -1, GR__PART_OTHER, 0};
    cmark_iter *it = cmark_iter_new(c->doc);
    if (it == NULL) gr__fail(c, MC_ERR_NO_MEMORY, "grader: out of memory");
    c->iters[0] = it;
    cmark_event_type ev;
    while ((ev = cmark_iter_next(it)) != CMARK_EVENT_DONE) {
        if (ev != CMARK_EVENT_ENTER) continue;
        cmark_node *node = cmark_iter_get_node(it);
        switch (cmark_node_get_type(node)) {
        case CMARK_NODE_HEADING: gr__on_heading(c, node, &w); break;
        case CMARK_NODE_PARAGRAPH: {
            size_t len = 0;
            char *t = gr__inline_text(c, node, &len);
            gr__add_paragraph(c, &w, gr__in_list_item(node), t, len,
                              cmark_node_get_start_line(node));
            break;
        }
        case CMARK_NODE_CODE_BLOCK: {
            const char *info = cmark_node_get_fence_info(node);
            char word[16] = {0};
            if (info != NULL) sscanf(info, "%15s", word);
            if (strcasecmp(word, "pred") != 0) break; /* other code blocks are not prose */
            gr__predblock *b = GR__PUSH(c, S->pb, S->npb, S->cappb);
            int bpart = w.box >= 0 ? w.box_part : w.part;
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
    int decimals;     /* the digits written after the point (1.5e-06: 7) */
    char text[32];
    size_t start;
    int zero_word;    /* count bindings: "no" / "无" before the quantity, meaning 0 */
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
            /* scientific notation: "3.8e-09" is 3.8e-09 written to 10 decimals */
            size_t x = j + 1;
            if (j < n && s[j] == 'e' && x < n && (s[x] == '-' || s[x] == '+')) x++;
            if (j < n && s[j] == 'e' && x < n && isdigit((unsigned char)s[x])) {
                size_t y = x;
                while (y < n && isdigit((unsigned char)s[y])) y++;
                if (!glued_before && (y == n || !isalnum((unsigned char)s[y])) && y - i < 30) {
                    gr__num *q = GR__PUSH(c, *nums, *nnums, *ncap);
                    memset(q, 0, sizeof *q);
                    memcpy(q->text, s + i, y - i);
                    q->v = strtod(q->text, NULL);
                    int exp10 = atoi(s + j + 1);
                    q->decimals = dec - exp10 > 0 ? dec - exp10 : 0;
                    q->start = i;
                    i = y;
                    continue;
                }
            }
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

static char *gr__json_canon(gr__ctx *c, const cJSON *j);

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
        } else if (ch == '+' && (isdigit((unsigned char)v[i + 1]) || v[i + 1] == '.')) {
            i++; /* a signed number ("+2048", a shift forward): JSON has no unary plus */
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

static uint64_t gr__ngram_hash(gr__tok *const *t, int n) {
    uint64_t h = gr__fnv1a((const char *)&n, sizeof n, 0xcbf29ce484222325ULL);
    for (int i = 0; i < n; i++) {
        const char *w = t[i]->stem != NULL ? t[i]->stem : t[i]->s; /* "builds" = "build" */
        h = gr__fnv1a(w, strlen(w), h);
        h = gr__fnv1a("\x1f", 1, h);
    }
    return h | 1; /* 0 marks an empty slot */
}

#define GR__ALL_BOXES ((uint64_t)1 << 63)
/* set for the rubric's own texts (its claims' needs): a short sentence that shares one run of
   words with a need is usually the answer the need describes, not a copy of it */
#define GR__RUBRIC_TEXT ((uint64_t)1 << 62)
#define GR__RUBRIC_PROMPT (-2)

static void gr__ngram_insert(gr__ctx *c, uint64_t h, uint64_t boxes) {
    if ((c->ngram_n + 1) * 2 > c->ngram_cap) {
        size_t ncap = c->ngram_cap ? c->ngram_cap * 2 : 4096;
        uint64_t *nt = (uint64_t *)calloc(ncap, sizeof *nt);
        uint64_t *nb = (uint64_t *)calloc(ncap, sizeof *nb);
        if (nt == NULL || nb == NULL) {
            free(nt);
            free(nb);
            gr__fail(c, MC_ERR_NO_MEMORY, "grader: out of memory");
        }
        for (size_t i = 0; i < c->ngram_cap; i++) {
            if (c->ngram[i] == 0) continue;
            size_t k = c->ngram[i] & (ncap - 1);
            while (nt[k] != 0)
                k = (k + 1) & (ncap - 1);
            nt[k] = c->ngram[i];
            nb[k] = c->ngram_boxes[i];
        }
        free(c->ngram);
        free(c->ngram_boxes);
        c->ngram = nt;
        c->ngram_boxes = nb;
        c->ngram_cap = ncap;
    }
    size_t k = h & (c->ngram_cap - 1);
    while (c->ngram[k] != 0) {
        if (c->ngram[k] == h) {
            c->ngram_boxes[k] |= boxes;
            return;
        }
        k = (k + 1) & (c->ngram_cap - 1);
    }
    c->ngram[k] = h;
    c->ngram_boxes[k] = boxes;
    c->ngram_n++;
}

/* The boxes whose prompt holds this n-gram (0 when none). */
static uint64_t gr__ngram_has(const gr__ctx *c, uint64_t h) {
    if (c->ngram_cap == 0) return 0;
    size_t k = h & (c->ngram_cap - 1);
    while (c->ngram[k] != 0) {
        if (c->ngram[k] == h) return c->ngram_boxes[k];
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

/* Adds a prompt's n-grams; box = the box it asks (-1: every box). */
static void gr__add_prompt_text(gr__ctx *c, const char *text, int box) {
    char *norm = gr__normalize(c, text, strlen(text));
    int ntok = 0, n = 0;
    gr__tok *tok = gr__tokenize(c, norm, 0, &ntok);
    gr__tok **ct = gr__content_tokens(c, tok, ntok, &n);
    uint64_t mask = box == GR__RUBRIC_PROMPT ? GR__RUBRIC_TEXT
                    : box < 0 || box >= 62   ? GR__ALL_BOXES
                                             : (uint64_t)1 << box;
    for (int len = 2; len <= 5; len++)
        for (int i = 0; i + len <= n; i++)
            gr__ngram_insert(c, gr__ngram_hash(ct + i, len), mask);
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

static int gr__json_has_string(const cJSON *list, const char *s) {
    const cJSON *e;
    cJSON_ArrayForEach(e,
                       list) if (cJSON_IsString(e) && strcasecmp(e->valuestring, s) == 0) return 1;
    return 0;
}

/* no_ing: a word ending in -ing matches only an alternative written with -ing (for verbs:
   "sharding" in "no model sharding" is a noun, not a predicate). */
static int gr__alt_at(const gr__alt *a, const gr__sent *s, int i, int no_ing) {
    if (i + a->npt > s->ntok) return 0;
    for (int j = 0; j < a->npt; j++) {
        const gr__tok *p = &a->pt[j], *t = &s->tok[i + j];
        if (p->kind != t->kind) return 0;
        if (no_ing && p->kind == GR__T_WORD && !p->exact && t->len > 4 &&
            strcmp(t->s + t->len - 3, "ing") == 0 &&
            !(p->len > 3 && strcmp(p->s + p->len - 3, "ing") == 0))
            return 0;
        if (p->kind == GR__T_WORD) {
            if (p->prefix   ? strncmp(t->s, p->s, (size_t)p->len) != 0
                : p->exact ? strcmp(t->s, p->s) != 0
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

/* A verb of the predicate list, not a noun that looks like one: never a piece of an
   identifier (use_local_synchronization), and an -s form matched by its stem ("shards",
   "calls") is a plural noun after "and", "the", "of" and the like. */
static int gr__verb_here(gr__ctx *c, const gr__alt *alt, const gr__sent *s, int i) {
    const gr__tok *t = &s->tok[i];
    if (t->kind != GR__T_WORD) return 1;
    if (t->ident) return 0;
    if (alt->npt != 1 || alt->pt[0].exact || t->len < 3 || t->s[t->len - 1] != 's' ||
        t->s[t->len - 2] == 's' || alt->pt[0].s[alt->pt[0].len - 1] == 's')
        return 1;
    if (i == 0) return 1;
    const gr__tok *p = &s->tok[i - 1];
    if (p->kind != GR__T_WORD) return 1;
    static const char *const before_noun[] = {"and", "or", "the", "a", "an", "of", "its", "their",
                                              "these", "those", "all", "some", "no", "two", "both",
                                              "many", "few", "with", "for", "to", "in", "on", "per",
                                              "by", "from", "our", "his", "her", "my", "your", NULL};
    for (int k = 0; before_noun[k] != NULL; k++)
        if (strcmp(p->s, before_noun[k]) == 0) return 0;
    (void)c;
    return 1;
}

/* 1 when tokens [start, end) lie inside an occurrence of one of the concept's excluded words. */
static int gr__inside_exclusion(const gr__concept *cp, const gr__sent *s, int start, int end) {
    for (int x = 0; x < cp->nexcl; x++) {
        const gr__alt *w = &cp->excl[x];
        for (int p = end - w->npt; p <= start; p++)
            if (p >= 0 && gr__alt_at(w, s, p, 0)) return 1;
    }
    return 0;
}

/* Keeps the matches that are not pieces of an excluded word; returns how many. */
static int gr__drop_inside_exclusions(const gr__concept *cp, const gr__sent *s, gr__match *arr,
                                      int n) {
    int kept = 0;
    for (int i = 0; i < n; i++)
        if (cp->nexcl == 0 || !gr__inside_exclusion(cp, s, arr[i].start, arr[i].end))
            arr[kept++] = arr[i];
    return kept;
}

static void gr__find_concept(gr__ctx *c, gr__sent *s, int k) {
    const gr__concept *cp = &c->R.concepts[k];
    gr__match *arr = NULL;
    int n = 0, cap = 0;
    for (int a = 0; a < cp->nalt; a++) {
        const gr__alt *alt = &cp->alt[a];
        if (!alt->is_re) {
            int verb = k == c->R.L.pred || k == c->R.L.weak_pred || k == c->R.L.amb_verb;
            for (int i = 0; i + alt->npt <= s->ntok; i++) {
                /* a one-word phrase does not match a piece of an identifier: "model" in
                   initialize_model_parallel is not the model */
                if (alt->npt == 1 && s->tok[i].ident && cp->lexical) continue;
                if (gr__alt_at(alt, s, i, verb) && (!verb || gr__verb_here(c, alt, s, i)))
                    gr__push_match(c, &arr, &n, &cap, i, i + alt->npt, a);
            }
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
    n = gr__drop_inside_exclusions(cp, s, arr, n);
    s->cm[k] = arr;
    s->ncm[k] = n;
}


static int gr__overlaps(const gr__match *a, const gr__match *b) {
    return a->start < b->end && b->start < a->end;
}

/* 1 when some match of concept k overlaps m. */
static int gr__overlaps_concept(const gr__sent *s, int k, const gr__match *m) {
    for (int i = 0; i < s->ncm[k]; i++)
        if (gr__overlaps(&s->cm[k][i], m)) return 1;
    return 0;
}

/* A negator that is part of a phrase the lexicon knows, inside it ("does not matter", "ranks
   that are not members", "non-member") or of a frame or an exception ("it is not true that", "not
   only", "不同") has no scope of its own: the phrase carries its meaning. */
static int gr__negator_absorbed(const gr__ctx *c, const gr__sent *s, const gr__match *n) {
    const gr__rubric *R = &c->R;
    const int frames[] = {R->L.neg_except, R->L.deny_pre, R->L.deny_post, R->L.report,
                          R->L.cond_neg};
    for (size_t f = 0; f < sizeof frames / sizeof frames[0]; f++)
        if (gr__overlaps_concept(s, frames[f], n)) return 1;
    /* a lexicon phrase carries the negation only when it goes on after the negator ("not
       members", "does not matter"); one that ends with it ("need not", or "not" alone) leaves
       the negator its scope: "the states need not be saved" does not say they are saved */
    for (int k = 0; k < R->nconcepts; k++) {
        if (!R->concepts[k].lexical) continue;
        for (int i = 0; i < s->ncm[k]; i++)
            if (gr__overlaps(&s->cm[k][i], n) && s->cm[k][i].end > n->end) return 1;
    }
    return 0;
}

/* Clause index of every token: a clause ends at a comma, semicolon, colon, parenthesis or
   dash, and a new one starts at a clause-break word ("because", "but", "which", "所以"), a
   contrast marker or a conditional marker. */
/* "once" is a conditional ("Once the backward ends, ...", "..., once all ranks arrive") when
   it opens its clause or a subject follows it; elsewhere it is an adverb ("stored once on
   stage 0", "runs once per step") and its matches are dropped. */
static void gr__drop_adverb_once(gr__ctx *c, gr__sent *s) {
    int k = c->R.L.cond, kept = 0;
    for (int i = 0; i < s->ncm[k]; i++) {
        const gr__match *m = &s->cm[k][i];
        int t = m->start, adverb = 0;
        if (m->end - m->start == 1 && strcmp(s->tok[t].s, "once") == 0) {
            int opens = t == 0 || s->tok[t - 1].barrier || s->tok[t - 1].kind == GR__T_SYM;
            static const char *const subjects[] = {"the", "a", "an", "all", "every", "each",
                                                   "both", "any", "some", "it", "they", "we",
                                                   "you", "this", "these", "those", "its",
                                                   "their", "our", "your", "there", NULL};
            int subject = 0;
            for (int j = 0; subjects[j] != NULL && !subject && t + 1 < s->ntok; j++)
                subject = strcmp(s->tok[t + 1].s, subjects[j]) == 0;
            adverb = !opens && !subject;
        }
        if (!adverb) s->cm[k][kept++] = *m;
    }
    s->ncm[k] = kept;
}

static void gr__clauses(gr__ctx *c, gr__sent *s) {
    const gr__rubric *R = &c->R;
    gr__drop_adverb_once(c, s);
    uint8_t *starts = (uint8_t *)gr__alloc(c, (size_t)s->ntok + 1);
    const int kinds[] = {R->L.brk, R->L.contrast, R->L.cond, R->L.cond_neg};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (int i = 0; i < s->ncm[kinds[k]]; i++)
            starts[s->cm[kinds[k]][i].start] = 1;
    /* A contrast marker between a subject and its verb ("ModuleSpec 其实就是一个配置",
       "the spec in fact is the config") is a sentence adverb inside one clause: nothing
       before it in the clause is a verb, and a verb follows within two tokens. */
    for (int i = 0; i < s->ncm[R->L.contrast]; i++) {
        const gr__match *m = &s->cm[R->L.contrast][i];
        int t0 = m->start, verb_before = 0, verb_after = 0;
        while (t0 > 0 && !s->tok[t0 - 1].barrier)
            t0--;
        for (int j = 0; j < s->ncm[R->L.pred]; j++) {
            const gr__match *p = &s->cm[R->L.pred][j];
            if (p->start >= t0 && p->end <= m->start) verb_before = 1;
            if (p->start >= m->end && p->start - m->end <= 2) verb_after = 1;
        }
        if (t0 < m->start && !verb_before && verb_after) starts[m->start] = 0;
    }
    /* a clause-break word right after a negator is what the negator denies ("it knows the
       order, not which group the caller meant", "not because ...", "不是因为"): no new clause */
    for (int i = 0; i < s->ncm[R->L.neg]; i++) {
        const gr__match *m = &s->cm[R->L.neg][i];
        if (m->end < s->ntok && !s->tok[m->end - 1].barrier) starts[m->end] = 0;
    }
    int clause = 0, fresh = 1;
    for (int t = 0; t < s->ntok; t++) {
        if (starts[t] && !fresh) clause++;
        s->clause[t] = clause;
        fresh = 0;
        if (s->tok[t].barrier) {
            clause++;
            fresh = 1;
        }
    }
    s->nclause = clause + 1;
}

/* First token at or after `from` that starts a contrast marker ("but", "in fact", "其实"),
   or ntok: where a frame's scope ends. */
static int gr__contrast_after(const gr__ctx *c, const gr__sent *s, int from) {
    int end = s->ntok;
    int k = c->R.L.contrast;
    for (int i = 0; i < s->ncm[k]; i++)
        if (s->cm[k][i].start >= from && s->cm[k][i].start < end) end = s->cm[k][i].start;
    return end;
}

/* 1 when a post-frame ("... is wrong") ends its clause: nothing but punctuation or a new
   clause follows it. */
static int gr__ends_clause(const gr__sent *s, const gr__match *m) {
    if (m->end >= s->ntok) return 1;
    if (s->tok[m->end].barrier) return 1;
    if (s->tok[m->end].kind == GR__T_SYM) return 1;
    return s->clause[m->end] != s->clause[m->start];
}

static int gr__is_coordinator(const gr__tok *t) {
    return t->kind == GR__T_WORD && (strcmp(t->s, "and") == 0 || strcmp(t->s, "or") == 0 ||
                                     strcmp(t->s, "but") == 0 || strcmp(t->s, "yet") == 0);
}

/* 1 when a word looks like a verb in the third person by its spelling alone ("matches",
   "holds", "knows"): longer than three letters and ending in an "s" that is not part of "ss",
   "us" or "is" ("pass", "status", "this"). For verbs the lexicon does not list. */
static int gr__looks_third_person(const gr__tok *w) {
    size_t n = w->kind == GR__T_WORD ? strlen(w->s) : 0;
    return n > 3 && w->s[n - 1] == 's' && w->s[n - 2] != 's' && w->s[n - 2] != 'u' &&
           w->s[n - 2] != 'i';
}

/* 1 when a verb stands in clause k before token t: a word of the predicate lists, or a word
   in the third person ("matches", "holds") after another word that is not a coordinator
   (a noun in the plural heads a list: "and buckets"). */
static int gr__verb_before(gr__ctx *c, const gr__sent *s, int t, int k) {
    const gr__rubric *R = &c->R;
    const int kinds[] = {R->L.pred, R->L.weak_pred};
    for (size_t j = 0; j < sizeof kinds / sizeof kinds[0]; j++)
        for (int i = 0; i < s->ncm[kinds[j]]; i++) {
            const gr__match *v = &s->cm[kinds[j]][i];
            if (v->end <= t && s->clause[v->start] == k) return 1;
        }
    for (int u = t - 1; u > 0 && s->clause[u] == k; u--)
        if (gr__looks_third_person(&s->tok[u]) && s->tok[u - 1].kind == GR__T_WORD &&
            !gr__is_coordinator(&s->tok[u - 1]))
            return 1;
    return 0;
}

static int gr__is_subject_pronoun(const gr__tok *t) {
    static const char *const p[] = {"it", "they", "we", "you", "he", "she", "i", NULL};
    if (t->kind != GR__T_WORD) return 0;
    for (int i = 0; p[i] != NULL; i++)
        if (strcmp(t->s, p[i]) == 0) return 1;
    return 0;
}

/* 1 when negator m is the object of the verb right before it ("knows nothing of", "needs no
   gather", "sees none"): the clause says its doer does not know, need or see. The verb is a
   word of the predicate lists, or one in the third person ("knows", "checks"). */
static int gr__object_negator_after_verb(gr__ctx *c, const gr__sent *s, const gr__match *m) {
    const gr__rubric *R = &c->R;
    static const char *const objects[] = {"nothing", "no", "none", "nobody", NULL};
    const gr__tok *w = &s->tok[m->start];
    int t = m->start - 1;
    if (t < 0 || w->kind != GR__T_WORD || s->clause[t] != s->clause[m->start]) return 0;
    int is_object = 0;
    for (int i = 0; objects[i] != NULL && !is_object; i++)
        is_object = strcmp(w->s, objects[i]) == 0;
    if (!is_object) return 0;
    const gr__tok *v = &s->tok[t];
    if (v->kind != GR__T_WORD) return 0;
    const int kinds[] = {R->L.pred, R->L.weak_pred, R->L.amb_verb};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (int i = 0; i < s->ncm[kinds[k]]; i++)
            if (s->cm[kinds[k]][i].end == m->start) return 1;
    return gr__looks_third_person(v);
}

/* 1 when negator m negates a verb phrase: it follows an auxiliary or modal ("is not",
   "would never"), or it is one of the verb negators that need none ("cannot", "never"). */
static int gr__negates_verb(gr__ctx *c, const gr__sent *s, const gr__match *m) {
    const gr__rubric *R = &c->R;
    for (int i = 0; i < s->ncm[R->L.verb_negators]; i++)
        if (s->cm[R->L.verb_negators][i].start == m->start) return 1;
    if (gr__object_negator_after_verb(c, s, m)) return 1;
    for (int i = 0; i < s->ncm[R->L.auxiliaries]; i++) {
        const gr__match *a = &s->cm[R->L.auxiliaries][i];
        if (a->end <= m->start && m->start - a->end <= 1 && s->clause[a->start] == s->clause[m->start])
            return 1;
    }
    return 0;
}

static int gr__is_semicolon(const gr__tok *t) {
    return t->kind == GR__T_SYM && (strcmp(t->s, ";") == 0 || strcmp(t->s, "\xEF\xBC\x9B") == 0);
}

/* 1 when a plain negator starts in tokens [from, to). */
static int gr__negator_in(const gr__ctx *c, const gr__sent *s, int from, int to) {
    for (int i = 0; i < s->ncm[c->R.L.neg]; i++)
        if (s->cm[c->R.L.neg][i].start >= from && s->cm[c->R.L.neg][i].start < to) return 1;
    return 0;
}

static int gr__is_colon(const gr__tok *t) {
    return t->kind == GR__T_SYM && (strcmp(t->s, ":") == 0 || strcmp(t->s, "\xEF\xBC\x9A") == 0);
}

/* 1 when negator m joins one more denied statement to a list of them: "nor", "neither", or a
   Chinese negator after 也 ("也不是", "也没有"). */
static int gr__coordinates_denial(const gr__sent *s, const gr__match *m) {
    const gr__tok *w = &s->tok[m->start];
    if (w->kind == GR__T_WORD) return strcmp(w->s, "nor") == 0 || strcmp(w->s, "neither") == 0;
    return m->start > 0 && strcmp(s->tok[m->start - 1].s, "\xE4\xB9\x9F") == 0; /* 也 */
}

/* 1 when clause k opens with a word that adds a statement of its own ("and its coordinates
   are not ...", "likewise the group does not exist", "而且……不是"). */
static int gr__clause_adds_statement(const gr__sent *s, int k) {
    static const char *const opens[] = {"and", "also", "likewise", "plus", "while",
                                        "\xE8\x80\x8C\xE4\xB8\x94", /* 而且 */
                                        "\xE5\xB9\xB6\xE4\xB8\x94", /* 并且 */
                                        "\xE5\x90\x8C\xE6\x97\xB6", /* 同时 */
                                        NULL};
    int t = 0;
    while (t < s->ntok && s->clause[t] != k)
        t++;
    while (t < s->ntok && s->clause[t] == k && s->tok[t].kind == GR__T_SYM)
        t++;
    if (t >= s->ntok || s->clause[t] != k) return 0;
    for (int i = 0; opens[i] != NULL; i++) {
        const char *w = opens[i];
        if (s->tok[t].kind == GR__T_WORD) {
            if (strcmp(s->tok[t].s, w) == 0) return 1;
            continue;
        }
        /* Chinese: the characters of the word, one token each */
        size_t off = 0, lw = strlen(w);
        int u = t;
        while (off < lw && u < s->ntok && s->tok[u].kind == GR__T_CJK &&
               strncmp(w + off, s->tok[u].s, strlen(s->tok[u].s)) == 0) {
            off += strlen(s->tok[u].s);
            u++;
        }
        if (off == lw) return 1;
    }
    return 0;
}

/* Negation depth, frames and conditional antecedents of every token (see grader.h). */
static void gr__polarity(gr__ctx *c, gr__sent *s) {
    const gr__rubric *R = &c->R;
    int n = s->ntok;
    /* denial and report frames before a statement: to the next contrast marker, or to a
       semicolon ("It is a myth that X; Y" asserts Y), or to a colon after what it denies */
    const int pre[] = {R->L.deny_pre, R->L.report};
    int *frame_clause = (int *)gr__alloc(c, sizeof(int) * (size_t)(n + 1));
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < s->ncm[pre[k]]; i++) {
            const gr__match *m = &s->cm[pre[k]][i];
            int end = gr__contrast_after(c, s, m->end);
            double said = 0; /* words the frame has covered */
            for (int t = m->end; t < end && !gr__is_semicolon(&s->tok[t]); t++) {
                /* "It is a myth that X: SP does not move Y": a negated statement after the
                   colon is the writer's own answer to X, not a second denial under the frame;
                   a plain one ("It is not true that X: A, B and C") details what it denies, and
                   a colon right after the frame ("the misconception is: X") opens it */
                if (gr__is_colon(&s->tok[t]) && said >= 2 && gr__negator_in(c, s, t + 1, end))
                    break;
                said += s->tok[t].kind == GR__T_WORD ? 1 : s->tok[t].kind == GR__T_CJK ? 0.5 : 0;
                s->frame[t] = 1;
                frame_clause[t] = m->end < n ? s->clause[m->end] : s->clause[n - 1];
            }
        }
    /* plain negators: to the end of their clause; a negated verb phrase ("does not", "would
       never", "cannot") negates its whole clause, the subject included */
    for (int i = 0; i < s->ncm[R->L.neg]; i++) {
        const gr__match *m = &s->cm[R->L.neg][i];
        if (gr__negator_absorbed(c, s, m)) continue;
        /* "It is not true that X, nor that Y", "并不是说 X，也不是 Y": the frame's own denial
           goes on to Y; it is not a second negation */
        if (s->frame[m->start] && gr__coordinates_denial(s, m)) continue;
        /* "It is not the case that X, and its coordinates are not Y": a negator in a later
           clause of its own denies that clause; the frame does not turn it back into a
           statement (a double negation counts only within the frame's first clause) */
        if (s->frame[m->start] && s->clause[m->start] != frame_clause[m->start] &&
            gr__clause_adds_statement(s, s->clause[m->start]))
            for (int t = 0; t < n; t++)
                if (s->clause[t] == s->clause[m->start]) s->frame[t] = 0;
        /* overlapping negators ("并不是" = 并不 + 不是 + 不) are one negation: the longest, or
           the first of equally long ones, stands for them */
        int shadowed = 0;
        for (int j = 0; j < s->ncm[R->L.neg] && !shadowed; j++) {
            const gr__match *o = &s->cm[R->L.neg][j];
            if (j == i || !gr__overlaps(o, m) || gr__negator_absorbed(c, s, o)) continue;
            int ol = o->end - o->start, ml = m->end - m->start;
            shadowed = ol > ml || (ol == ml && (o->start < m->start || (o->start == m->start && j < i)));
        }
        if (shadowed) continue;
        int from = m->end, earlier = 0;
        for (int j = 0; j < s->ncm[R->L.neg] && !earlier; j++) {
            const gr__match *o = &s->cm[R->L.neg][j];
            earlier = o->end <= m->start && s->clause[o->start] == s->clause[m->start] &&
                      !gr__negator_absorbed(c, s, o);
        }
        /* back to the clause start, unless an earlier negator of the clause already covers it */
        if (!earlier && gr__negates_verb(c, s, m))
            while (from > 0 && s->clause[from - 1] == s->clause[m->start]) {
                /* "matches calls by sequence and does not look at names": the negation is the
                   second verb's; the first verb phrase, before the "and", stays stated */
                if (gr__is_coordinator(&s->tok[from - 1]) &&
                    gr__verb_before(c, s, from - 1, s->clause[m->start]))
                    break;
                from--;
                /* "the layers it does not own": a pronoun is the negated verb's own subject;
                   what stands before it belongs to another verb */
                if (from < m->start - 1 && gr__is_subject_pronoun(&s->tok[from])) break;
            }
        /* "不切模型、不设种子", "not A and not B": each negator reaches to the next one */
        int to = n;
        for (int j = 0; j < s->ncm[R->L.neg]; j++) {
            const gr__match *o = &s->cm[R->L.neg][j];
            if (o->start >= m->end && o->start < to && !gr__negator_absorbed(c, s, o) &&
                !gr__overlaps(o, m))
                to = o->start;
        }
        for (int t = from; t < to && s->clause[t] == s->clause[m->start]; t++)
            if (t < m->start || t >= m->end) s->negd[t]++;
    }
    /* conditional antecedents ("if", "unless" = if not): to the end of their clause */
    const int conds[] = {R->L.cond, R->L.cond_neg};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < s->ncm[conds[k]]; i++) {
            const gr__match *m = &s->cm[conds[k]][i];
            for (int t = m->end; t < n && s->clause[t] == s->clause[m->start]; t++) {
                s->hyp[t] = 1;
                if (k == 1) s->negd[t]++;
            }
        }
    /* denial after a statement ("... is false", "……是错误的"): back to the last contrast */
    for (int i = 0; i < s->ncm[R->L.deny_post]; i++) {
        const gr__match *m = &s->cm[R->L.deny_post][i];
        if (!gr__ends_clause(s, m)) continue;
        int from = 0;
        for (int j = 0; j < s->ncm[R->L.contrast]; j++) {
            const gr__match *x = &s->cm[R->L.contrast][j];
            if (x->end <= m->start && x->end > from) from = x->end;
        }
        for (int t = from; t < m->start; t++)
            s->frame[t] = 1;
    }
    /* talk about the task ("Here we must explain whose code runs the loop", "The question is
       whether ..."): what follows is what the answer should say, not what the writer says,
       to the end of the sentence or its semicolon part */
    for (int i = 0; i < s->ncm[R->L.task_frames]; i++)
        for (int t = s->cm[R->L.task_frames][i].start; t < n && !gr__is_semicolon(&s->tok[t]); t++)
            s->hyp[t] = 1;
    if (s->question)
        for (int t = 0; t < n; t++)
            s->hyp[t] = 1;
}

/* 1 when m lies inside a phrase of another lexicon concept that holds a negator before m
   ("报错" inside "不会报错", "matter" inside "does not matter"): the phrase absorbed the
   negator, but what it says of m is still negated. */
static int gr__inside_negated_phrase(const gr__ctx *c, const gr__sent *s, int k, const gr__match *m) {
    const gr__rubric *R = &c->R;
    for (int j = 0; j < s->ncm[R->L.neg]; j++) {
        const gr__match *n = &s->cm[R->L.neg][j];
        if (n->end > m->start) continue;
        for (int a = 0; a < R->nconcepts; a++) {
            if (a == k || !R->concepts[a].lexical) continue;
            for (int i = 0; i < s->ncm[a]; i++) {
                const gr__match *p = &s->cm[a][i];
                if (p->start <= n->start && n->end <= p->end && p->start <= m->start &&
                    m->end <= p->end)
                    return 1;
            }
        }
    }
    return 0;
}

static void gr__match_attributes(gr__ctx *c, gr__sent *s) {
    int *prop = (int *)gr__alloc(c, sizeof(int) * (size_t)(s->nclause + 1));
    uint8_t *all_hyp = (uint8_t *)gr__alloc(c, (size_t)s->nclause + 1);
    for (int k = 0; k < s->nclause; k++)
        all_hyp[k] = 1;
    uint8_t *marker = (uint8_t *)gr__alloc(c, (size_t)s->ntok + 1);
    const int conds[] = {c->R.L.cond, c->R.L.cond_neg};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < s->ncm[conds[k]]; i++)
            for (int t = s->cm[conds[k]][i].start; t < s->cm[conds[k]][i].end; t++)
                marker[t] = 1;
    for (int t = 0; t < s->ntok; t++) /* the marker ("if") itself is not in its antecedent */
        if (!s->hyp[t] && !marker[t]) all_hyp[s->clause[t]] = 0;
    for (int k = s->nclause - 1; k >= 0; k--) /* a chain of antecedents joins its consequent */
        prop[k] = all_hyp[k] && k + 1 < s->nclause ? prop[k + 1] : k;
    for (int k = 0; k < c->R.nconcepts; k++)
        for (int i = 0; i < s->ncm[k]; i++) {
            gr__match *m = &s->cm[k][i];
            int t = m->start < s->ntok ? m->start : s->ntok - 1;
            if (t < 0) continue;
            m->neg = (s->negd[t] + (c->R.concepts[k].lexical && gr__inside_negated_phrase(c, s, k, m))) % 2;
            m->framed = s->frame[t];
            m->hyp = s->hyp[t];
            m->clause = s->clause[t];
            m->prop = prop[m->clause];
        }
}

/* Function words ("the", "of", "on", "的", "了") among the words of a sentence. */
static double gr__function_ratio(gr__ctx *c, const gr__sent *s) {
    const gr__rubric *R = &c->R;
    int words = 0, function = 0;
    uint8_t *fw = (uint8_t *)gr__alloc(c, (size_t)s->ntok + 1);
    for (int i = 0; i < s->ncm[R->L.function_words]; i++)
        for (int t = s->cm[R->L.function_words][i].start; t < s->cm[R->L.function_words][i].end; t++)
            fw[t] = 1;
    for (int t = 0; t < s->ntok; t++) {
        if (s->tok[t].kind == GR__T_SYM || s->tok[t].kind == GR__T_NUM) continue;
        words++;
        function += fw[t];
    }
    return words > 0 ? (double)function / words : 0;
}

/* The share of a sentence's words that lexicon concepts cover. */
static double gr__concept_coverage(gr__ctx *c, const gr__sent *s) {
    const gr__rubric *R = &c->R;
    uint8_t *cov = (uint8_t *)gr__alloc(c, (size_t)s->ntok + 1);
    for (int k = 0; k < R->nconcepts; k++) {
        if (!R->concepts[k].lexical) continue;
        for (int i = 0; i < s->ncm[k]; i++)
            for (int t = s->cm[k][i].start; t < s->cm[k][i].end; t++)
                cov[t] = 1;
    }
    int words = 0, covered = 0;
    for (int t = 0; t < s->ntok; t++) {
        if (s->tok[t].kind == GR__T_SYM || s->tok[t].kind == GR__T_NUM) continue;
        words++;
        covered += cov[t];
    }
    return words > 0 ? (double)covered / words : 0;
}

/* 1 when a verb of the language's predicate lists stands in an inflected form ("restores",
   "created", "gives"): a finite verb, so the words around it form a clause. */
static int gr__has_inflected_verb(gr__ctx *c, const gr__sent *s) {
    const gr__rubric *R = &c->R;
    const int kinds[] = {R->L.pred, R->L.amb_verb, R->L.weak_pred};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (int i = 0; i < s->ncm[kinds[k]]; i++)
            for (int t = s->cm[kinds[k]][i].start; t < s->cm[kinds[k]][i].end; t++) {
                const gr__tok *w = &s->tok[t];
                if (w->kind == GR__T_WORD && w->stem != NULL && strcmp(w->stem, w->s) != 0)
                    return 1;
            }
    return 0;
}

/* 1 when a verb of the predicate lists stands in its third-person form ("shards", "runs",
   "gets"): a finite verb, so the words around it are a clause. Participles ("strided", "sorted")
   do not count: in a row of keywords they are adjectives. */
static int gr__has_finite_verb(gr__ctx *c, const gr__sent *s) {
    const gr__rubric *R = &c->R;
    const int kinds[] = {R->L.pred, R->L.weak_pred};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (int i = 0; i < s->ncm[kinds[k]]; i++)
            for (int t = s->cm[kinds[k]][i].start; t < s->cm[kinds[k]][i].end; t++) {
                const gr__tok *w = &s->tok[t];
                /* a Chinese verb does not inflect: in a line of mixed terms ("按 head 切",
                   "all-gather 成 [64, 1024]") it is the predicate all the same */
                if (w->kind == GR__T_CJK && kinds[k] == R->L.pred) return 1;
                if (w->kind != GR__T_WORD || w->stem == NULL) continue;
                size_t ls = strlen(w->stem), lw = strlen(w->s);
                if (lw > ls && lw <= ls + 2 && w->s[lw - 1] == 's' && strncmp(w->s, w->stem, ls) == 0)
                    return 1;
            }
    return 0;
}

/* A keyword list, not a statement: many distinct lexicon concepts that cover most of its
   words, and hardly any function words ("the", "of", "is", "的", "了") between them. A real
   technical sentence is dense in terms too, but its function words hold it together. */
static int gr__is_term_list(gr__ctx *c, const gr__sent *s) {
    const gr__rubric *R = &c->R;
    int content = 0, covered = 0, distinct = 0, function = 0;
    uint8_t *cov = (uint8_t *)gr__alloc(c, (size_t)s->ntok + 1);
    for (int k = 0; k < R->nconcepts; k++) {
        if (!R->concepts[k].lexical || s->ncm[k] == 0) continue;
        distinct++;
        for (int i = 0; i < s->ncm[k]; i++)
            for (int t = s->cm[k][i].start; t < s->cm[k][i].end; t++)
                cov[t] = 1;
    }
    for (int i = 0; i < s->ncm[R->L.function_words]; i++)
        for (int t = s->cm[R->L.function_words][i].start; t < s->cm[R->L.function_words][i].end; t++)
            cov[t] |= 2;
    for (int t = 0; t < s->ntok; t++) {
        const gr__tok *k = &s->tok[t];
        if (cov[t] & 2) { /* a function word, however short */
            function++;
            continue;
        }
        /* numbers, one-letter names and formulas say nothing about the prose around them */
        if (k->kind == GR__T_SYM || k->kind == GR__T_NUM || (k->kind == GR__T_WORD && k->len < 2))
            continue;
        content++;
        covered += (cov[t] & 1) != 0;
    }
    content += function;
    if (s->cjk >= 8) {
        /* Chinese prose has no spaces between its words; keywords separated by spaces
           ("所有进程 创建 相同顺序 配对") do */
        int gaps = 0;
        for (int t = 0; t + 1 < s->ntok; t++)
            if (s->tok[t].kind == GR__T_CJK && s->tok[t + 1].kind == GR__T_CJK &&
                s->tok[t + 1].start > s->tok[t].start + s->tok[t].len)
                gaps++;
        /* ... but prose that has its particles (的, 是, 在) is a sentence however dense */
        return distinct >= R->rules.list_min_concepts && gaps >= 3 && function < 2;
    }
    /* a verb in a finite form ("shards", "runs", "gets") makes terse prose a clause: an
       expert's one-line answer is dense in terms and light in articles, yet says something */
    if (gr__has_finite_verb(c, s)) return 0;
    /* a line without a single function word or inflected verb ("save before forward restore
       recompute snapshot RNG states backward") has no clause structure: bare nouns and verbs
       in a row are a keyword list however short */
    int min_words = (int)R->rules.list_min_words;
    if (function == 0 && !gr__has_inflected_verb(c, s) && R->rules.list_bare_min_words < min_words)
        min_words = (int)R->rules.list_bare_min_words;
    return distinct >= R->rules.list_min_concepts && content >= min_words &&
           (double)covered / content >= R->rules.list_coverage &&
           (double)function / content < R->rules.list_function_ratio;
}

/* A word that is a noun as often as a verb ("hang", "mismatch", "call") is a verb only after
   a subject (a pronoun, or a plural noun that is not a function word: "ranks hang") or when
   it opens the sentence (an imperative: "Log every creation"). */
static int gr__subject_before(gr__ctx *c, const gr__sent *s) {
    const gr__rubric *R = &c->R;
    static const char *const pronouns[] = {"they", "we", "you", "i", "it", "which", "that", "who",
                                           "he", "she", "everything", "nothing", NULL};
    for (int i = 0; i < s->ncm[R->L.amb_verb]; i++) {
        int t = s->cm[R->L.amb_verb][i].start;
        if (t == 0) { /* an imperative ("Hash the plan"); a list item's first word is a label */
            if (s->in_list) continue;
            for (int j = 0; j < s->ncm[R->L.function_words]; j++)
                if (s->cm[R->L.function_words][j].start == s->cm[R->L.amb_verb][i].end) return 1;
            continue;
        }
        const gr__tok *p = &s->tok[t - 1];
        if (p->kind != GR__T_WORD || p->ident) continue;
        for (int k = 0; pronouns[k] != NULL; k++)
            if (strcmp(p->s, pronouns[k]) == 0) return 1;
        int fw = 0;
        for (int j = 0; j < s->ncm[R->L.function_words] && !fw; j++)
            fw = s->cm[R->L.function_words][j].start == t - 1;
        if (!fw && p->len > 3 && p->s[p->len - 1] == 's' && p->s[p->len - 2] != 's') return 1;
    }
    return 0;
}

/* Matches of a predicate list that stand as verbs: not right after an article or a possessive
   ("the sorted rank list", "its run") and not the first half of a hyphenated compound
   ("output-layer grads", "start-up check"). */
static int gr__verbs(gr__ctx *c, const gr__sent *s, int k) {
    static const char *const determiners[] = {"the", "a", "an", "its", "their", "our", "your",
                                              "my", "his", "her", NULL};
    int n = 0;
    for (int i = 0; i < s->ncm[k]; i++) {
        const gr__match *m = &s->cm[k][i];
        const gr__tok *last = &s->tok[m->end - 1];
        if (last->kind == GR__T_WORD && s->norm[last->start + last->len] == '-' &&
            isalpha((unsigned char)s->norm[last->start + last->len + 1]))
            continue;
        int det = 0;
        if (m->start > 0 && s->tok[m->start - 1].kind == GR__T_WORD)
            for (int d = 0; determiners[d] != NULL && !det; d++)
                det = strcmp(s->tok[m->start - 1].s, determiners[d]) == 0;
        if (!det) n++;
    }
    (void)c;
    return n;
}

/* Concepts, clauses, polarity, predicate and back-reference of one sentence. */
static void gr__analyse(gr__ctx *c, gr__sent *s) {
    const gr__rubric *R = &c->R;
    s->norm = gr__normalize(c, s->raw, strlen(s->raw));
    s->tok = gr__tokenize(c, s->norm, 0, &s->ntok);
    size_t nt = (size_t)s->ntok + 1;
    s->wpos = (double *)gr__alloc(c, sizeof(double) * nt);
    s->clause = (int *)gr__alloc(c, sizeof(int) * nt);
    s->negd = (int *)gr__alloc(c, sizeof(int) * nt);
    s->frame = (uint8_t *)gr__alloc(c, nt);
    s->hyp = (uint8_t *)gr__alloc(c, nt);
    double w = 0;
    for (int i = 0; i < s->ntok; i++) {
        s->wpos[i] = w;
        w += gr__tok_weight(&s->tok[i]);
        if (s->tok[i].kind == GR__T_WORD || s->tok[i].kind == GR__T_NUM)
            s->words++;
        else if (s->tok[i].kind == GR__T_CJK)
            s->cjk++;
    }
    s->wpos[s->ntok] = w;
    size_t rl = strlen(s->raw);
    s->question = rl > 0 && (s->raw[rl - 1] == '?' ||
                             (rl >= 3 && memcmp(s->raw + rl - 3, "\xEF\xBC\x9F", 3) == 0));
    s->cm = (gr__match **)gr__alloc(c, sizeof(gr__match *) * (size_t)R->nconcepts);
    s->ncm = (int *)gr__alloc(c, sizeof(int) * (size_t)R->nconcepts);
    if (s->ntok > (int)R->rules.max_sentence_tokens) {
        s->ignored = GR__IGN_LONG;
        return;
    }
    for (int k = 0; k < R->nconcepts; k++)
        gr__find_concept(c, s, k);
    gr__clauses(c, s);
    s->void_clause = (uint8_t *)gr__alloc(c, (size_t)s->nclause + 1);
    gr__polarity(c, s);
    gr__match_attributes(c, s);
    /* weak predicates (Chinese adjectives used as predicates: 相邻, 一致) count in prose, not
       in a bullet, where they usually head a noun phrase */
    s->has_pred = gr__verbs(c, s, R->L.pred) > 0 || (!s->in_list && gr__verbs(c, s, R->L.weak_pred) > 0) ||
                  gr__subject_before(c, s);
    for (int i = 0; i < s->ncm[R->L.anaphor]; i++)
        if (s->wpos[s->cm[R->L.anaphor][i].start] < R->rules.anaphor_reach) s->anaphor = 1;
}

/* Bigrams of content tokens (word stems, numbers, CJK characters) for the duplicate check. */
static int gr__shingles(gr__ctx *c, const gr__sent *s, uint64_t **out) {
    int n = 0;
    gr__tok **ct = gr__content_tokens(c, s->tok, s->ntok, &n);
    uint64_t *h = (uint64_t *)gr__alloc(c, sizeof(uint64_t) * (size_t)(n + 1));
    int k = 0;
    for (int i = 0; i + 1 < n || (n == 1 && i == 0); i++) {
        const char *a = ct[i]->stem != NULL ? ct[i]->stem : ct[i]->s;
        uint64_t x = gr__fnv1a(a, strlen(a), 0xcbf29ce484222325ULL);
        if (i + 1 < n) {
            const char *b = ct[i + 1]->stem != NULL ? ct[i + 1]->stem : ct[i + 1]->s;
            x = gr__fnv1a("\x1f", 1, x);
            x = gr__fnv1a(b, strlen(b), x);
        }
        int dup = 0;
        for (int j = 0; j < k && !dup; j++)
            dup = h[j] == x;
        if (!dup) h[k++] = x;
    }
    *out = h;
    return k;
}

static double gr__jaccard(const uint64_t *a, int na, const uint64_t *b, int nb) {
    if (na == 0 || nb == 0) return 0;
    int inter = 0;
    for (int i = 0; i < na; i++)
        for (int j = 0; j < nb; j++)
            if (a[i] == b[j]) {
                inter++;
                break;
            }
    return (double)inter / (double)(na + nb - inter);
}

/* A sentence that mostly restates the prompt of its box: most of its words lie in 4-word runs
   of that box's question ("It maps a global rank to its rank inside each group"). */
static int gr__is_copy(gr__ctx *c, gr__sent *s) {
    int n = 0;
    gr__tok **ct = gr__content_tokens(c, s->tok, s->ntok, &n);
    /* the prompt of the box it stands in (a box the rubric does not know: any prompt) */
    uint64_t want = GR__ALL_BOXES | (s->box >= 0 && s->box < 62 ? (uint64_t)1 << s->box : ~(uint64_t)0);
    /* words: two CJK characters make about one word, as in the sentence lengths */
    double words = 0;
    for (int i = 0; i < n; i++)
        words += gr__tok_weight(ct[i]);
    if (words >= c->R.rules.need_copy_words) want |= GR__RUBRIC_TEXT;
    if (n < 3) return 0;
    if (n < 4) return (gr__ngram_has(c, gr__ngram_hash(ct, n)) & want) != 0;
    uint8_t *cov = (uint8_t *)gr__alloc(c, (size_t)n);
    for (int i = 0; i + 4 <= n; i++)
        if (gr__ngram_has(c, gr__ngram_hash(ct + i, 4)) & want)
            for (int k = 0; k < 4; k++)
                cov[i + k] = 1;
    int covered = 0;
    for (int i = 0; i < n; i++)
        covered += cov[i];
    return (double)covered >= c->R.rules.copy_overlap * n;
}

/* Analyses every sentence, then decides which ones cannot earn anything and why. */
static void gr__analyse_sheet(gr__ctx *c) {
    gr__sheet *S = &c->S;
    const gr__rubric *R = &c->R;
    uint64_t **sh = (uint64_t **)gr__alloc(c, sizeof(uint64_t *) * (size_t)(S->nsent + 1));
    int *nsh = (int *)gr__alloc(c, sizeof(int) * (size_t)(S->nsent + 1));
    for (int i = 0; i < S->nsent; i++) {
        gr__sent *s = &S->sent[i];
        gr__analyse(c, s);
        if (s->ignored) continue;
        if (s->box >= 0 && !R->box[s->box].graded) {
            s->ignored = GR__IGN_UNGRADED;
        } else if (gr__is_copy(c, s)) {
            s->ignored = GR__IGN_COPY;
        } else {
            nsh[i] = gr__shingles(c, s, &sh[i]);
            for (int j = 0; j < i && !s->ignored; j++) {
                if (S->sent[j].ignored || nsh[j] == 0 || nsh[i] < 2) continue;
                if (gr__jaccard(sh[i], nsh[i], sh[j], nsh[j]) >= R->rules.dedup_similarity) {
                    s->ignored = GR__IGN_DUP;
                    s->dup_of = S->sent[j].line;
                }
            }
        }
        if (!s->ignored && gr__is_term_list(c, s)) s->ignored = GR__IGN_LIST;
    }
    /* A paragraph made of very short sentences that are nothing but rubric terms ("Every rank
       new_group. Same order collective. Hang deadlock Experiment B.") is keyword stuffing. */
    for (int i = 0; i < S->nsent;) {
        int j = i, n = 0, stuffed = 0;
        while (j < S->nsent && S->sent[j].para == S->sent[i].para)
            j++;
        for (int k = i; k < j; k++) {
            const gr__sent *x = &S->sent[k];
            if (x->ignored == GR__IGN_LONG) continue;
            n++;
            stuffed += x->words + x->cjk / 2.0 <= R->rules.short_sentence_words - 2 &&
                       gr__concept_coverage(c, x) >= R->rules.list_coverage + 0.15;
        }
        if (stuffed >= 3 && stuffed * 2 >= n)
            for (int k = i; k < j; k++)
                if (!S->sent[k].ignored) S->sent[k].ignored = GR__IGN_LIST;
        i = j;
    }
    /* "This is wrong." denies the sentence before it; then it is done. */
    for (int i = 1; i < S->nsent; i++) {
        gr__sent *s = &S->sent[i];
        if (s->ignored == GR__IGN_LONG || s->ncm[R->L.deny_post] == 0) continue;
        int content = 0;
        gr__content_tokens(c, s->tok, s->ntok, &content);
        if (content > R->rules.post_frame_sentence_tokens) continue;
        gr__sent *p = &S->sent[i - 1];
        if (p->ignored == GR__IGN_LONG) continue;
        p->denied_by_next = 1;
        for (int t = 0; t < p->ntok; t++)
            p->frame[t] = 1;
        gr__match_attributes(c, p);
    }
    /* A bullet without a verb states nothing (a noun phrase, keywords); in prose a terse
       phrase without a verb still counts when function words hold it together ("new_group on
       all ranks, same order, members or not"), but not a row of keywords ("Same order
       collective."). */
    for (int i = 0; i < S->nsent; i++) {
        gr__sent *s = &S->sent[i];
        if (s->ignored || s->has_pred) continue;
        if (s->in_list || gr__function_ratio(c, s) < R->rules.list_function_ratio)
            s->ignored = GR__IGN_FRAGMENT;
    }
}

// ---------------------------------------------------------------------------------------------
// >>relations

/* How a relation stands in a sentence. */
enum { GR__REL_NONE, GR__REL_ASSERTED, GR__REL_DENIED, GR__REL_HYPO };
static const char *const gr__rel_form[] = {"", "stated", "stated only as denied",
                                           "stated only as a condition or question"};

/* Search modes: the slots' own polarity and antecedent needs, polarity relaxed, both relaxed;
   a double negation (a slot of the wrong polarity only inside a denial frame, at least one). */
enum { GR__SEARCH_STRICT, GR__SEARCH_ANY_POL, GR__SEARCH_ANY, GR__SEARCH_DOUBLE_NEG };

/* A unit to search: one sentence (a == NULL) or a sentence b that refers back to a. */
typedef struct gr__unit {
    const gr__sent *a, *b;
} gr__unit;

typedef struct gr__cand {
    const gr__match *m;
    int part; /* 0: the earlier sentence a, 1: the sentence b */
} gr__cand;

typedef struct gr__search {
    const gr__rel *r;
    int lang_prep; /* the prepositions concept */
    gr__unit u;
    gr__cand *cand[GR__MAX_SLOTS];
    int ncand[GR__MAX_SLOTS];
    gr__cand chosen[GR__MAX_SLOTS];
    int budget;
    int mode;
    int unless; /* an `unless` concept stands in the unit: check the parts the match spans */
} gr__search;


static const gr__sent *gr__unit_part(const gr__unit *u, int part) {
    return part == 0 ? u->a : u->b;
}

/* Which part of its sentence token t stands in: semicolons join independent statements into
   one sentence ("B failed only because of the shim; with NCCL only members create groups"). */
static int gr__semi_part(const gr__sent *s, int t) {
    int part = 0;
    for (int i = 0; i < t && i < s->ntok; i++)
        part += s->tok[i].barrier && s->tok[i].s[0] == ';';
    return part;
}

/* 1 when an `unless` concept of r stands in a semicolon part of the unit that the chosen
   matches touch. */
static int gr__unless_near(const gr__search *q) {
    const gr__rel *r = q->r;
    for (int p = 0; p < 2; p++) {
        const gr__sent *s = gr__unit_part(&q->u, p);
        if (s == NULL) continue;
        for (int k = 0; k < r->nunless; k++)
            for (int i = 0; i < s->ncm[r->unless[k]]; i++) {
                int up = gr__semi_part(s, s->cm[r->unless[k]][i].start);
                for (int j = 0; j < r->nslot; j++)
                    if (q->chosen[j].part == p && gr__semi_part(s, q->chosen[j].m->start) == up)
                        return 1;
            }
    }
    return 0;
}

/* 1 when m has the polarity slot sl needs. */
static int gr__pol_ok(const gr__slot *sl, const gr__match *m) {
    if (sl->pol == GR__POL_ASSERTED && m->neg) return 0;
    if (sl->pol == GR__POL_NEGATED && !m->neg) return 0;
    return 1;
}

static int gr__slot_ok(const gr__slot *sl, const gr__match *m, int mode, int framed_ok) {
    if (!framed_ok && m->framed) return 0;
    if (mode != GR__SEARCH_ANY) {
        if (sl->hyp == GR__HYP_NO && m->hyp) return 0;
        if (sl->hyp == GR__HYP_ONLY && !m->hyp) return 0;
    }
    if (mode == GR__SEARCH_STRICT) return gr__pol_ok(sl, m);
    /* a negation counts twice only inside the frame that denies it */
    if (mode == GR__SEARCH_DOUBLE_NEG) return gr__pol_ok(sl, m) || m->framed;
    return 1;
}

/* The doer of a verb stands before it and is not the object of a preposition: in "the model
   reads the ranks from parallel state and decides ...", parallel state decides nothing. */
static int gr__is_agent(const gr__search *q, const gr__cand *doer, const gr__cand *verb) {
    if (doer->part != verb->part) return doer->part < verb->part;
    if (doer->m->start >= verb->m->start) return 0;
    const gr__sent *s = gr__unit_part(&q->u, doer->part);
    for (int i = 0; i < s->ncm[q->lang_prep]; i++) {
        const gr__match *p = &s->cm[q->lang_prep][i];
        if (p->end <= doer->m->start && doer->m->start - p->end <= 1) return 0;
    }
    return 1;
}

static int gr__dfs(gr__search *q, int slot) {
    const gr__rel *r = q->r;
    if (slot == r->nslot) {
        int in_a = 0, in_b = 0;
        double lo = 1e30, hi = -1e30;
        for (int i = 0; i < r->nslot; i++) {
            const gr__cand *x = &q->chosen[i];
            if (x->part == 0) {
                in_a = 1;
                continue;
            }
            in_b = 1;
            const gr__sent *s = q->u.b;
            if (s->wpos[x->m->start] < lo) lo = s->wpos[x->m->start];
            double e = s->wpos[x->m->end - 1];
            if (e > hi) hi = e;
        }
        if (q->u.a != NULL && !(in_a && in_b)) return 0; /* a plain match is found without a */
        /* the window spaces the slots; a lone slot's phrase may be longer than it */
        if (r->window > 0 && r->nslot > 1 && in_b && hi - lo > r->window + 1e-9) return 0;
        if (r->agent >= 0 && !gr__is_agent(q, &q->chosen[r->agent], &q->chosen[r->verb]))
            return 0;
        if (q->unless && gr__unless_near(q)) return 0;
        if (q->mode == GR__SEARCH_DOUBLE_NEG) {
            int flipped = 0;
            for (int i = 0; i < r->nslot; i++)
                flipped += !gr__pol_ok(&r->slot[i], q->chosen[i].m);
            if (flipped == 0) return 0;
        }
        return 1;
    }
    for (int i = 0; i < q->ncand[slot]; i++) {
        if (--q->budget < 0) return 0;
        const gr__cand *x = &q->cand[slot][i];
        int bad = 0;
        for (int j = 0; j < slot && !bad; j++) {
            const gr__cand *y = &q->chosen[j];
            if (y->part == x->part && gr__overlaps(y->m, x->m)) bad = 1;
            if (r->clause && (y->part != x->part || y->m->prop != x->m->prop)) bad = 1;
        }
        if (!bad && r->ordered && slot > 0) {
            const gr__cand *p = &q->chosen[slot - 1];
            bad = p->part > x->part || (p->part == x->part && x->m->start < p->m->end);
        }
        if (bad) continue;
        q->chosen[slot] = *x;
        if (gr__dfs(q, slot + 1)) return 1;
    }
    return 0;
}

/* Searches r in u; void clauses are skipped when skip_void. Returns 1 and the chosen matches
   in q->chosen when found. */
static int gr__search_rel(gr__ctx *c, gr__search *q, const gr__rel *r, gr__unit u, int mode,
                          int framed_ok, int skip_void) {
    memset(q, 0, sizeof *q);
    q->r = r;
    q->u = u;
    q->lang_prep = c->R.L.prepositions;
    q->budget = GR__SEARCH_BUDGET;
    q->mode = mode;
    int any_unless = 0;
    for (int p = 0; p < 2; p++) {
        const gr__sent *s = gr__unit_part(&u, p);
        if (s == NULL) continue;
        for (int k = 0; k < r->nunless; k++)
            any_unless |= s->ncm[r->unless[k]] > 0;
    }
    q->unless = any_unless;
    for (int sl = 0; sl < r->nslot; sl++) {
        const gr__slot *slot = &r->slot[sl];
        int n = 0;
        q->cand[sl] = (gr__cand *)gr__alloc(c, sizeof(gr__cand) * GR__MAX_CANDIDATES);
        for (int p = 1; p >= 0; p--) { /* the sentence itself first */
            const gr__sent *s = gr__unit_part(&u, p);
            if (s == NULL) continue;
            for (int k = 0; k < slot->n; k++) {
                int ci = slot->concepts[k];
                for (int i = 0; i < s->ncm[ci] && n < GR__MAX_CANDIDATES; i++) {
                    const gr__match *m = &s->cm[ci][i];
                    if (!gr__slot_ok(slot, m, mode, framed_ok)) continue;
                    if (skip_void && s->void_clause != NULL && s->void_clause[m->clause]) continue;
                    q->cand[sl][n].m = m;
                    q->cand[sl][n].part = p;
                    n++;
                }
            }
        }
        if (n == 0) return 0;
        q->ncand[sl] = n;
    }
    return gr__dfs(q, 0);
}

/* How r stands in u: stated, stated only as denied, only as a condition, or not at all.
   Plain negations are checked slot by slot against what each slot needs; a denial frame
   ("it is not true that ...") negates the whole relation once: a relation stated inside it
   is denied, and a relation denied inside it is stated (a double negation), but only when
   every slot of the wrong polarity stands inside the frame: a frame in one sentence and a
   negation in the next deny two things. */
static int gr__rel_form_in(gr__ctx *c, gr__search *q, const gr__rel *r, gr__unit u,
                           int skip_void) {
    if (u.a != NULL && !r->backref) return GR__REL_NONE;
    if (u.a != NULL && r->clause) return GR__REL_NONE;
    if (gr__search_rel(c, q, r, u, GR__SEARCH_STRICT, 0, skip_void)) return GR__REL_ASSERTED;
    if (gr__search_rel(c, q, r, u, GR__SEARCH_STRICT, 1, skip_void)) return GR__REL_DENIED;
    if (gr__search_rel(c, q, r, u, GR__SEARCH_ANY_POL, 0, skip_void)) return GR__REL_DENIED;
    if (gr__search_rel(c, q, r, u, GR__SEARCH_DOUBLE_NEG, 1, skip_void)) return GR__REL_ASSERTED;
    if (gr__search_rel(c, q, r, u, GR__SEARCH_ANY_POL, 1, skip_void)) return GR__REL_DENIED;
    if (gr__search_rel(c, q, r, u, GR__SEARCH_ANY, 1, skip_void)) return GR__REL_HYPO;
    return GR__REL_NONE;
}

// ---------------------------------------------------------------------------------------------
// >>scoring

static gr__item *gr__new_item(gr__ctx *c, const char *id, int ritem, const char *kind,
                              const char *tag, int part, double max) {
    gr__item *it = GR__PUSH(c, c->items, c->nitems, c->capitems);
    memset(it, 0, sizeof *it);
    snprintf(it->id, sizeof it->id, "%s", id);
    if (ritem >= 0) snprintf(it->ritem, sizeof it->ritem, "%s", c->R.item[ritem].id);
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

static int gr__num_matches(double quoted, int decimals, double measured) {
    if (decimals == 0) return fabs(quoted - measured) < 1e-9;
    /* half a unit of the last digit written, with a relative margin for the binary value
       (not an absolute one: 3.8e-09 is written to 10 decimals) */
    return fabs(quoted - measured) <= 0.5 * pow(10.0, -decimals) * (1 + 1e-6) + 1e-15;
}

/* "line 14 "TP ranks are ..."" or, for a back-reference, "lines 13-14 ...". */
static char *gr__where(gr__ctx *c, const gr__sent *a, const gr__sent *b) {
    gr__sb w = {0};
    if (a != NULL)
        gr__sb_printf(c, &w, "lines %d-%d %s %s", a->line, b->line, gr__excerpt(c, a->raw),
                      gr__excerpt(c, b->raw));
    else
        gr__sb_printf(c, &w, "line %d %s", b->line, gr__excerpt(c, b->raw));
    return w.s;
}

static int gr__sent_index(const gr__ctx *c, const gr__sent *s) { return (int)(s - c->S.sent); }

static int gr__variant_active(const gr__ctx *c, const cJSON *variants) {
    return variants == NULL || gr__json_has_string(variants, c->variant);
}

/* The sentence before s when s continues it: s refers back to it ("Their members are ..."),
   or both are short sentences of one paragraph. Both must be usable. */
static const gr__sent *gr__antecedent(const gr__ctx *c, const gr__sent *s) {
    int i = gr__sent_index(c, s);
    if (i == 0) return NULL;
    const gr__sent *p = &c->S.sent[i - 1];
    if (p->ignored || p->box != s->box) return NULL;
    if (s->anaphor) return p;
    /* a chain of short sentences carries one thought ("The sizes match. The numbers are
       wrong.") */
    double lim = c->R.rules.short_sentence_words;
    if (p->para == s->para && s->words + s->cjk / 2.0 <= lim && p->words + p->cjk / 2.0 <= lim)
        return p;
    return NULL;
}

static int gr__box_listed(const gr__ctx *c, const cJSON *ids, int box) {
    if (box < 0) return 0;
    return gr__json_has_string(ids, c->R.box[box].id);
}

/* ---- misconceptions ---- */

typedef struct gr__mcstate {
    int fired;
    const gr__sent *a, *b;
    const char *rule;
    gr__sb why;
} gr__mcstate;

/* The match of slot sl nearest to token t in the same clause: before it within the bind
   distance first, else after it. NULL when none. */
static const gr__match *gr__near_slot(gr__ctx *c, const gr__sent *s, const gr__slot *sl, int t,
                                      int mode) {
    const gr__match *best = NULL;
    double bestd = 1e30;
    double maxd = c->R.rules.bind_distance;
    int tc = t < s->ntok ? s->clause[t] : s->nclause - 1;
    for (int pass = 0; pass < 2 && best == NULL; pass++)
        for (int k = 0; k < sl->n; k++) {
            int ci = sl->concepts[k];
            for (int i = 0; i < s->ncm[ci]; i++) {
                const gr__match *m = &s->cm[ci][i];
                if (m->clause != tc || !gr__slot_ok(sl, m, mode, 0)) continue;
                double d;
                if (pass == 0) {
                    if (m->end > t) continue;
                    d = s->wpos[t] - s->wpos[m->end];
                } else {
                    if (m->start < t) continue;
                    d = s->wpos[m->start] - s->wpos[t];
                }
                if (d <= maxd && d < bestd) {
                    bestd = d;
                    best = m;
                }
            }
        }
    return best;
}

/* A bracket right after a name is an index ("embedding[0]", "pp[1]"), not a list of ranks. */
static int gr__is_index(const char *norm, size_t at) {
    if (at == 0) return 0;
    unsigned char p = (unsigned char)norm[at - 1];
    return isalnum(p) || p == '_' || p == ']' || p == ')';
}

/* "rank 5" (or "rank5", "rank 5的") named in the clause of token t; -1 if none. */
/* 1 when token i lies in a match of a lexicon concept ("TP" in "TP rank 1"). */
static int gr__in_concept(const gr__ctx *c, const gr__sent *s, int i) {
    for (int k = 0; k < c->R.nconcepts; k++) {
        if (!c->R.concepts[k].lexical) continue;
        for (int j = 0; j < s->ncm[k]; j++)
            if (s->cm[k][j].start <= i && i < s->cm[k][j].end) return 1;
    }
    return 0;
}

static int gr__rank_named(const gr__ctx *c, const gr__sent *s, int t) {
    int tc = t < s->ntok ? s->clause[t] : -1;
    for (int i = 0; i + 1 < s->ntok; i++) {
        if (s->clause[i] != tc) continue;
        /* "TP rank 1", "local rank 0": a coordinate inside a group, not a rank of the world */
        if (i > 0 && s->tok[i - 1].kind == GR__T_WORD && strcmp(s->tok[i - 1].s, "global") != 0 &&
            gr__in_concept(c, s, i - 1))
            continue;
        /* "rank 5", not the piece of an identifier ("tp_rank 1" gives a coordinate) */
        if (s->tok[i].kind == GR__T_WORD && !s->tok[i].ident && strcmp(s->tok[i].s, "rank") == 0 &&
            s->tok[i + 1].kind == GR__T_NUM)
            return atoi(s->tok[i + 1].s);
    }
    return -1;
}

/* 1 when the list (canonical "[5,7]" or nested) is one of the measured groups at path, or the
   measured groups themselves. */
static int gr__list_is_measured(gr__ctx *c, const gr__blist *l, const cJSON *groups) {
    if (!cJSON_IsArray(groups)) return 0;
    char *whole = gr__json_canon(c, groups);
    if (whole != NULL && strcmp(whole, l->canon) == 0) return 1;
    if (l->nested) return 0;
    const cJSON *g;
    cJSON_ArrayForEach(g, groups) {
        char *one = gr__json_canon(c, g);
        if (one != NULL && strcmp(one, l->canon) == 0) return 1;
    }
    return 0;
}

static int gr__list_has(const gr__blist *l, int rank) {
    char want[24];
    snprintf(want, sizeof want, "%d", rank);
    for (int k = 0; k < l->ninner; k++) {
        const char *p = l->inner[k] + 1; /* "[a,b,c]" */
        while (*p != '\0' && *p != ']') {
            size_t n = strspn(p, "0123456789");
            if (n == strlen(want) && strncmp(p, want, n) == 0) return 1;
            p += n;
            if (*p == ',') p++;
            else if (*p != ']') break;
        }
    }
    return 0;
}

/* 1 when the word right before token t is a noun that a list can belong to, other than
   ranks, groups or members: a content word that no language rule knows ("layers [0]",
   "shape [128,64]"), so the list is that noun's, not a group's. */
static int gr__list_follows_other_noun(gr__ctx *c, const gr__sent *s, int t) {
    const gr__rubric *R = &c->R;
    if (t <= 0 || t > s->ntok) return 0;
    const gr__tok *p = &s->tok[t - 1];
    if (p->kind != GR__T_WORD || p->barrier) return 0;
    const char *w = p->stem != NULL ? p->stem : p->s;
    static const char *const owners[] = {"rank", "group", "member", "list", "set", "process",
                                         NULL};
    for (int i = 0; owners[i] != NULL; i++)
        if (strncmp(w, owners[i], strlen(owners[i])) == 0) return 0;
    const int lang[] = {R->L.function_words, R->L.pred, R->L.amb_verb, R->L.prepositions,
                        R->L.auxiliaries, R->L.weak_pred, R->L.neg};
    for (size_t k = 0; k < sizeof lang / sizeof lang[0]; k++)
        for (int i = 0; i < s->ncm[lang[k]]; i++)
            if (s->cm[lang[k]][i].start <= t - 1 && t - 1 < s->cm[lang[k]][i].end) return 0;
    return 1;
}

/* The largest number in a JSON tree of numbers; -1 when there is none. */
static long gr__json_max(const cJSON *j) {
    if (cJSON_IsNumber(j)) return (long)j->valuedouble;
    long best = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, j) {
        long v = gr__json_max(e);
        if (v > best) best = v;
    }
    return best;
}

/* A bracketed list the sentence attributes to a group kind that the run did not measure for
   that kind ("the DP groups are [0,1] ..."). */
static int gr__wrong_group_claim(gr__ctx *c, gr__sent *s, const gr__misc *m, gr__sb *why,
                                 int *clause_out) {
    /* a sentence (or a paragraph) about a deliberate mismatch quotes wrong lists on purpose */
    for (int i = gr__sent_index(c, s); i >= 0 && c->S.sent[i].para == s->para; i--)
        for (int k = 0; k < m->nclaims_unless; k++)
            if (c->S.sent[i].ncm[m->claims_unless[k]] > 0) return 0;
    gr__blist *lists = NULL;
    gr__num *nums = NULL;
    int nl = 0, lc = 0, nn = 0, nc = 0;
    gr__extract_values(c, s->norm, &lists, &nl, &lc, &nums, &nn, &nc);
    for (int li = 0; li < nl; li++) {
        int t = gr__tok_at(s, lists[li].start);
        if (gr__is_index(s->norm, lists[li].start)) continue;
        if (t < s->ntok && (s->hyp[t] || (s->negd[t] + s->frame[t]) % 2)) continue;
        /* the list is attributed to the kind named nearest to it ("tp_rank 1 in [6,7], dp_rank
           1 in [5,7]": [5,7] belongs to dp, however near tp stands too) */
        const cJSON *gc, *best = NULL;
        gr__slot best_kind;
        double bestd = 1e30;
        cJSON_ArrayForEach(gc, m->group_claims) {
            gr__slot kind;
            gr__parse_slot(c, gr__jstr(gc, "kind", "?"), &kind, GR__HYP_NO, m->id);
            const gr__match *km = gr__near_slot(c, s, &kind, t, GR__SEARCH_STRICT);
            if (km == NULL || gr__path(c->results, gr__jstr(gc, "groups", "")) == NULL) continue;
            double d = km->end <= t ? s->wpos[t] - s->wpos[km->end] : s->wpos[km->start] - s->wpos[t];
            if (km->end <= t) d -= 0.5; /* a kind before the list names it ("the TP group [0,1]") */
            if (d < bestd) {
                bestd = d;
                best = gc;
                best_kind = kind;
            }
        }
        if (best == NULL) continue;
        /* a kind named only after the list does not own a list that follows another noun
           ("rank 1 built layers [0] plus the embedding": [0] are layers) */
        if (bestd > 0 && gr__list_follows_other_noun(c, s, t)) continue;
        const cJSON *groups = gr__path(c->results, gr__jstr(best, "groups", ""));
        /* a number above every rank of the measured grid makes the list something else: a
           shape or a size ("word_embeddings 切成 [128,64]" on 8 ranks), not a group of it */
        if (gr__json_max(gr__parse_value(c, lists[li].canon)) > gr__json_max(groups)) continue;
        int rank = gr__rank_named(c, s, t);
        int ok = gr__list_is_measured(c, &lists[li], groups) &&
                 (rank < 0 || lists[li].nested || gr__list_has(&lists[li], rank));
        if (!ok) {
            gr__sb_printf(c, why, "%s was not measured as %s (measured: %s)", lists[li].canon,
                          best_kind.spec, gr__json_short(c, groups, 60));
            *clause_out = t < s->ntok ? s->clause[t] : 0;
            return 1;
        }
    }
    return 0;
}

static int gr__misc_may_fire(const gr__ctx *c, const gr__misc *m, const gr__sent *s) {
    return !s->ignored && !gr__box_listed(c, m->not_in_boxes, s->box);
}

/* 1 when misconception m applies to this run: it has no "when", or the measured fact at
   when.path equals when.equals, is one of when.in, or is none of when.not_in ("claims FP8
   ran here" applies only where FP8 was not exercised). A fact the results lack: it does not
   apply. */
static int gr__misc_applies(gr__ctx *c, const gr__misc *m) {
    if (m->when == NULL) return 1;
    const cJSON *v = gr__path(c->results, gr__jstr(m->when, "path", ""));
    if (v == NULL || cJSON_IsNull(v)) return 0;
    const cJSON *eq = cJSON_GetObjectItemCaseSensitive(m->when, "equals"), *e;
    if (eq != NULL) return gr__loose_eq(c, eq, v);
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(m->when, "in")) {
        if (gr__loose_eq(c, e, v)) return 1;
    }
    const cJSON *not_in = cJSON_GetObjectItemCaseSensitive(m->when, "not_in");
    if (not_in == NULL) return 0;
    cJSON_ArrayForEach(e, not_in) {
        if (gr__loose_eq(c, e, v)) return 0;
    }
    return 1;
}

/* Every asserted misconception voids the clauses that state it; each costs its penalty once,
   at its first statement. */
static void gr__detect_misconceptions(gr__ctx *c, gr__mcstate *mcs) {
    const gr__rubric *R = &c->R;
    for (int mi = 0; mi < R->nmisc; mi++) {
        const gr__misc *m = &R->misc[mi];
        if (!gr__misc_applies(c, m)) continue;
        for (int i = 0; i < c->S.nsent; i++) {
            gr__sent *s = &c->S.sent[i];
            if (!gr__misc_may_fire(c, m, s)) continue;
            for (int r = 0; r < m->nrel; r++) {
                gr__search q;
                gr__unit u = {NULL, s};
                if (gr__rel_form_in(c, &q, &m->rel[r], u, 0) != GR__REL_ASSERTED) continue;
                /* the whole sentence: its other clauses lean on the wrong statement */
                for (int cl = 0; cl < s->nclause; cl++)
                    s->void_clause[cl] = 1;
                if (!mcs[mi].fired) {
                    mcs[mi].fired = 1;
                    mcs[mi].b = s;
                    mcs[mi].rule = m->rel[r].text;
                }
                break;
            }
            int cl = 0;
            gr__sb why = {0};
            if (cJSON_GetArraySize(m->group_claims) > 0 && gr__wrong_group_claim(c, s, m, &why, &cl)) {
                for (int k = 0; k < s->nclause; k++)
                    s->void_clause[k] = 1;
                if (!mcs[mi].fired) {
                    mcs[mi].fired = 1;
                    mcs[mi].b = s;
                    mcs[mi].rule = "a group list attributed to the wrong kind";
                    gr__sb_add(c, &mcs[mi].why, gr__sb_str(&why));
                }
            }
        }
    }
}

/* ---- claims ---- */

typedef struct gr__ccand {
    int sent;   /* credited sentence */
    int in_box; /* it stands in a box of the claim's item */
    const gr__sent *a;
    const char *rule;
    int lo, hi; /* tokens [lo, hi) of the sentence the match spans; -1 when not known */
    const gr__match *hedge; /* the hedge that qualifies the match, or NULL */
} gr__ccand;

typedef struct gr__cstate {
    gr__ccand *cand;
    int ncand, capcand;
    int assigned; /* index into cand, -1 none */
    /* why nothing counted, for the explanation */
    const gr__sent *near_sent;
    const gr__sent *near_a;
    const char *near_why;
} gr__cstate;

static int gr__in_item_box(const gr__ctx *c, int item, const gr__sent *s) {
    return gr__box_listed(c, c->R.item[item].boxes, s->box);
}

static void gr__note_near(gr__ctx *c, gr__cstate *st, const gr__sent *a, const gr__sent *b,
                          const char *why) {
    if (st->near_sent != NULL) return;
    st->near_sent = b;
    st->near_a = a;
    st->near_why = gr__strdup(c, why);
}

/* The units a sentence offers: itself, and itself with the sentence it refers back to. */
static int gr__units_of(const gr__ctx *c, const gr__sent *s, gr__unit *u) {
    u[0].a = NULL;
    u[0].b = s;
    const gr__sent *p = gr__antecedent(c, s);
    if (p == NULL) return 1;
    u[1].a = p;
    u[1].b = s;
    return 2;
}

/* The tokens of the unit's own sentence that the chosen matches span, [lo, hi); -1 when every
   slot stands in the sentence referred back to. */
static void gr__match_span(const gr__search *q, int *lo, int *hi) {
    *lo = *hi = -1;
    for (int i = 0; i < q->r->nslot; i++) {
        const gr__cand *x = &q->chosen[i];
        if (x->part != 1) continue;
        if (*lo < 0 || x->m->start < *lo) *lo = x->m->start;
        if (x->m->end > *hi) *hi = x->m->end;
    }
}

/* A break that ends a hedge's reach inside a sentence: a colon or semicolon, or one of the
   language's hedge breaks, a contrast ("I think this is a common confusion, but it does not
   shard anything": the hedge is on the confusion, not on what follows "but"; 大概分这几块：...
   hedges only the lead-in). */
static int gr__hedge_break(const gr__ctx *c, const gr__sent *s, int from, int to) {
    for (int t = from; t < to && t < s->ntok; t++)
        if (gr__is_colon(&s->tok[t]) || gr__is_semicolon(&s->tok[t])) return 1;
    int k = c->R.L.hedge_breaks;
    for (int i = 0; i < s->ncm[k]; i++)
        if (s->cm[k][i].start >= from && s->cm[k][i].start < to) return 1;
    return 0;
}

/* 1 when hedge m, after a match that ends at token hi, stands in a later clause that says a
   thing of its own ("…提供并行层和 GPTModel，大概还有 optimizer 之类的东西": the hedge is on the
   optimizer, not on the layers); a bare comment ("…, I think.", "，大概吧") still hedges. */
static int gr__hedge_own_clause(const gr__sent *s, const gr__match *m, int hi) {
    if (hi <= 0 || s->clause[m->start] == s->clause[hi - 1]) return 0;
    double words = 0;
    for (int t = 0; t < s->ntok; t++) {
        if (s->clause[t] != s->clause[m->start] || (t >= m->start && t < m->end)) continue;
        words += gr__tok_weight(&s->tok[t]);
    }
    return words >= 3;
}

/* The hedge of sentence s that qualifies the tokens [lo, hi) a claim matched, or NULL: one in
   the same stretch of the sentence, with no colon, semicolon or contrast between them. */
static const gr__match *gr__hedge_over(const gr__ctx *c, const gr__sent *s, int lo, int hi) {
    int h = c->R.L.hedges;
    for (int i = 0; i < s->ncm[h]; i++) {
        const gr__match *m = &s->cm[h][i];
        if (lo < 0) return m;
        if (m->end <= lo && gr__hedge_break(c, s, m->end, lo)) continue;
        if (m->start >= hi && gr__hedge_break(c, s, hi, m->start)) continue;
        if (m->start >= hi && gr__hedge_own_clause(s, m, hi)) continue;
        return m;
    }
    return NULL;
}

/* A candidate's preference: 2 when no hedge qualifies it, +1 when it stands in its item's box. */
static int gr__cand_rank(const gr__ccand *x) { return 2 * (x->hedge == NULL) + x->in_box; }

static void gr__claim_candidates(gr__ctx *c, int ci, gr__cstate *st) {
    const gr__rubric *R = &c->R;
    const gr__claim *k = &R->claim[ci];
    st->assigned = -1;
    if (!gr__variant_active(c, k->variants)) return;
    for (int i = 0; i < c->S.nsent; i++) {
        gr__sent *s = &c->S.sent[i];
        gr__unit u[2];
        int nu = gr__units_of(c, s, u);
        int found = 0;
        for (int ui = 0; ui < nu && !found; ui++) {
            for (int r = 0; r < k->nrel && !found; r++) {
                gr__search q;
                const gr__rel *rel = &k->rel[r];
                if (s->ignored) {
                    if (s->ignored != GR__IGN_LONG && s->ignored != GR__IGN_UNGRADED &&
                        gr__rel_form_in(c, &q, rel, u[ui], 0) == GR__REL_ASSERTED) {
                        gr__sb w = {0};
                        gr__sb_printf(c, &w, "not counted: it %s", gr__ignore_reason[s->ignored]);
                        if (s->ignored == GR__IGN_DUP)
                            gr__sb_printf(c, &w, " (line %d)", s->dup_of);
                        gr__note_near(c, st, NULL, s, w.s);
                    }
                    continue;
                }
                int form = gr__rel_form_in(c, &q, rel, u[ui], 1);
                if (form == GR__REL_ASSERTED) {
                    gr__ccand *x = GR__PUSH(c, st->cand, st->ncand, st->capcand);
                    x->sent = i;
                    x->in_box = gr__in_item_box(c, k->item, s);
                    x->a = u[ui].a;
                    x->rule = rel->text;
                    gr__match_span(&q, &x->lo, &x->hi);
                    found = 1;
                } else if (form != GR__REL_NONE) {
                    gr__sb w = {0};
                    gr__sb_printf(c, &w, "%s (%s)", gr__rel_form[form], rel->text);
                    gr__note_near(c, st, u[ui].a, s, w.s);
                } else if (gr__rel_form_in(c, &q, rel, u[ui], 0) == GR__REL_ASSERTED) {
                    gr__note_near(c, st, u[ui].a, s,
                                  "not counted: the clause also states a misconception");
                }
            }
            /* the denial of a misconception states the idea too */
            for (int d = 0; d < k->ndenies && !found && ui == 0 && !s->ignored; d++) {
                const gr__misc *m = &R->misc[k->denies[d]];
                for (int r = 0; r < m->nrel && !found; r++) {
                    gr__search q;
                    if (gr__rel_form_in(c, &q, &m->rel[r], u[ui], 1) != GR__REL_DENIED) continue;
                    gr__ccand *x = GR__PUSH(c, st->cand, st->ncand, st->capcand);
                    x->sent = i;
                    x->in_box = gr__in_item_box(c, k->item, s);
                    x->a = NULL;
                    x->lo = x->hi = -1;
                    gr__sb w = {0};
                    gr__sb_printf(c, &w, "denies %s (%s)", m->id, m->rel[r].text);
                    x->rule = w.s;
                    found = 1;
                }
            }
        }
    }
    /* unhedged candidates first (an idea stated plainly anywhere is stated: it earns in full),
       then in-box ones, then sheet order (stable) */
    int h = R->L.hedges;
    for (int i = 0; i < st->ncand; i++) {
        gr__ccand *x = &st->cand[i];
        x->hedge = gr__hedge_over(c, &c->S.sent[x->sent], x->lo, x->hi);
        if (x->hedge == NULL && x->a != NULL && x->a->ncm[h] > 0) x->hedge = &x->a->cm[h][0];
    }
    for (int i = 1; i < st->ncand; i++)
        for (int j = i; j > 0 && gr__cand_rank(&st->cand[j]) > gr__cand_rank(&st->cand[j - 1]); j--) {
            gr__ccand t = st->cand[j];
            st->cand[j] = st->cand[j - 1];
            st->cand[j - 1] = t;
        }
}

/* Sentences hold at most max_claims_per_sentence ideas: a maximum matching of claims to
   sentences, the heavier claims first. */
typedef struct gr__assign {
    const gr__claim *claims;
    gr__cstate *st;
    int **owner; /* per sentence, the claims it holds */
    int *nown;
    int cap;
    char *seen;
} gr__assign;

static int gr__linked(const gr__assign *A, int a, int b) {
    const gr__claim *k = &A->claims[a];
    for (int i = 0; i < k->nsame; i++)
        if (k->same[i] == b) return 1;
    return 0;
}

static int gr__augment(gr__assign *A, int ci) {
    gr__cstate *st = &A->st[ci];
    for (int j = 0; j < st->ncand; j++) {
        int s = st->cand[j].sent;
        if (A->seen[s]) continue;
        int taken = 0; /* the sentence already counts for the same idea in another item */
        for (int o = 0; o < A->nown[s] && !taken; o++)
            taken = gr__linked(A, A->owner[s][o], ci);
        if (taken) continue;
        A->seen[s] = 1;
        if (A->nown[s] < A->cap) {
            A->owner[s][A->nown[s]++] = ci;
            st->assigned = j;
            return 1;
        }
        for (int o = 0; o < A->nown[s]; o++) {
            int other = A->owner[s][o];
            int keep = A->st[other].assigned;
            A->st[other].assigned = -1;
            if (gr__augment(A, other)) {
                A->owner[s][o] = ci;
                st->assigned = j;
                return 1;
            }
            A->st[other].assigned = keep;
        }
    }
    return 0;
}

static void gr__assign_claims(gr__ctx *c, gr__cstate *st) {
    const gr__rubric *R = &c->R;
    int ns = c->S.nsent;
    gr__assign A = {R->claim, st, NULL, NULL, (int)R->rules.max_claims_per_sentence, NULL};
    if (A.cap < 1) A.cap = 1;
    A.owner = (int **)gr__alloc(c, sizeof(int *) * (size_t)(ns + 1));
    A.nown = (int *)gr__alloc(c, sizeof(int) * (size_t)(ns + 1));
    A.seen = (char *)gr__alloc(c, (size_t)ns + 1);
    for (int i = 0; i < ns; i++)
        A.owner[i] = (int *)gr__alloc(c, sizeof(int) * (size_t)A.cap);
    int *order = (int *)gr__alloc(c, sizeof(int) * (size_t)(R->nclaim + 1));
    for (int i = 0; i < R->nclaim; i++)
        order[i] = i;
    for (int i = 1; i < R->nclaim; i++)
        for (int j = i; j > 0 && R->claim[order[j]].points > R->claim[order[j - 1]].points; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    for (int k = 0; k < R->nclaim; k++) {
        memset(A.seen, 0, (size_t)ns + 1);
        gr__augment(&A, order[k]);
    }
    /* the same idea, credited to an item outside its box while the linked claim whose box holds
       the sentence went empty: it counts where it stands */
    for (int a = 0; a < R->nclaim; a++) {
        if (st[a].assigned < 0 || st[a].cand[st[a].assigned].in_box) continue;
        int s = st[a].cand[st[a].assigned].sent;
        for (int i = 0; i < R->claim[a].nsame; i++) {
            int b = R->claim[a].same[i];
            if (st[b].assigned >= 0) continue;
            for (int j = 0; j < st[b].ncand; j++) {
                if (st[b].cand[j].sent != s || !st[b].cand[j].in_box) continue;
                for (int o = 0; o < A.nown[s]; o++)
                    if (A.owner[s][o] == a) A.owner[s][o] = b;
                st[b].assigned = j;
                st[a].assigned = -1;
                memset(A.seen, 0, (size_t)ns + 1);
                A.seen[s] = 1;
                gr__augment(&A, a);
                break;
            }
            if (st[a].assigned < 0 || st[b].assigned >= 0) break;
        }
    }
    /* a claim left without a sentence although it had candidates: say why */
    for (int k = 0; k < R->nclaim; k++)
        if (st[k].assigned < 0 && st[k].ncand > 0 && st[k].near_sent == NULL) {
            st[k].near_sent = &c->S.sent[st[k].cand[0].sent];
            gr__sb w = {0};
            gr__sb_printf(c, &w, "that sentence already counts for other ideas (at most %.0f "
                          "ideas per sentence)", R->rules.max_claims_per_sentence);
            st[k].near_why = w.s;
        }
}

/* ---- evidence ---- */

typedef struct gr__estate {
    int sent; /* verified in this sentence, -1 none */
    char *value;
    const gr__sent *wrong_sent;
    char *wrong;
    int count;        /* measured: distinct values verified */
    gr__sb seen;      /* measured: "\x1f"-separated values already counted */
    int done;         /* nothing more to find */
} gr__estate;

/* The context ("Experiment B") named in s, in the sentence before it (same box) or earlier in
   its paragraph. */
static int gr__has_context(gr__ctx *c, const gr__bind *b, const gr__sent *s) {
    if (!b->has_context || gr__box_listed(c, b->context_boxes, s->box)) return 1;
    int i = gr__sent_index(c, s);
    for (int back = 0; i - back >= 0; back++) {
        const gr__sent *x = &c->S.sent[i - back];
        if (back > 0 && x->box != s->box) break;
        if (back > 1 && x->para != s->para) break;
        for (int k = 0; k < b->context.n; k++)
            if (x->ncm[b->context.concepts[k]] > 0) return 1;
    }
    return 0;
}

static int gr__slot_stated(const gr__sent *s, const gr__slot *sl, int *neg_out) {
    int any = 0;
    for (int k = 0; k < sl->n; k++)
        for (int i = 0; i < s->ncm[sl->concepts[k]]; i++) {
            const gr__match *m = &s->cm[sl->concepts[k]][i];
            if (m->hyp || m->framed || s->void_clause[m->clause]) continue;
            if (!m->neg) return 1;
            any = 1;
        }
    if (neg_out != NULL) *neg_out = any;
    return 0;
}

/* measured bindings: where in the results a quoted value may stand */
static int gr__path_ignored(const gr__bind *b, const char *rel) {
    const cJSON *p;
    char abs[768];
    snprintf(abs, sizeof abs, "%s.%s", b->path, rel);
    cJSON_ArrayForEach(p, b->ignore_paths) {
        if (!cJSON_IsString(p)) continue;
        size_t n = strlen(p->valuestring);
        /* relative to the binding's path ("config"), or from the results' root ("facts.x") */
        if (strncmp(rel, p->valuestring, n) == 0 && (rel[n] == '\0' || rel[n] == '.')) return 1;
        if (strncmp(abs, p->valuestring, n) == 0 && (abs[n] == '\0' || abs[n] == '.')) return 1;
    }
    return 0;
}

static int gr__number_ignored(const gr__bind *b, double v) {
    const cJSON *p;
    cJSON_ArrayForEach(p, b->ignore_numbers) if (cJSON_IsNumber(p) && fabs(p->valuedouble - v) < 1e-12)
        return 1;
    return 0;
}

/* A list of rank ids (a group, members): its elements do not verify a bare number. */
static int gr__is_rank_list(const cJSON *arr, const char *key, int in_array) {
    if (in_array) return 1;
    if (key == NULL) return 0;
    return strstr(key, "group") != NULL || strstr(key, "rank") != NULL ||
           strstr(key, "member") != NULL;
}

/* 1 when node (at rel, below the binding's path) holds the list canon, or the number v. */
static int gr__tree_has(gr__ctx *c, const gr__bind *b, const cJSON *node, char *rel, size_t cap,
                        const char *key, int in_array, const char *canon, double v, int dec) {
    if (rel[0] != '\0' && gr__path_ignored(b, rel)) return 0;
    if (canon != NULL && cJSON_IsArray(node)) {
        char *mine = gr__json_canon(c, node);
        if (mine != NULL && strcmp(mine, canon) == 0) return 1;
    }
    if (canon == NULL && cJSON_IsNumber(node)) return gr__num_matches(v, dec, node->valuedouble);
    if (canon == NULL && cJSON_IsString(node) && node->valuestring != NULL) {
        for (const char *q = node->valuestring; *q != '\0'; q++) {
            if (!isdigit((unsigned char)*q) || (q > node->valuestring && (isalnum((unsigned char)q[-1]) || q[-1] == '.')))
                continue;
            char *end;
            double x = strtod(q, &end);
            if (gr__num_matches(v, dec, x)) return 1;
            q = end - 1;
        }
        return 0;
    }
    if (!cJSON_IsArray(node) && !cJSON_IsObject(node)) return 0;
    if (canon == NULL && cJSON_IsArray(node) && gr__is_rank_list(node, key, in_array)) {
        /* a list of rank ids: only lists nested deeper may hold measured numbers */
        const cJSON *k;
        int all_int = 1;
        cJSON_ArrayForEach(k, node) all_int &= cJSON_IsNumber(k) && k->valuedouble == floor(k->valuedouble);
        if (all_int) return 0;
    }
    size_t base = strlen(rel);
    int idx = 0;
    const cJSON *k;
    cJSON_ArrayForEach(k, node) {
        if (cJSON_IsObject(node))
            snprintf(rel + base, cap - base, "%s%s", base ? "." : "", k->string);
        else
            snprintf(rel + base, cap - base, "%s%d", base ? "." : "", idx);
        idx++;
        int hit = gr__tree_has(c, b, k, rel, cap, cJSON_IsObject(node) ? k->string : key,
                               cJSON_IsArray(node), canon, v, dec);
        rel[base] = '\0';
        if (hit) return 1;
    }
    return 0;
}

static int gr__seen_add(gr__ctx *c, gr__sb *seen, const char *v) {
    const char *p = gr__sb_str(seen);
    size_t n = strlen(v);
    while (*p != '\0') {
        const char *e = strchr(p, '\x1f');
        size_t l = e != NULL ? (size_t)(e - p) : strlen(p);
        if (l == n && strncmp(p, v, n) == 0) return 0;
        p += l + (e != NULL);
    }
    gr__sb_add(c, seen, v);
    gr__sb_add(c, seen, "\x1f");
    return 1;
}

static void gr__measured_found(gr__ctx *c, const gr__bind *b, gr__sent *s, gr__estate *e,
                               const char *v) {
    if (!gr__seen_add(c, &e->seen, v)) return;
    e->count++;
    if (e->sent < 0) e->sent = gr__sent_index(c, s);
    gr__sb w = {0};
    gr__sb_printf(c, &w, "%s%s%s (line %d)", e->value != NULL ? e->value : "",
                  e->value != NULL ? ", " : "", v, s->line);
    e->value = w.s;
    if (e->count * b->per_value >= b->points - 1e-9) e->done = 1;
}

static int gr__value_denied(gr__ctx *c, const gr__sent *s, int t);

static void gr__check_measured(gr__ctx *c, const gr__bind *b, gr__sent *s, gr__estate *e,
                               const cJSON *meas) {
    gr__blist *lists = NULL;
    gr__num *nums = NULL;
    int nl = 0, lc = 0, nn = 0, nc = 0;
    gr__extract_values(c, s->norm, &lists, &nl, &lc, &nums, &nn, &nc);
    char rel[512];
    for (int li = 0; li < nl && !e->done; li++) {
        int t = gr__tok_at(s, lists[li].start);
        if (gr__is_index(s->norm, lists[li].start)) continue;
        if (t < s->ntok && (s->hyp[t] || s->void_clause[s->clause[t]])) continue;
        if (gr__value_denied(c, s, t)) continue;
        if (gr__near_slot(c, s, &b->quantity, t, GR__SEARCH_STRICT) == NULL) continue;
        rel[0] = '\0';
        if (gr__tree_has(c, b, meas, rel, sizeof rel, NULL, 0, lists[li].canon, 0, 0))
            gr__measured_found(c, b, s, e, lists[li].canon);
    }
    for (int ni = 0; ni < nn && !e->done; ni++) {
        int t = gr__tok_at(s, nums[ni].start);
        if (gr__number_ignored(b, nums[ni].v)) continue;
        if (t < s->ntok && (s->hyp[t] || s->void_clause[s->clause[t]])) continue;
        if (gr__value_denied(c, s, t)) continue;
        if (gr__near_slot(c, s, &b->quantity, t, GR__SEARCH_STRICT) == NULL) continue;
        rel[0] = '\0';
        if (gr__tree_has(c, b, meas, rel, sizeof rel, NULL, 0, NULL, nums[ni].v, nums[ni].decimals))
            gr__measured_found(c, b, s, e, nums[ni].text);
    }
}

/* ---- version, commit, count and text bindings: the words of a version statement ---- */

#define GR__MAX_VCOMP 6

/* "4.1.4", "v12.2.0", "0.15.0rc7-2333-gd98e8a64" at s[i]: two or more components (into comp),
   and where it ends; 0 when none starts there. */
static int gr__version_at(const char *s, size_t n, size_t i, long *comp, int *ncomp,
                          size_t *end) {
    size_t j = i;
    if (i > 0 && (isalnum((unsigned char)s[i - 1]) || s[i - 1] == '.')) return 0;
    if (j < n && s[j] == 'v') j++;
    if (j >= n || !isdigit((unsigned char)s[j])) return 0;
    int nc = 0;
    for (;;) {
        long x = 0;
        size_t d = j;
        while (j < n && isdigit((unsigned char)s[j]) && j - d < 9) x = x * 10 + (s[j++] - '0');
        if (j == d) return 0;
        if (nc < GR__MAX_VCOMP) comp[nc++] = x;
        if (j + 1 < n && s[j] == '.' && isdigit((unsigned char)s[j + 1])) {
            j++;
            continue;
        }
        break;
    }
    if (nc < 2) return 0;
    if (j + 2 < n && s[j] == 'r' && s[j + 1] == 'c' && isdigit((unsigned char)s[j + 2]))
        for (j += 2; j < n && isdigit((unsigned char)s[j]); j++) {   /* "0.15.0rc7" */
        }
    if (j + 1 < n && s[j] == '-' && isdigit((unsigned char)s[j + 1])) {   /* git describe */
        size_t k = j + 1;
        while (k < n && isdigit((unsigned char)s[k])) k++;
        if (k == n || !isalnum((unsigned char)s[k])) j = k;
        if (j == k && k + 2 < n && s[k] == '-' && s[k + 1] == 'g' &&
            isxdigit((unsigned char)s[k + 2]))
            for (j = k + 2; j < n && isxdigit((unsigned char)s[j]); j++) {
            }
    }
    if (j < n && isalpha((unsigned char)s[j])) return 0;
    *ncomp = nc;
    *end = j;
    return 1;
}

/* A commit at s[i]: 7 to 40 hex digits, at least one a digit (a short commit may have no
   letter: "8704574"), or the word "unknown". */
static int gr__commit_at(const char *s, size_t n, size_t i, size_t *end) {
    if (i > 0 && isalnum((unsigned char)s[i - 1])) return 0;
    size_t j = i;
    int digits = 0, hex = 1;
    while (j < n && isalnum((unsigned char)s[j])) {
        char ch = s[j++];
        digits += isdigit((unsigned char)ch) != 0;
        hex = hex && isxdigit((unsigned char)ch);
    }
    *end = j;
    if (j - i == 7 && strncmp(s + i, "unknown", 7) == 0) return 1;
    return hex && digits > 0 && j - i >= 7 && j - i <= 40;
}

/* The facts a binding may be verified against: its path, then its further paths. */
static int gr__bind_facts(gr__ctx *c, const gr__bind *b, const cJSON **out, int cap) {
    int n = 0;
    const cJSON *f = gr__path(c->results, b->path), *p;
    if (f != NULL && !cJSON_IsNull(f)) out[n++] = f;
    cJSON_ArrayForEach(p, b->paths) {
        f = gr__path(c->results, p->valuestring);
        if (n < cap && f != NULL && !cJSON_IsNull(f)) out[n++] = f;
    }
    return n;
}

/* 1 when a measured string (or number) writes a version whose components start with comp. */
static int gr__fact_has_version(gr__ctx *c, const cJSON *f, const long *comp, int nc) {
    char num[64];
    const char *raw = cJSON_IsString(f) ? f->valuestring : NULL;
    if (raw == NULL && cJSON_IsNumber(f)) snprintf(num, sizeof num, "%.15g", f->valuedouble);
    if (raw == NULL && cJSON_IsNumber(f)) raw = num;
    if (raw == NULL) return 0;
    char *norm = gr__normalize(c, raw, strlen(raw));
    size_t n = strlen(norm);
    for (size_t i = 0; i < n; i++) {
        long mc[GR__MAX_VCOMP];
        int mn = 0;
        size_t end = i;
        if (!gr__version_at(norm, n, i, mc, &mn, &end)) continue;
        int same = mn >= nc;
        for (int k = 0; k < nc && same; k++) same = mc[k] == comp[k];
        if (same) return 1;
        i = end;
    }
    return 0;
}

static int gr__fact_has_commit(gr__ctx *c, const cJSON *f, const char *quoted, size_t len) {
    if (!cJSON_IsString(f)) return 0;
    char *norm = gr__normalize(c, f->valuestring, strlen(f->valuestring));
    if (len == 7 && strncmp(quoted, "unknown", 7) == 0) return strncmp(norm, "unknown", 7) == 0;
    return strlen(norm) >= len && strncmp(norm, quoted, len) == 0 &&
           strspn(norm, "0123456789abcdef") >= len;
}

static void gr__bind_found(gr__ctx *c, gr__sent *s, gr__estate *e, const char *v, size_t n) {
    e->sent = gr__sent_index(c, s);
    e->value = gr__strndup(c, v, n);
}

static void gr__bind_wrong(gr__ctx *c, const gr__bind *b, gr__sent *s, gr__estate *e,
                           const char *v, size_t n, const cJSON *const *facts, int nf) {
    if (e->wrong_sent != NULL) return;
    e->wrong_sent = s;
    gr__sb w = {0};
    gr__sb_printf(c, &w, "%.*s is not %s (measured: %s)", (int)n, v, b->quantity.spec,
                  nf > 0 ? gr__json_short(c, facts[0], 50) : "nothing");
    e->wrong = w.s;
}

/* A version or a commit said to be the quantity. */
static void gr__check_token_binding(gr__ctx *c, const gr__bind *b, gr__sent *s, gr__estate *e) {
    const cJSON *facts[8];
    int nf = gr__bind_facts(c, b, facts, 8);
    const char *t = s->norm;
    size_t n = strlen(t);
    for (size_t i = 0; i < n; i++) {
        long comp[GR__MAX_VCOMP];
        int nc = 0;
        size_t end = i;
        int is = b->type == GR__BIND_VERSION ? gr__version_at(t, n, i, comp, &nc, &end)
                                             : gr__commit_at(t, n, i, &end);
        if (!is) {
            if (end > i) i = end - 1;
            continue;
        }
        int tk = gr__tok_at(s, i);
        size_t at = i;
        i = end - 1;
        if (tk < s->ntok && (s->hyp[tk] || s->void_clause[s->clause[tk]])) continue;
        if (gr__near_slot(c, s, &b->quantity, tk, GR__SEARCH_STRICT) == NULL) continue;
        int ok = 0;
        for (int k = 0; k < nf && !ok; k++)
            ok = b->type == GR__BIND_VERSION ? gr__fact_has_version(c, facts[k], comp, nc)
                                             : gr__fact_has_commit(c, facts[k], t + at, end - at);
        if (ok) {
            gr__bind_found(c, s, e, t + at, end - at);
            return;
        }
        gr__bind_wrong(c, b, s, e, t + at, end - at, facts, nf);
    }
}

/* A count said to be the quantity: a number, or "no" / "zero" / "without" / 无 / 没有 right
   before the quantity's name ("no GPU", "无 GPU": 0). */
static void gr__check_count_binding(gr__ctx *c, const gr__bind *b, gr__sent *s, gr__estate *e) {
    const cJSON *facts[8];
    int nf = gr__bind_facts(c, b, facts, 8);
    gr__blist *lists = NULL;
    gr__num *nums = NULL;
    int nl = 0, lc = 0, nn = 0, ncap = 0;
    gr__extract_values(c, s->norm, &lists, &nl, &lc, &nums, &nn, &ncap);
    static const char *const zero_words[] = {"no", "zero", "none", "without", "\xe6\x97\xa0",
                                             "\xe9\x9b\xb6", NULL};   /* 无 零 */
    for (int k = 0; k < s->ntok; k++) {
        const gr__tok *tk = &s->tok[k];
        int zero = 0;
        for (int w = 0; zero_words[w] != NULL && !zero; w++) zero = strcmp(tk->s, zero_words[w]) == 0;
        int len = tk->len;
        if (!zero && strcmp(tk->s, "\xe6\xb2\xa1") == 0 && k + 1 < s->ntok &&
            strcmp(s->tok[k + 1].s, "\xe6\x9c\x89") == 0)   /* 没有 */
            zero = 1, len = s->tok[k + 1].start + s->tok[k + 1].len - tk->start;
        if (!zero || s->hyp[k] || s->void_clause[s->clause[k]]) continue;
        /* the quantity's name within two tokens after it, whatever its polarity ("no" negates
           it: that is what the zero says) */
        int named = 0;
        for (int q = 0; q < b->quantity.n && !named; q++)
            for (int i = 0; i < s->ncm[b->quantity.concepts[q]] && !named; i++) {
                const gr__match *m = &s->cm[b->quantity.concepts[q]][i];
                named = m->start > k && m->start <= k + 3 && m->clause == s->clause[k] &&
                        !m->framed;   /* "it is not true that no GPU ..." */
            }
        if (!named) continue;
        gr__num *x = GR__PUSH(c, nums, nn, ncap);
        memset(x, 0, sizeof *x);
        snprintf(x->text, sizeof x->text, "%.*s", len, s->norm + tk->start);
        x->v = 0;
        x->start = (size_t)tk->start;
        x->zero_word = 1;
    }
    for (int ni = 0; ni < nn; ni++) {
        int t = gr__tok_at(s, nums[ni].start);
        if (nums[ni].decimals != 0) continue;
        if (t < s->ntok && (s->hyp[t] || s->void_clause[s->clause[t]])) continue;
        if (!nums[ni].zero_word && gr__near_slot(c, s, &b->quantity, t, GR__SEARCH_STRICT) == NULL)
            continue;
        int ok = 0;
        for (int k = 0; k < nf && !ok; k++)
            ok = cJSON_IsNumber(facts[k]) && fabs(facts[k]->valuedouble - nums[ni].v) < 1e-9;
        if (ok) {
            gr__bind_found(c, s, e, nums[ni].text, strlen(nums[ni].text));
            return;
        }
        gr__bind_wrong(c, b, s, e, nums[ni].text, strlen(nums[ni].text), facts, nf);
    }
}

/* A measured text (a GPU or CPU model, a backend) written in the sentence beside the name of
   its quantity. */
static void gr__check_text_binding(gr__ctx *c, const gr__bind *b, gr__sent *s, gr__estate *e) {
    const cJSON *facts[8];
    int nf = gr__bind_facts(c, b, facts, 8);
    for (int k = 0; k < nf; k++) {
        if (!cJSON_IsString(facts[k]) || strlen(facts[k]->valuestring) < 2) continue;
        char *want = gr__normalize(c, facts[k]->valuestring, strlen(facts[k]->valuestring));
        for (const char *at = strstr(s->norm, want); at != NULL; at = strstr(at + 1, want)) {
            size_t off = (size_t)(at - s->norm), len = strlen(want);
            if ((off > 0 && isalnum((unsigned char)at[-1])) || isalnum((unsigned char)at[len]))
                continue;   /* a whole word or phrase, not a piece of one */
            int t = gr__tok_at(s, off);
            if (t < s->ntok && (s->hyp[t] || s->void_clause[s->clause[t]])) continue;
            int named = gr__near_slot(c, s, &b->quantity, t, GR__SEARCH_STRICT) != NULL;
            for (int q = 0; q < b->quantity.n && !named; q++)   /* the text names it itself */
                for (int i = 0; i < s->ncm[b->quantity.concepts[q]] && !named; i++) {
                    const gr__match *m = &s->cm[b->quantity.concepts[q]][i];
                    named = m->start >= t && m->start < gr__tok_at(s, off + len) &&
                            gr__slot_ok(&b->quantity, m, GR__SEARCH_STRICT, 0);
                }
            if (!named) continue;
            gr__bind_found(c, s, e, facts[k]->valuestring, strlen(facts[k]->valuestring));
            return;
        }
    }
}

/* 1 when the value at token t is denied, not attributed: inside a denial frame ("it is a
   myth that the DP group is [1,3]") or after a negated verb of its clause ("the gradients are
   not averaged over [1,3,5,7]"). A prepositional negator ("without the all-reduce the copies
   drift by 0.0179") leaves the value standing. */
static int gr__value_denied(gr__ctx *c, const gr__sent *s, int t) {
    if (t < 0 || t >= s->ntok) return 0;
    int verb_neg = 0;
    for (int i = 0; i < s->ncm[c->R.L.neg] && !verb_neg; i++) {
        const gr__match *m = &s->cm[c->R.L.neg][i];
        verb_neg = m->end <= t && s->clause[m->start] == s->clause[t] &&
                   !gr__negator_absorbed(c, s, m) && gr__negates_verb(c, s, m);
    }
    return (verb_neg + s->frame[t]) % 2 == 1;
}

static void gr__check_binding(gr__ctx *c, const gr__bind *b, gr__sent *s, gr__estate *e) {
    if (s->ignored || !gr__has_context(c, b, s)) return;
    const cJSON *meas = gr__path(c->results, b->path);
    if (meas == NULL || cJSON_IsNull(meas)) return;
    if (b->type == GR__BIND_MEASURED) {
        gr__check_measured(c, b, s, e, meas);
        return;
    }
    if (b->type == GR__BIND_VERSION || b->type == GR__BIND_COMMIT) {
        gr__check_token_binding(c, b, s, e);
        return;
    }
    if (b->type == GR__BIND_COUNT) {
        gr__check_count_binding(c, b, s, e);
        return;
    }
    if (b->type == GR__BIND_TEXT) {
        gr__check_text_binding(c, b, s, e);
        return;
    }
    if (b->type == GR__BIND_ENUM) {
        if (!cJSON_IsString(meas)) return;
        const cJSON *v;
        cJSON_ArrayForEach(v, b->values) {
            gr__slot sl;
            gr__parse_slot(c, v->valuestring, &sl, GR__HYP_NO, b->id);
            if (!gr__slot_stated(s, &sl, NULL)) continue;
            if (strcasecmp(v->string, meas->valuestring) == 0) {
                e->sent = gr__sent_index(c, s);
                e->value = gr__strdup(c, v->string);
                return;
            }
            if (e->wrong_sent == NULL) {
                e->wrong_sent = s;
                gr__sb w = {0};
                gr__sb_printf(c, &w, "says %s, measured %s", v->string, meas->valuestring);
                e->wrong = w.s;
            }
        }
        return;
    }
    gr__blist *lists = NULL;
    gr__num *nums = NULL;
    int nl = 0, lc = 0, nn = 0, nc = 0;
    gr__extract_values(c, s->norm, &lists, &nl, &lc, &nums, &nn, &nc);
    if (b->type == GR__BIND_GROUPS) {
        for (int li = 0; li < nl; li++) {
            int t = gr__tok_at(s, lists[li].start);
            if (gr__is_index(s->norm, lists[li].start)) continue;
            if (t < s->ntok && (s->hyp[t] || s->void_clause[s->clause[t]])) continue;
            if (gr__value_denied(c, s, t)) continue;
            if (gr__near_slot(c, s, &b->quantity, t, GR__SEARCH_STRICT) == NULL) continue;
            int rank = gr__rank_named(c, s, t);
            int want = -1;
            if (b->rank_path != NULL) {
                const cJSON *r = gr__path(c->results, b->rank_path);
                if (cJSON_IsNumber(r)) want = r->valueint;
            }
            int ok = gr__list_is_measured(c, &lists[li], meas) &&
                     (rank < 0 || lists[li].nested || gr__list_has(&lists[li], rank)) &&
                     (want < 0 || lists[li].nested || gr__list_has(&lists[li], want));
            if (ok) {
                e->sent = gr__sent_index(c, s);
                e->value = lists[li].canon;
                return;
            }
            if (e->wrong_sent == NULL) {
                e->wrong_sent = s;
                gr__sb w = {0};
                gr__sb_printf(c, &w, "%s is not %s%s (measured: %s)", lists[li].canon,
                              b->quantity.spec, want >= 0 ? " of the probe rank" : "",
                              gr__json_short(c, meas, 50));
                e->wrong = w.s;
            }
        }
        return;
    }
    /* a number said to be the quantity */
    for (int ni = 0; ni < nn; ni++) {
        int t = gr__tok_at(s, nums[ni].start);
        if (t < s->ntok && (s->hyp[t] || s->void_clause[s->clause[t]])) continue;
        if (gr__value_denied(c, s, t)) continue;
        if (gr__near_slot(c, s, &b->quantity, t, GR__SEARCH_STRICT) == NULL) continue;
        int ok = 0;
        if (cJSON_IsNumber(meas))
            ok = gr__num_matches(nums[ni].v, nums[ni].decimals, meas->valuedouble);
        if (ok) {
            e->sent = gr__sent_index(c, s);
            e->value = gr__strdup(c, nums[ni].text);
            return;
        }
        if (e->wrong_sent == NULL) {
            e->wrong_sent = s;
            gr__sb w = {0};
            gr__sb_printf(c, &w, "%s is not %s (measured: %s)", nums[ni].text, b->quantity.spec,
                          gr__json_short(c, meas, 30));
            e->wrong = w.s;
        }
    }
}

/* ---- predictions ---- */

static const gr__pv *gr__find_pv(const gr__pv *pv, int n, const char *key, int part) {
    for (int i = 0; i < n; i++)
        if (strcmp(pv[i].key, key) == 0 && pv[i].part == part) return &pv[i];
    return NULL;
}

/* Scores one prediction: found in its own pred block, else in the other one (an answer in
   the wrong block still counts), then checked against the lock and the facts. */
static double gr__score_prediction(gr__ctx *c, const gr__pitem *p, const gr__pv *pv, int npv) {
    const gr__pv *val = gr__find_pv(pv, npv, p->key, p->block);
    int elsewhere = 0;
    if (val == NULL || val->placeholder) {
        const gr__pv *other = gr__find_pv(pv, npv, p->key, !p->block);
        if (other != NULL && !other->placeholder) {
            val = other;
            elsewhere = 1;
        }
    }
    gr__item *it = gr__new_item(c, p->id, p->item, "pred", "PRED", c->R.item[p->item].part,
                                p->points);
    it->line = val != NULL ? val->line : 0;
    gr__sb why = {0};
    if (val != NULL && !val->placeholder && !gr__prediction_locked(c, c->lock, val, &why)) {
        c->n_unlocked++;
        it->detail = gr__strdup(c, "not locked, earns 0");
        gr__more(c, it, "%s", gr__sb_str(&why));
        return 0;
    }
    gr__verdict v;
    memset(&v, 0, sizeof v);
    gr__judge(c, p, val, &v);
    it->score = v.frac * p->points;
    const cJSON *meas = gr__path(c->results, p->path);
    if (val != NULL && !val->placeholder && meas != NULL && !cJSON_IsNull(meas)) {
        c->pred_judged += it->score;
        c->pred_judged_max += p->points;
    }
    it->detail = gr__strdup(c, gr__sb_str(&v.detail));
    if (v.more.len) gr__more(c, it, "%s", gr__sb_str(&v.more));
    if (elsewhere) gr__more(c, it, "(found in the other pred block, line %d)", val->line);
    return it->score;
}

/* ---- items and totals ---- */

typedef struct gr__totals {
    double main, main_max, fu, fu_max, penalty;
    int locked, filled, near_empty, unlocked;
    double text, text_room;  /* text and evidence earned (within each item's cap), the caps' sum */
    int check_by_hand;       /* gr__check_by_hand */
} gr__totals;

/* Where this grader errs most (docs/grading.md, "Check by hand"): a sheet whose locked
   predictions, judged against the run, earned under a quarter of their points while its
   explanations earned at least half of theirs. Written before the run, that is a fluent answer
   the grader over-credits; written after it, a learner who learned from the run. The grade
   stays; the report says which to check. */
#define GR__CHECK_PRED_SHARE 0.25
#define GR__CHECK_TEXT_SHARE 0.5
#define GR__CHECK_MIN_PRED_POINTS 1.0
static int gr__check_by_hand(const gr__ctx *c, const gr__totals *t) {
    return c->pred_judged_max >= GR__CHECK_MIN_PRED_POINTS - 1e-9 && t->text_room > 0 &&
           c->pred_judged < GR__CHECK_PRED_SHARE * c->pred_judged_max &&
           t->text >= GR__CHECK_TEXT_SHARE * t->text_room - 1e-9;
}

static double gr__round2(double x) { return floor(x * 100.0 + 0.5 + 1e-9) / 100.0; }

static void gr__claim_item(gr__ctx *c, int ci, const gr__cstate *st) {
    const gr__claim *k = &c->R.claim[ci];
    gr__item *it = gr__new_item(c, k->id, k->item, "claim", "TEXT", c->R.item[k->item].part,
                                k->points);
    if (st->assigned >= 0) {
        const gr__ccand *x = &st->cand[st->assigned];
        const gr__sent *s = &c->S.sent[x->sent];
        it->score = k->points;
        it->line = s->line;
        it->detail = gr__where(c, x->a, s);
        gr__more(c, it, "rule: %s", x->rule);
        if (x->hedge != NULL) {
            it->score = k->points * c->R.rules.hedge_factor;
            gr__more(c, it, "hedged (\"%s\"): it earns %.0f%%",
                     c->R.concepts[c->R.L.hedges].alt[x->hedge->alt].src,
                     c->R.rules.hedge_factor * 100);
        }
        if (!x->in_box && s->box >= 0)
            gr__more(c, it, "(written under %s, counted for %s)", c->R.box[s->box].id,
                     c->R.item[k->item].id);
        return;
    }
    it->detail = gr__strdup(c, "not found");
    if (st->near_sent != NULL) {
        it->line = st->near_sent->line;
        gr__more(c, it, "%s: %s", gr__where(c, st->near_a, st->near_sent), st->near_why);
    }
    gr__more(c, it, "need: %s", k->need);
}

static void gr__bind_item(gr__ctx *c, int bi, const gr__estate *e) {
    const gr__bind *b = &c->R.bind[bi];
    gr__item *it = gr__new_item(c, b->id, b->item, "evid", "EVID", c->R.item[b->item].part,
                                b->points);
    if (e->sent >= 0 && b->type == GR__BIND_MEASURED) {
        const gr__sent *s = &c->S.sent[e->sent];
        it->score = fmin(b->points, e->count * b->per_value);
        it->line = s->line;
        gr__sb d = {0};
        gr__sb_printf(c, &d, "line %d %s", s->line, gr__excerpt(c, s->raw));
        it->detail = d.s;
        gr__more(c, it, "verified in %s: %s", b->path, e->value);
        if (it->score < b->points - 1e-9) gr__more(c, it, "need: %s", b->need);
        return;
    }
    if (e->sent >= 0) {
        const gr__sent *s = &c->S.sent[e->sent];
        it->score = b->points;
        it->line = s->line;
        gr__sb d = {0};
        gr__sb_printf(c, &d, "line %d %s", s->line, gr__excerpt(c, s->raw));
        it->detail = d.s;
        gr__more(c, it, "verified: %s = %s (%s)", b->quantity.n ? b->quantity.spec : b->path,
                 e->value, b->path);
        return;
    }
    it->detail = gr__strdup(c, "not quoted");
    if (e->wrong_sent != NULL) {
        it->line = e->wrong_sent->line;
        gr__more(c, it, "line %d %s: %s", e->wrong_sent->line, gr__excerpt(c, e->wrong_sent->raw),
                 e->wrong);
    }
    gr__more(c, it, "need: %s", b->need);
}

static void gr__misc_item(gr__ctx *c, int mi, const gr__mcstate *ms, double *left) {
    const gr__misc *m = &c->R.misc[mi];
    gr__item *it = gr__new_item(c, m->id, m->item, "misc", "MISC", m->part, 0);
    if (!ms->fired && !gr__misc_applies(c, m)) {
        const char *wp = gr__jstr(m->when, "path", "");
        gr__sb d = {0};
        gr__sb_printf(c, &d, "not applicable in this run (%s = %s)", wp,
                      gr__json_short(c, gr__path(c->results, wp), 30));
        it->detail = d.s;
        return;
    }
    if (!ms->fired) {
        it->detail = gr__strdup(c, "did not fire");
        return;
    }
    double pen = fmin(m->penalty, *left);
    *left -= pen;
    it->fired = 1;
    it->score = -pen;
    it->line = ms->b->line;
    gr__sb d = {0};
    gr__sb_printf(c, &d, "%s: line %d %s", m->title, ms->b->line, gr__excerpt(c, ms->b->raw));
    it->detail = d.s;
    gr__more(c, it, "rule: %s%s", ms->rule,
             " (the clause earns nothing, and the misconception costs its penalty)");
    if (ms->why.len) gr__more(c, it, "%s", gr__sb_str(&ms->why));
    gr__sb meas = {0};
    const cJSON *p;
    cJSON_ArrayForEach(p, m->refute) if (cJSON_IsString(p))
        gr__sb_printf(c, &meas, "%s%s=%s", meas.len ? "; " : "", p->valuestring,
                      gr__json_short(c, gr__path(c->results, p->valuestring), 50));
    if (meas.len) gr__more(c, it, "measured: %s", gr__sb_str(&meas));
    if (m->feedback[0]) gr__more(c, it, "%s", m->feedback);
    if (m->citation[0]) gr__more(c, it, "see %s", m->citation);
    if (pen < m->penalty)
        gr__more(c, it, "penalty reduced: penalties are capped at %.2f in total",
                 c->R.rules.penalty_cap);
}

/* Grades every item: predictions, claims and evidence add up to at most the item's points. */
static void gr__score_items(gr__ctx *c, gr__totals *t) {
    const gr__rubric *R = &c->R;
    gr__pv *pv = NULL;
    int npv = 0, cap = 0;
    for (int i = 0; i < c->S.npb; i++)
        gr__parse_pred_block(c, &c->S.pb[i], &pv, &npv, &cap);
    gr__mcstate *mcs = (gr__mcstate *)gr__alloc(c, sizeof(gr__mcstate) * (size_t)(R->nmisc + 1));
    gr__detect_misconceptions(c, mcs);
    gr__cstate *cs = (gr__cstate *)gr__alloc(c, sizeof(gr__cstate) * (size_t)(R->nclaim + 1));
    for (int k = 0; k < R->nclaim; k++)
        gr__claim_candidates(c, k, &cs[k]);
    gr__assign_claims(c, cs);
    /* a claim the sheet also contradicts (its misconception fired somewhere) earns nothing */
    for (int mi = 0; mi < R->nmisc; mi++) {
        if (!mcs[mi].fired) continue;
        for (int k = 0; k < R->nclaim; k++) {
            if (!gr__json_has_string(R->misc[mi].voids, R->claim[k].id) || cs[k].assigned < 0) continue;
            cs[k].assigned = -1;
            cs[k].near_sent = mcs[mi].b;
            cs[k].near_a = NULL;
            gr__sb w = {0};
            gr__sb_printf(c, &w, "not counted: the sheet also states %s (%s)", R->misc[mi].id,
                          R->misc[mi].title);
            cs[k].near_why = w.s;
        }
    }
    gr__estate *es = (gr__estate *)gr__alloc(c, sizeof(gr__estate) * (size_t)(R->nbind + 1));
    for (int b = 0; b < R->nbind; b++) {
        es[b].sent = -1;
        int all = R->bind[b].type == GR__BIND_MEASURED; /* several values may count */
        for (int i = 0; i < c->S.nsent && (all ? !es[b].done : es[b].sent < 0); i++)
            gr__check_binding(c, &R->bind[b], &c->S.sent[i], &es[b]);
    }
    double part_sum[2] = {0, 0};
    for (int ii = 0; ii < R->nitem; ii++) {
        const gr__ritem *ri = &R->item[ii];
        int head_i = c->nitems; /* items may move as the array grows: keep the index */
        gr__new_item(c, ri->id, ii, "item", "ITEM", ri->part, ri->points);
        double pred = 0, pred_max = 0, text = 0;
        for (int p = 0; p < R->npred; p++)
            if (R->pred[p].item == ii && gr__variant_active(c, R->pred[p].variants)) {
                pred += gr__score_prediction(c, &R->pred[p], pv, npv);
                pred_max += R->pred[p].points;
            }
        for (int k = 0; k < R->nclaim; k++)
            if (R->claim[k].item == ii && gr__variant_active(c, R->claim[k].variants)) {
                gr__claim_item(c, k, &cs[k]);
                text += c->items[c->nitems - 1].score;
            }
        for (int b = 0; b < R->nbind; b++)
            if (R->bind[b].item == ii && gr__variant_active(c, R->bind[b].variants)) {
                gr__bind_item(c, b, &es[b]);
                text += c->items[c->nitems - 1].score;
            }
        /* the predictions carry their share of the item: the text cannot earn it instead */
        double text_cap = fmax(0.0, ri->points - pred_max);
        gr__item *head = &c->items[head_i];
        head->score = fmin(ri->points, pred + fmin(text, text_cap));
        t->text += fmin(text, text_cap);
        t->text_room += text_cap;
        gr__sb d = {0};
        gr__sb_printf(c, &d, "%s", ri->title);
        if (ri->seed[0]) gr__sb_printf(c, &d, " (%s)", ri->seed);
        head->detail = d.s;
        if (text > text_cap + 1e-9)
            gr__more(c, head, "text and evidence capped at %.2f (%.2f earned below); the %.2f left "
                              "is the predictions'",
                     text_cap, text, pred_max);
        part_sum[ri->part] += head->score;
    }
    double left = R->rules.penalty_cap, pen[2] = {0, 0};
    for (int mi = 0; mi < R->nmisc; mi++) {
        gr__misc_item(c, mi, &mcs[mi], &left);
        pen[R->misc[mi].part] += -c->items[c->nitems - 1].score;
    }
    t->main = gr__round2(fmax(0.0, part_sum[0] - pen[0]));
    t->fu = gr__round2(fmax(0.0, part_sum[1] - pen[1]));
    t->penalty = pen[0] + pen[1];
    t->main_max = R->max_main;
    t->fu_max = R->max_followup;
}

// ---------------------------------------------------------------------------------------------
// >>report

static char *gr__substitute(gr__ctx *c, const char *text, const char *const *names,
                            const char *const *values, int n);

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
    int head = strcmp(it->kind, "item") == 0;
    if (head)
        gr__sb_printf(c, &row, "== %s", it->id);
    else
        gr__sb_printf(c, &row, "  [%s] %s", it->tag, it->id);
    int col = gr__display_width(gr__sb_str(&row));
    int tab = head ? 8 : 30;
    if (col < tab - 1) {
        gr__dots(c, &row, col, tab);
        col = tab;
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
        gr__sb_add(c, out, head ? "       " : "         ");
        gr__sb_addn(c, out, m, len);
        gr__sb_add(c, out, "\n");
        m += len + (nl != NULL);
    }
}

static void gr__print_part(gr__ctx *c, gr__sb *out, int part) {
    for (int i = 0; i < c->nitems; i++) {
        const gr__item *it = &c->items[i];
        if (it->part != part || strcmp(it->kind, "misc") == 0) continue;
        gr__print_item(c, out, it);
    }
    int fired = 0;
    for (int i = 0; i < c->nitems; i++) {
        const gr__item *it = &c->items[i];
        if (it->part != part || strcmp(it->kind, "misc") != 0 || !it->fired) continue;
        fired++;
        gr__print_item(c, out, it);
    }
    if (fired == 0) gr__sb_add(c, out, "  [MISC] no misconception fired\n");
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

/* How far to trust the grade, from what `make agreement` measured on the lab's held-out
   answer sheets (written by other learners, marked by a human examiner). */
/* Appends text broken at spaces into lines of at most width bytes (a longer word stands alone). */
static void gr__sb_add_wrapped(gr__ctx *c, gr__sb *b, const char *text, int width) {
    const char *p = text;
    while (*p) {
        size_t n = strlen(p);
        const char *cut = p + n;
        if (n > (size_t)width) {
            cut = p + width;
            while (cut > p && *cut != ' ')
                cut--;
            if (cut == p) /* one word longer than the line: it stands alone */
                for (cut = p + width; *cut && *cut != ' '; cut++) {}
        }
        gr__sb_printf(c, b, "%.*s\n", (int)(cut - p), p);
        for (p = cut; *p == ' '; p++) {}
    }
}

static void gr__print_agreement(gr__ctx *c, gr__sb *out) {
    gr__sb line = {0}, *b = &line;
    const cJSON *a = c->R.agreement;
    if (a == NULL) return;
    int n = (int)gr__jnum(a, "sheets", 0), within = (int)gr__jnum(a, "within_2", 0);
    int nlow = (int)gr__jnum(a, "marked_5_down", 0), nhigh = (int)gr__jnum(a, "marked_12_up", 0);
    double low = gr__jnum(a, "mean_diff_marked_5_down", 0);
    double high = gr__jnum(a, "mean_diff_marked_12_up", 0);
    if (n <= 0) return;
    gr__sb_printf(c, b, "How far to trust this grade: on %d answer sheets that other learners "
                        "wrote and a human examiner marked, held out of the rubric's tuning, this "
                        "grader came within 2 points of the examiner on %d (%d%%).",
                  n, within, (int)(100.0 * within / n + 0.5));
    int say_low = nlow > 0 && fabs(low) >= 0.5, say_high = nhigh > 0 && fabs(high) >= 0.5;
    if (say_low)
        gr__sb_printf(c, b, " On those marked 5 or less it gave %.2f %s on average", fabs(low),
                      low > 0 ? "more" : "less");
    if (say_high && say_low)
        gr__sb_printf(c, b, ", on those marked 12 or more %.2f %s", fabs(high),
                      high > 0 ? "more" : "less");
    else if (say_high)
        gr__sb_printf(c, b, " On those marked 12 or more it gave %.2f %s on average", fabs(high),
                      high > 0 ? "more" : "less");
    if (say_low || say_high) gr__sb_add(c, b, ".");
    if (within * 10 < n * 9)
        gr__sb_add(c, b, " That is short of the workbook's bar (90%): when a fluent answer "
                         "grades high, check its claims against the run yourself "
                         "(docs/grading.md).");
    gr__sb_add_wrapped(c, out, gr__sb_str(&line), GR__TABLE_WIDTH);
}

static void gr__print_check_by_hand(gr__ctx *c, gr__sb *out, const gr__totals *t) {
    gr__sb line = {0};
    gr__sb_printf(c, &line, "Check this grade by hand: your locked predictions earned %d%% of "
                            "their points and your explanations %d%% of theirs. Sheets like this "
                            "are where this grader errs most (docs/grading.md, \"Check by "
                            "hand\"): if you learned the explanations from the run, compare each "
                            "claim with what the run measured; if you wrote them before it, the "
                            "grade is likely generous.",
                  (int)(100.0 * c->pred_judged / c->pred_judged_max + 0.5),
                  (int)(100.0 * t->text / t->text_room + 0.5));
    gr__sb_add_wrapped(c, out, gr__sb_str(&line), GR__TABLE_WIDTH);
}

static void gr__print_report(gr__ctx *c, FILE *out, const gr__totals *t) {
    if (out == NULL) return;
    gr__sb b = {0};
    const gr__rubric *R = &c->R;
    int locked = t->filled > 0 && t->unlocked == 0 && c->lock->mode != GR__LOCK_NONE;
    gr__sb_printf(c, &b, "%s / %s %s  nonce=%s probe=%s followup=%s  locked=%s\n", R->lab,
                  R->question, gr__config_line(c), gr__jstr(c->results, "nonce", "?"),
                  gr__json_short(c, cJSON_GetObjectItemCaseSensitive(c->results, "probe_rank"), 8),
                  c->variant[0] ? c->variant : "?",
                  locked ? "yes" : t->filled == 0 ? "no (no predictions)" : "no");
    if (t->unlocked > 0 || (t->filled > 0 && c->lock->mode == GR__LOCK_NONE))
        gr__sb_printf(c, &b,
                      "PREDICTIONS NOT LOCKED: %d prediction%s earn 0 (absent at the first "
                      "measured run or changed since; see [PRED] lines)\n",
                      t->unlocked, t->unlocked == 1 ? "" : "s");
    else if (c->lock->mode == GR__LOCK_LEDGER)
        gr__sb_printf(c, &b, "predictions locked at %s (ledger %s)\n", c->lock->locked_at,
                      c->lock->ledger_path);
    else if (c->lock->mode == GR__LOCK_LEGACY && t->filled > 0)
        gr__sb_printf(c, &b, "predictions locked at %s (hash recorded by that run)\n",
                      c->lock->locked_at);
    if (c->warnings.len) gr__sb_add(c, &b, gr__sb_str(&c->warnings));
    gr__print_part(c, &b, GR__PART_MAIN);
    const cJSON *var = cJSON_GetObjectItemCaseSensitive(R->variants, c->variant);
    gr__sb sep = {0};
    char probe[16];
    snprintf(probe, sizeof probe, "%d", (int)gr__jnum(c->results, "probe_rank", -1));
    const char *pn[] = {"probe_rank"}, *pv[] = {probe};
    gr__sb_printf(c, &sep, "-- follow-up %s: %s ", c->variant,
                  gr__substitute(c, gr__jstr(var, "title", ""), pn, pv, 1));
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
    gr__print_agreement(c, &b);
    if (t->check_by_hand) gr__print_check_by_hand(c, &b, t);
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
    if (c->R.agreement != NULL)
        cJSON_AddItemToObject(root, "agreement_held_out", cJSON_Duplicate(c->R.agreement, 1));
    if (t->check_by_hand) {
        cJSON *h = cJSON_AddObjectToObject(root, "check_by_hand");
        cJSON_AddNumberToObject(h, "prediction_share",
                                gr__round2(c->pred_judged / c->pred_judged_max));
        cJSON_AddNumberToObject(h, "text_share", gr__round2(t->text / t->text_room));
    }
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
    r->check_by_hand = t->check_by_hand;
    snprintf(r->nonce, sizeof r->nonce, "%s", gr__jstr(c->results, "nonce", ""));
    r->probe_rank = (int)gr__jnum(c->results, "probe_rank", -1);
    snprintf(r->variant, sizeof r->variant, "%s", c->variant);
    r->items = (gr_item *)calloc((size_t)(c->nitems + 1), sizeof(gr_item));
    if (r->items == NULL) return MC_ERR_NO_MEMORY;
    for (int i = 0; i < c->nitems; i++) {
        const gr__item *it = &c->items[i];
        gr_item *o = &r->items[i];
        snprintf(o->id, sizeof o->id, "%s", it->id);
        snprintf(o->item, sizeof o->item, "%s", it->ritem);
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

/* GR_GRADE_DEBUG=1: every sentence with its box, flags and concepts (+ stated, - denied,
   ? conditional) on stderr, for writing rubrics and checking calibration sheets. */
static void gr__debug_sentences(gr__ctx *c) {
    const gr__rubric *R = &c->R;
    for (int i = 0; i < c->S.nsent; i++) {
        const gr__sent *s = &c->S.sent[i];
        fprintf(stderr, "[debug] line %d box %s%s%s%s%s: %s\n", s->line,
                s->box >= 0 ? R->box[s->box].id : "-", s->in_list ? " list" : "",
                s->anaphor ? " refers-back" : "", s->ignored ? " IGNORED: " : "",
                gr__ignore_reason[s->ignored], s->raw);
        if (s->ncm == NULL) continue;
        fprintf(stderr, "[debug]   ");
        for (int k = 0; k < R->nconcepts; k++)
            for (int j = 0; j < s->ncm[k]; j++) {
                const gr__match *m = &s->cm[k][j];
                fprintf(stderr, " %s%s@%d(%s)", R->concepts[k].id,
                        m->hyp ? "?" : m->framed ? (m->neg ? "~+" : "~-") : m->neg ? "-" : "+",
                        m->clause, R->concepts[k].alt[m->alt].src);
            }
        fprintf(stderr, "\n");
    }
}

/* The prompt text a sentence must not copy, box by box: the template's headings and the
   comments under them, each box's "prompt" (older templates), the item titles, the variants'
   questions. */
static void gr__add_prompts(gr__ctx *c) {
    const gr__rubric *R = &c->R;
    if (R->template_path != NULL) {
        size_t n = 0;
        char *t = gr__read_file(R->template_path, GR__MAX_SHEET_BYTES, &n, NULL);
        cmark_node *doc = t != NULL ? cmark_parse_document(t, n, CMARK_OPT_DEFAULT) : NULL;
        free(t);
        cmark_iter *it = doc != NULL ? cmark_iter_new(doc) : NULL;
        int box = -1;
        cmark_event_type ev;
        while (it != NULL && (ev = cmark_iter_next(it)) != CMARK_EVENT_DONE) {
            if (ev != CMARK_EVENT_ENTER) continue;
            cmark_node *node = cmark_iter_get_node(it);
            const char *lit = cmark_node_get_literal(node);
            switch (cmark_node_get_type(node)) {
            case CMARK_NODE_HEADING: {
                cmark_node *tx = cmark_node_first_child(node);
                const char *h = tx != NULL ? cmark_node_get_literal(tx) : NULL;
                if (h != NULL) {
                    char *norm = gr__normalize(c, h, strlen(h));
                    box = cmark_node_get_heading_level(node) >= 2 ? gr__box_of_heading(c, norm) : -1;
                    gr__add_prompt_text(c, h, box);
                }
                break;
            }
            case CMARK_NODE_HTML_BLOCK:
            case CMARK_NODE_HTML_INLINE:
                if (lit != NULL) gr__add_prompt_text(c, lit, box);
                break;
            default: break;
            }
        }
        if (it != NULL) cmark_iter_free(it);
        if (doc != NULL) cmark_node_free(doc);
    }
    for (int b = 0; b < R->nbox; b++)
        if (R->box[b].prompt != NULL) gr__add_prompt_text(c, R->box[b].prompt, b);
    const cJSON *lp;
    cJSON_ArrayForEach(lp, cJSON_GetObjectItemCaseSensitive(R->root, "legacy_prompts"))
        if (cJSON_IsString(lp)) gr__add_prompt_text(c, lp->valuestring, -1);
    for (int i = 0; i < R->nitem; i++)
        gr__add_prompt_text(c, R->item[i].title, -1);
    for (int k = 0; k < R->nclaim; k++) /* the rubric file is public: copying a need is no answer */
        gr__add_prompt_text(c, R->claim[k].need, GR__RUBRIC_PROMPT);
    const cJSON *v;
    cJSON_ArrayForEach(v, R->variants) gr__add_prompt_text(c, gr__jstr(v, "question", ""), -1);
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
    if (c->S.dropped > 0)
        gr__warn(c, "warning: the sheet has more than %d sentences; the rest is not graded",
                 GR__MAX_SENTENCES);
    gr__pick_variant(c);
    gr__add_prompts(c);
    gr__analyse_sheet(c);
    if (getenv("GR_GRADE_DEBUG") != NULL) gr__debug_sentences(c);

    gr__totals t;
    memset(&t, 0, sizeof t);
    char ledger_path[4200];
    if (d->ledger_path != NULL)
        snprintf(ledger_path, sizeof ledger_path, "%s", d->ledger_path);
    else
        gr_ledger_path_for(d->results_path, ledger_path, sizeof ledger_path);
    gr__lock_state(c, gr__strdup(c, ledger_path), &t);
    gr__score_items(c, &t);
    t.unlocked = c->n_unlocked;
    t.locked = t.filled > 0 && c->n_unlocked == 0 && c->lock->mode != GR__LOCK_NONE;
    t.check_by_hand = gr__check_by_hand(c, &t);
    int written = 0;
    for (int i = 0; i < c->S.nsent; i++)
        written += c->S.sent[i].ignored == GR__IGN_NONE;
    t.near_empty = t.filled == 0 && written == 0;
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

static int gr__has_content_beyond_template(gr__ctx *c, const char *text, size_t n) {
    gr__parse_sheet(c, text, n);
    if (c->S.nsent > 0) return 1;
    char hex[17];
    int filled = 0;
    gr__sheet_pred_hash(c, hex, &filled);
    return filled > 0;
}

static int gr__write_template(gr__ctx *c, const char *rubric_path, const char *answers_path,
                              const char *nonce, int probe_rank, const char *variant, int force) {
    gr__load_rubric(c, rubric_path);
    if (c->R.template_path == NULL)
        gr__fail(c, MC_ERR_INVALID_DESC, "rubric %s names no \"template\" file", rubric_path);
    size_t tn = 0;
    char *raw = gr__read_file(c->R.template_path, GR__MAX_SHEET_BYTES, &tn, NULL);
    if (raw == NULL)
        gr__fail(c, MC_ERR_IO, "template %s cannot be read", c->R.template_path);
    char *tmpl = gr__strndup(c, raw, tn);
    free(raw);
    const cJSON *var = cJSON_GetObjectItemCaseSensitive(c->R.variants, variant);
    char probe[16];
    snprintf(probe, sizeof probe, "%d", probe_rank);
    const char *names[] = {"nonce", "probe_rank", "variant", "variant_title", "variant_question"};
    const char *values[] = {nonce, probe, variant, gr__jstr(var, "title", ""),
                            gr__jstr(var, "question", "")};
    /* twice: the variant's question names {probe_rank} itself */
    char *text = gr__substitute(c, tmpl, names, values, 5);
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
    else
        fprintf(stderr, "grader: %s\n", c->err);
    gr__ctx_free(c);
    return rc;
}

static void gr__rubric_items(gr__ctx *c, const char *rubric_path, gr_rubric_item **out,
                             int *count) {
    gr__load_rubric(c, rubric_path);
    const gr__rubric *R = &c->R;
    int n = R->nitem + R->nmisc;
    gr_rubric_item *items = (gr_rubric_item *)calloc((size_t)(n + 1), sizeof(gr_rubric_item));
    if (items == NULL) gr__fail(c, MC_ERR_NO_MEMORY, "grader: out of memory");
    for (int i = 0; i < R->nitem; i++) {
        gr_rubric_item *it = &items[i];
        snprintf(it->id, sizeof it->id, "%s", R->item[i].id);
        snprintf(it->part, sizeof it->part, "%s", gr__part_name[R->item[i].part]);
        snprintf(it->title, sizeof it->title, "%s", R->item[i].title);
        it->max_score = R->item[i].points;
    }
    for (int m = 0; m < R->nmisc; m++) {
        gr_rubric_item *it = &items[R->nitem + m];
        snprintf(it->id, sizeof it->id, "%s", R->misc[m].id);
        snprintf(it->part, sizeof it->part, "%s", gr__part_name[R->misc[m].part]);
        snprintf(it->title, sizeof it->title, "%s", R->misc[m].title);
        it->is_penalty = 1;
    }
    *out = items;
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
