/* An experiment's request (docs/experiments.md): its checks and the
 * trial specs it makes.  Pure functions of the JSON, apart from parsing
 * each trial's spec as a job spec (engine/spec.h); the daemon's own
 * checks (devices, data paths) come when a trial is submitted.
 */
#ifndef TR_DAEMON_EXPERIMENT_SPEC_H
#define TR_DAEMON_EXPERIMENT_SPEC_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"
#include "core/searcher.h"

#define TR_EXP_MAX_TRIALS 1000
#define TR_EXP_MAX_PARAMS 16

/* The parsed search, with defaults filled in. */
struct tr_exp_search {
	enum { TR_EXP_GRID, TR_EXP_RANDOM, TR_EXP_ASHA } method;
	const char *metric; /* borrowed from the request */
	bool maximize;
	int max_trials, max_concurrent;
	uint64_t seed;
	bool epochs;        /* asha: lengths in epochs, else steps */
	int64_t max_length; /* asha; for grid and random the spec's own length (0 unknown) */
	int64_t min_length;
	int reduction_factor;
	int nrungs; /* 1 for grid and random */
	int64_t rungs[TR_SEARCH_MAX_RUNGS];
};

/* Checks an experiment request body (borrowed) and returns its normalized
 * form, a new reference {"name", "spec", "search" (defaults filled),
 * "parameters"}, having parsed every trial's spec as a job spec.  NULL
 * with err (kind TR_JOB_E_INVALID_SPEC, pointer into the body) filled. */
json_t *tr_exp_request_check(const json_t *body, struct tr_error *err);

/* Reads a normalized request's search (request borrowed; out borrows
 * from it).  0, or -1 with err filled (a request stored by a newer
 * trainerd). */
int tr_exp_search_read(const json_t *request, struct tr_exp_search *out, struct tr_error *err);

/* Trial t's values {pointer: value} and its job spec (new references):
 * the base spec with the values set and, for asha, its end set to
 * max_length.  0, or -1 with err filled (pointer into the request). */
int tr_exp_trial(const json_t *request, const struct tr_exp_search *search, int trial, json_t **params, json_t **spec,
		 struct tr_error *err);

#endif
