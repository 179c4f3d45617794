/* labs/lab_svg.c - the tiny SVG writer. See lab_svg.h. */
#include "lab_svg.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lab_common.h"

struct lab_svg {
    char *buf;
    size_t len, cap;
    int failed;     /* out of memory once: every later call is a no-op */
    int finished;   /* the closing tag is written */
};

/* ---------------------------------------------------------------------------------------------
   the growing buffer */

static void lab__svg_put(lab_svg *s, const char *text, size_t n) {
    if (s == NULL || s->failed || s->finished) return;
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap * 2 > s->len + n + 1 ? s->cap * 2 : s->len + n + 1;
        char *bigger = realloc(s->buf, cap);
        if (bigger == NULL) {
            s->failed = 1;
            return;
        }
        s->buf = bigger;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, text, n);
    s->len += n;
    s->buf[s->len] = '\0';
}

static void lab__svg_printf(lab_svg *s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void lab__svg_printf(lab_svg *s, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    lab__svg_put(s, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

/* Text and attribute values: the five XML specials become entities, control characters
   (not allowed in XML 1.0) are dropped. */
static void lab__svg_escaped(lab_svg *s, const char *text) {
    for (const char *p = text != NULL ? text : ""; *p != '\0'; p++) {
        switch (*p) {
        case '&': lab__svg_put(s, "&amp;", 5); break;
        case '<': lab__svg_put(s, "&lt;", 4); break;
        case '>': lab__svg_put(s, "&gt;", 4); break;
        case '"': lab__svg_put(s, "&quot;", 6); break;
        case '\'': lab__svg_put(s, "&apos;", 6); break;
        default:
            if ((unsigned char)*p >= 0x20 || *p == '\t' || *p == '\n') lab__svg_put(s, p, 1);
            break;
        }
    }
}

/* Finite values only, two decimals: "12.50". */
static double lab__svg_num(double v) { return isfinite(v) ? v : 0.0; }

/* ---------------------------------------------------------------------------------------------
   the document */

lab_svg *lab_svg_new(double width, double height) {
    lab_svg *s = calloc(1, sizeof *s);
    if (s == NULL) return NULL;
    width = lab__svg_num(width);
    height = lab__svg_num(height);
    lab__svg_printf(s,
                    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                    "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                    "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\">\n"
                    "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n",
                    width, height, width, height, width, height);
    if (s->failed) {
        lab_svg_free(s);
        return NULL;
    }
    return s;
}

void lab_svg_free(lab_svg *s) {
    if (s == NULL) return;
    free(s->buf);
    free(s);
}

static void lab__svg_attr(lab_svg *s, const char *name, const char *value) {
    lab__svg_printf(s, " %s=\"", name);
    lab__svg_escaped(s, value);
    lab__svg_put(s, "\"", 1);
}

void lab_svg_rect(lab_svg *s, double x, double y, double w, double h, const char *fill,
                  const char *title) {
    lab__svg_printf(s, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\"",
                    lab__svg_num(x), lab__svg_num(y), fmax(0.0, lab__svg_num(w)),
                    fmax(0.0, lab__svg_num(h)));
    lab__svg_attr(s, "fill", fill != NULL ? fill : "#888888");
    if (title == NULL) {
        lab__svg_put(s, "/>\n", 3);
        return;
    }
    lab__svg_put(s, "><title>", 8);
    lab__svg_escaped(s, title);
    lab__svg_put(s, "</title></rect>\n", 16);
}

void lab_svg_line(lab_svg *s, double x1, double y1, double x2, double y2, const char *stroke,
                  double width) {
    lab__svg_printf(s, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"", lab__svg_num(x1),
                    lab__svg_num(y1), lab__svg_num(x2), lab__svg_num(y2));
    lab__svg_attr(s, "stroke", stroke != NULL ? stroke : "black");
    lab__svg_printf(s, " stroke-width=\"%.2f\"/>\n", width > 0 ? lab__svg_num(width) : 1.0);
}

void lab_svg_text(lab_svg *s, double x, double y, lab_svg_anchor anchor, double size,
                  const char *text) {
    static const char *const anchors[] = {"start", "middle", "end"};
    int a = anchor >= LAB_SVG_START && anchor <= LAB_SVG_END ? (int)anchor : 0;
    lab__svg_printf(s, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"%s\" font-size=\"%.1f\">",
                    lab__svg_num(x), lab__svg_num(y), anchors[a],
                    size > 0 ? lab__svg_num(size) : 12.0);
    lab__svg_escaped(s, text);
    lab__svg_put(s, "</text>\n", 8);
}

/* ---------------------------------------------------------------------------------------------
   axes */

static double lab__svg_span(double lo, double hi) { return hi - lo != 0.0 ? hi - lo : 1.0; }

double lab_svg_x(const lab_svg_axes *a, double value) {
    return a->x + (value - a->x_min) / lab__svg_span(a->x_min, a->x_max) * a->w;
}

double lab_svg_y(const lab_svg_axes *a, double value) {
    return a->y + a->h - (value - a->y_min) / lab__svg_span(a->y_min, a->y_max) * a->h;
}

double lab_svg_dx(const lab_svg_axes *a, double length) {
    return fabs(length / lab__svg_span(a->x_min, a->x_max) * a->w);
}

double lab_svg_dy(const lab_svg_axes *a, double length) {
    return fabs(length / lab__svg_span(a->y_min, a->y_max) * a->h);
}

/* "12", "0.5", "1.25e+06": short tick labels. */
static void lab__svg_tick_label(char *out, size_t cap, double v) {
    if (fabs(v) < 1e-12) v = 0.0;
    snprintf(out, cap, "%.3g", v);
}

void lab_svg_axes_draw(lab_svg *s, const lab_svg_axes *a) {
    char label[32];
    double left = a->x, right = a->x + a->w, top = a->y, bottom = a->y + a->h;
    lab_svg_line(s, left, bottom, right, bottom, "black", 1.0);
    lab_svg_line(s, left, top, left, bottom, "black", 1.0);
    for (int i = 0; a->x_ticks > 0 && i <= a->x_ticks; i++) {
        double v = a->x_min + (a->x_max - a->x_min) * i / a->x_ticks, px = lab_svg_x(a, v);
        lab_svg_line(s, px, bottom, px, bottom + 4, "black", 1.0);
        lab__svg_tick_label(label, sizeof label, v);
        lab_svg_text(s, px, bottom + 16, LAB_SVG_MIDDLE, 10, label);
    }
    for (int i = 0; a->y_ticks > 0 && i <= a->y_ticks; i++) {
        double v = a->y_min + (a->y_max - a->y_min) * i / a->y_ticks, py = lab_svg_y(a, v);
        lab_svg_line(s, left - 4, py, left, py, "black", 1.0);
        lab__svg_tick_label(label, sizeof label, v);
        lab_svg_text(s, left - 6, py + 3, LAB_SVG_END, 10, label);
    }
    if (a->x_label != NULL)
        lab_svg_text(s, left + a->w / 2, bottom + 32, LAB_SVG_MIDDLE, 11, a->x_label);
    if (a->y_label != NULL) {
        /* rotated about its own anchor, left of the tick labels */
        double tx = left - 40, ty = top + a->h / 2;
        lab__svg_printf(s,
                        "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\" font-size=\"11.0\" "
                        "transform=\"rotate(-90 %.2f %.2f)\">",
                        lab__svg_num(tx), lab__svg_num(ty), lab__svg_num(tx), lab__svg_num(ty));
        lab__svg_escaped(s, a->y_label);
        lab__svg_put(s, "</text>\n", 8);
    }
}

const char *lab_svg_color(int index) {
    static const char *const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                          "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                                          "#bcbd22", "#17becf"};
    int n = (int)(sizeof palette / sizeof palette[0]);
    return palette[((index % n) + n) % n];
}

/* ---------------------------------------------------------------------------------------------
   output */

const char *lab_svg_text_of(lab_svg *s) {
    if (s == NULL) return NULL;
    if (!s->finished) {
        lab__svg_put(s, "</svg>\n", 7);
        s->finished = 1;
    }
    return s->failed ? NULL : s->buf;
}

int lab_svg_write(lab_svg *s, const char *path) {
    const char *text = lab_svg_text_of(s);
    if (text == NULL) return MC_ERR_NO_MEMORY;
    return lab_write_text_atomic(text, path);
}
