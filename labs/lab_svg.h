/* labs/lab_svg.h - a tiny SVG writer for lab figures (timelines, bars, layouts).

   Coordinates are pixels, origin top-left, y down (SVG's own convention). Text and attribute
   values are escaped; a number that is not finite is written as 0, so the document is always
   well-formed. Axes map data values to pixels:

       lab_svg *s = lab_svg_new(640, 240);
       lab_svg_axes ax = {.x = 60, .y = 20, .w = 560, .h = 180, .x_min = 0, .x_max = 12,
                          .y_min = 0, .y_max = 8, .x_ticks = 6, .y_ticks = 4,
                          .x_label = "time (ms)", .y_label = "rank"};
       lab_svg_axes_draw(s, &ax);
       lab_svg_rect(s, lab_svg_x(&ax, 1.5), lab_svg_y(&ax, 3), lab_svg_dx(&ax, 2.0),
                    lab_svg_dy(&ax, 1), lab_svg_color(0), "F0 on rank 2");   // tooltip
       lab_svg_text(s, 320, 14, LAB_SVG_MIDDLE, 12, "1F1B, PP=4");
       lab_svg_write(s, "results/lab08.timeline.svg");  // atomic; or lab_figure() in a lab
       lab_svg_free(s);

   Every drawing call records the first error (out of memory) and later calls do nothing;
   lab_svg_write and lab_svg_text_of report it. */
#ifndef MC_LAB_SVG_H_INCLUDED
#define MC_LAB_SVG_H_INCLUDED

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lab_svg lab_svg;

typedef enum lab_svg_anchor { LAB_SVG_START = 0, LAB_SVG_MIDDLE, LAB_SVG_END } lab_svg_anchor;

/* A plot area [x, x + w] x [y, y + h] in pixels showing [x_min, x_max] x [y_min, y_max];
   y_max is at the top. Ticks: how many intervals to label (0 = none). */
typedef struct lab_svg_axes {
    double x, y, w, h;
    double x_min, x_max, y_min, y_max;
    int x_ticks, y_ticks;
    const char *x_label, *y_label;   /* may be NULL */
} lab_svg_axes;

lab_svg *lab_svg_new(double width, double height);   /* NULL when out of memory */
void lab_svg_free(lab_svg *s);

/* fill / stroke: any SVG colour ("#1f77b4", "none", "black"); NULL means the default
   (fill "#888888", stroke "black"). title: a tooltip, or NULL. */
void lab_svg_rect(lab_svg *s, double x, double y, double w, double h, const char *fill,
                  const char *title);
void lab_svg_line(lab_svg *s, double x1, double y1, double x2, double y2, const char *stroke,
                  double width);
void lab_svg_text(lab_svg *s, double x, double y, lab_svg_anchor anchor, double size,
                  const char *text);
/* The frame, ticks with their values, and the two labels. */
void lab_svg_axes_draw(lab_svg *s, const lab_svg_axes *a);

/* Data value -> pixel (positions), and data length -> pixel length (sizes, >= 0). */
double lab_svg_x(const lab_svg_axes *a, double value);
double lab_svg_y(const lab_svg_axes *a, double value);
double lab_svg_dx(const lab_svg_axes *a, double length);
double lab_svg_dy(const lab_svg_axes *a, double length);

/* A palette of 10 distinguishable colours, cycled by index. */
const char *lab_svg_color(int index);

/* The finished document (the closing tag appended; drawing after this is refused), or NULL
   after an error. Owned by s. */
const char *lab_svg_text_of(lab_svg *s);
/* Finishes and writes the document atomically. 0, or a negative megatron_c status. */
int lab_svg_write(lab_svg *s, const char *path);

#ifdef __cplusplus
}
#endif
#endif /* MC_LAB_SVG_H_INCLUDED */
