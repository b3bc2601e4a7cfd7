/* The measured route choices of the CPU backend, kept for the process and
 * in the per-machine files of tr_cpu_conv_cache_open (cpu_conv_choice.c):
 * conv2d layers' (im2col or oneDNN) and dense layers' (OpenBLAS or
 * oneDNN, shapes "dense ...", cpu_dense_choice.c).  route is 1 for the
 * route that is not oneDNN (TR_CPU_CONV_IM2COL, TR_CPU_GEMM_OPENBLAS) and
 * 2 for oneDNN; ms[0] and ms[1] are their measured times. */
#ifndef TR_CPU_CHOICE_STORE_H
#define TR_CPU_CHOICE_STORE_H

#include <stdbool.h>

/* Whether a choice for shape is kept; then *route and ms. */
bool tr_cpu_choice_find(const char *shape, int *route, double ms[2]);
/* Keeps a measured choice unless one for shape is kept already (another
 * job measured the shape meanwhile: the first decision stays); returns
 * the route kept. */
int tr_cpu_choice_keep(const char *shape, int route, const double ms[2]);

#endif
