/* Experiment requests: checks, defaults and trial specs
 * (daemon/experiment_spec.h, docs/experiments.md). */
#include "daemon/experiment_spec.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/job.h"
#include "engine/spec.h"

#define FAIL(err, ptr, ...) tr_error_set((err), -1, TR_JOB_E_INVALID_SPEC, (ptr), __VA_ARGS__)

enum kind { K_LOG_UNIFORM, K_UNIFORM, K_INT_UNIFORM, K_CHOICE, K_GRID, K_NKINDS };
static const char *const kind_names[K_NKINDS] = {"log_uniform", "uniform", "int_uniform", "choice", "grid"};

struct param {
	const char *pointer; /* borrowed key of the request's parameters */
	enum kind kind;
	const json_t *value; /* borrowed: the [low, high] or the list */
	bool enumerated;     /* part of the grid this method walks */
};

/* "/parameters/" + the pointer with RFC 6901's escapes (~0, ~1). */
static void param_ptr(char *buf, size_t len, const char *pointer, const char *suffix)
{
	size_t n = (size_t)snprintf(buf, len, "/parameters/");
	for (const char *p = pointer; *p && n + 3 < len; p++) {
		if (*p == '~' || *p == '/') {
			buf[n++] = '~';
			buf[n++] = *p == '~' ? '0' : '1';
		} else {
			buf[n++] = *p;
		}
	}
	buf[n < len ? n : len - 1] = '\0';
	if (suffix)
		snprintf(buf + strlen(buf), len - strlen(buf), "%s", suffix);
}

/* The next reference token of pointer p into tok (unescaped); advances p.
 * false at the end or for a malformed escape. */
static bool next_token(const char **p, char *tok, size_t len, bool *bad)
{
	size_t n = 0;
	if (**p != '/')
		return false;
	(*p)++;
	while (**p && **p != '/') {
		char c = **p;
		if (c == '~') {
			char e = (*p)[1];
			if (e != '0' && e != '1') {
				*bad = true;
				return false;
			}
			c = e == '0' ? '~' : '/';
			(*p)++;
		}
		if (n + 1 < len)
			tok[n++] = c;
		(*p)++;
	}
	tok[n] = '\0';
	return true;
}

static bool array_index(const char *tok, size_t size, size_t *out)
{
	char *end;
	if (!*tok || (tok[0] == '0' && tok[1]) || tok[0] < '0' || tok[0] > '9')
		return false;
	unsigned long long v = strtoull(tok, &end, 10);
	if (*end || v >= size)
		return false;
	*out = (size_t)v;
	return true;
}

/* Sets doc's value at pointer to value (a new reference taken); the
 * parent must exist, an array index must exist.  0, or -1 with why set. */
static int pointer_set(json_t *doc, const char *pointer, json_t *value, const char **why)
{
	char tok[256];
	const char *p = pointer;
	bool bad = false;
	json_t *cur = doc;

	*why = NULL;
	if (!next_token(&p, tok, sizeof tok, &bad)) {
		json_decref(value);
		*why = bad ? "a '~' must be followed by 0 or 1"
			   : "must be a JSON pointer into the spec (\"/optimizer/lr\")";
		return -1;
	}
	for (;;) {
		char next[256];
		const char *q = p;
		bool last = !next_token(&q, next, sizeof next, &bad);
		if (bad) {
			json_decref(value);
			*why = "a '~' must be followed by 0 or 1";
			return -1;
		}
		size_t i;
		if (last) {
			if (json_is_object(cur))
				return json_object_set_new(cur, tok, value) == 0 ? 0 : -1;
			if (json_is_array(cur) && array_index(tok, json_array_size(cur), &i))
				return json_array_set_new(cur, i, value) == 0 ? 0 : -1;
			json_decref(value);
			*why = json_is_array(cur) ? "names an array element that the spec does not have"
						  : "names a place inside a value that is not an object or array";
			return -1;
		}
		json_t *child = json_is_object(cur) ? json_object_get(cur, tok)
				: json_is_array(cur) && array_index(tok, json_array_size(cur), &i)
					? json_array_get(cur, i)
					: NULL;
		if (!child) {
			json_decref(value);
			*why = "names a place whose parent the spec does not have";
			return -1;
		}
		cur = child;
		p = q;
		snprintf(tok, sizeof tok, "%s", next);
	}
}

static bool is_int(const json_t *v, int64_t lo, int64_t hi)
{
	return json_is_integer(v) && json_integer_value(v) >= lo && json_integer_value(v) <= hi;
}

static int cmp_param(const void *a, const void *b)
{
	return strcmp(((const struct param *)a)->pointer, ((const struct param *)b)->pointer);
}

/* Reads and checks request's parameters into ps (sorted by pointer). */
static int read_params(const json_t *params, int method, struct param *ps, int *n, struct tr_error *err)
{
	const char *key;
	json_t *v;
	char ptr[300];

	*n = 0;
	if (!json_is_object(params) || json_object_size(params) < 1 || json_object_size(params) > TR_EXP_MAX_PARAMS)
		return FAIL(
			err, "/parameters",
			"/parameters: must be an object of 1 to %d values, each named by a JSON pointer into the spec",
			TR_EXP_MAX_PARAMS);
	json_object_foreach((json_t *)params, key, v) {
		struct param *p = &ps[(*n)++];
		param_ptr(ptr, sizeof ptr, key, NULL);
		p->pointer = key;
		if (key[0] != '/')
			return FAIL(err, ptr, "%s: the name must be a JSON pointer into the spec (\"/optimizer/lr\")",
				    ptr);
		if (!json_is_object(v) || json_object_size(v) != 1)
			return FAIL(
				err, ptr,
				"%s: must be an object with one key: log_uniform, uniform, int_uniform, choice or grid",
				ptr);
		const char *k = json_object_iter_key(json_object_iter(v));
		json_t *val = json_object_iter_value(json_object_iter(v));
		int kind = -1;
		for (int i = 0; i < K_NKINDS; i++)
			if (strcmp(k, kind_names[i]) == 0)
				kind = i;
		param_ptr(ptr, sizeof ptr, key, "/");
		snprintf(ptr + strlen(ptr), sizeof ptr - strlen(ptr), "%s", k);
		if (kind < 0)
			return FAIL(err, ptr,
				    "%s: unknown kind '%s' (log_uniform, uniform, int_uniform, choice or grid)", ptr,
				    k);
		p->kind = (enum kind)kind;
		p->value = val;
		if (kind == K_CHOICE || kind == K_GRID) {
			if (!json_is_array(val) || json_array_size(val) < 1 || json_array_size(val) > TR_EXP_MAX_TRIALS)
				return FAIL(err, ptr, "%s: must be a list of 1 to %d values", ptr, TR_EXP_MAX_TRIALS);
		} else if (kind == K_INT_UNIFORM) {
			const json_t *lo = json_array_get(val, 0), *hi = json_array_get(val, 1);
			if (!json_is_array(val) || json_array_size(val) != 2 ||
			    !is_int(lo, -(INT64_C(1) << 52), INT64_C(1) << 52) ||
			    !is_int(hi, -(INT64_C(1) << 52), INT64_C(1) << 52) ||
			    json_integer_value(lo) > json_integer_value(hi))
				return FAIL(err, ptr, "%s: must be [low, high], integers with low <= high", ptr);
		} else {
			const json_t *lo = json_array_get(val, 0), *hi = json_array_get(val, 1);
			double l = json_number_value(lo), h = json_number_value(hi);
			if (!json_is_array(val) || json_array_size(val) != 2 || !json_is_number(lo) ||
			    !json_is_number(hi) || !(l < h) || !isfinite(l) || !isfinite(h) ||
			    (kind == K_LOG_UNIFORM && !(l > 0)))
				return FAIL(err, ptr, "%s: must be [low, high] with %s", ptr,
					    kind == K_LOG_UNIFORM ? "0 < low < high" : "low < high");
		}
		p->enumerated = kind == K_GRID || (kind == K_CHOICE && method == TR_EXP_GRID);
		if (method == TR_EXP_GRID && !p->enumerated)
			return FAIL(err, ptr, "%s: a grid search takes only grid or choice values", ptr);
	}
	qsort(ps, (size_t)*n, sizeof *ps, cmp_param);
	return 0;
}

/* The number of points of the enumerated parameters, capped above
 * TR_EXP_MAX_TRIALS (only whether it exceeds matters then). */
static int64_t grid_size(const struct param *ps, int n)
{
	int64_t size = 1;
	for (int i = 0; i < n; i++)
		if (ps[i].enumerated) {
			size *= (int64_t)json_array_size(ps[i].value);
			if (size > TR_EXP_MAX_TRIALS)
				return TR_EXP_MAX_TRIALS + 1;
		}
	return size;
}

static bool all_enumerated(const struct param *ps, int n)
{
	for (int i = 0; i < n; i++)
		if (!ps[i].enumerated)
			return false;
	return true;
}

/* The spec's own length for grid and random (0: unknown). */
static void spec_length(const json_t *spec, struct tr_exp_search *s)
{
	const json_t *steps = json_object_get(spec, "max_steps"), *epochs = json_object_get(spec, "epochs");
	s->epochs = !json_is_integer(steps) && json_is_integer(epochs);
	s->max_length = json_is_integer(steps) ? json_integer_value(steps) : json_integer_value(epochs);
}

/* Checks and fills the search; search is modified in place (defaults
 * added).  ps/n: the parameters, read already. */
static int check_search(json_t *search, const json_t *spec, const struct param *ps, int n, struct tr_error *err)
{
	static const char *const keys[] = {"method", "metric",     "goal",       "max_trials",       "max_concurrent",
					   "seed",   "max_length", "min_length", "reduction_factor", NULL};
	const char *key;
	json_t *v;
	json_object_foreach(search, key, v) {
		bool known = false;
		for (int i = 0; keys[i]; i++)
			known |= strcmp(key, keys[i]) == 0;
		if (!known) {
			char p[300];
			snprintf(p, sizeof p, "/search/%.200s", key);
			return FAIL(err, p, "%s: unknown key '%.200s'", p, key);
		}
	}
	const char *method = json_string_value(json_object_get(search, "method"));
	bool asha = method && strcmp(method, "asha") == 0;
	bool grid = method && strcmp(method, "grid") == 0;
	if (!asha && !grid && !(method && strcmp(method, "random") == 0))
		return FAIL(err, "/search/method", "/search/method: must be grid, random or asha");
	v = json_object_get(search, "metric");
	if (v && (!json_is_string(v) || json_string_length(v) < 1 || json_string_length(v) > 128))
		return FAIL(err, "/search/metric",
			    "/search/metric: must be a metric's name (val_loss, val_accuracy, ...)");
	if (!v)
		json_object_set_new(search, "metric", json_string("val_loss"));
	v = json_object_get(search, "goal");
	if (v && (!json_is_string(v) || (strcmp(json_string_value(v), "min") && strcmp(json_string_value(v), "max"))))
		return FAIL(err, "/search/goal", "/search/goal: must be min or max");
	if (!v)
		json_object_set_new(search, "goal", json_string("min"));
	int64_t size = grid_size(ps, n);
	v = json_object_get(search, "max_trials");
	if (v && !is_int(v, 1, TR_EXP_MAX_TRIALS))
		return FAIL(err, "/search/max_trials", "/search/max_trials: must be an integer in [1, %d]",
			    TR_EXP_MAX_TRIALS);
	if (grid && size > TR_EXP_MAX_TRIALS && !v)
		return FAIL(err, "/parameters",
			    "/parameters: the grid has more than %d points; give /search/max_trials",
			    TR_EXP_MAX_TRIALS);
	if (grid && v && json_integer_value(v) > size)
		return FAIL(err, "/search/max_trials", "/search/max_trials: the grid has only %lld points",
			    (long long)size);
	if (!v && !grid && !all_enumerated(ps, n))
		return FAIL(err, "/search/max_trials",
			    "/search/max_trials: required: %s samples its values, so it needs to know how many trials",
			    method);
	if (!v && size > TR_EXP_MAX_TRIALS)
		return FAIL(err, "/search/max_trials",
			    "/search/max_trials: the grid has more than %d points; give how many", TR_EXP_MAX_TRIALS);
	if (!v)
		json_object_set_new(search, "max_trials", json_integer(size));
	v = json_object_get(search, "max_concurrent");
	if (v && !is_int(v, 1, TR_EXP_MAX_TRIALS))
		return FAIL(err, "/search/max_concurrent", "/search/max_concurrent: must be an integer in [1, %d]",
			    TR_EXP_MAX_TRIALS);
	if (!v)
		json_object_set_new(search, "max_concurrent", json_integer(2));
	v = json_object_get(search, "seed");
	if (v && !is_int(v, 0, INT64_MAX))
		return FAIL(err, "/search/seed", "/search/seed: must be an integer >= 0");
	if (!v)
		json_object_set_new(search, "seed", json_integer(0));
	if (!asha) {
		static const char *const asha_only[] = {"max_length", "min_length", "reduction_factor", NULL};
		for (int i = 0; asha_only[i]; i++)
			if (json_object_get(search, asha_only[i])) {
				char p[64];
				snprintf(p, sizeof p, "/search/%s", asha_only[i]);
				return FAIL(
					err, p,
					"%s: only an asha search takes it (a %s search trains every trial to the spec's end)",
					p, method);
			}
		return 0;
	}
	v = json_object_get(search, "max_length");
	const char *unit =
		v && json_is_object(v) && json_object_size(v) == 1 ? json_object_iter_key(json_object_iter(v)) : NULL;
	json_t *len = unit ? json_object_get(v, unit) : NULL;
	if (!unit || (strcmp(unit, "steps") && strcmp(unit, "epochs")) ||
	    !is_int(len, 1, strcmp(unit, "steps") == 0 ? INT64_C(1) << 40 : INT64_C(1) << 20))
		return FAIL(
			err, "/search/max_length",
			"/search/max_length: required for asha: {\"steps\": N} or {\"epochs\": N}, N a positive integer");
	int64_t max_length = json_integer_value(len);
	v = json_object_get(search, "reduction_factor");
	if (v && !is_int(v, 2, 100))
		return FAIL(err, "/search/reduction_factor",
			    "/search/reduction_factor: must be an integer in [2, 100]");
	if (!v)
		json_object_set_new(search, "reduction_factor", json_integer(3));
	int r = (int)json_integer_value(json_object_get(search, "reduction_factor"));
	v = json_object_get(search, "min_length");
	if (v && !is_int(v, 1, max_length))
		return FAIL(err, "/search/min_length",
			    "/search/min_length: must be an integer in [1, max_length = %lld]", (long long)max_length);
	if (!v)
		json_object_set_new(search, "min_length",
				    json_integer(tr_search_default_min_length(
					    max_length, r,
					    (int)json_integer_value(json_object_get(search, "max_trials")))));
	(void)spec;
	return 0;
}

int tr_exp_search_read(const json_t *request, struct tr_exp_search *out, struct tr_error *err)
{
	const json_t *search = json_object_get(request, "search");
	const char *method = json_string_value(json_object_get(search, "method"));

	memset(out, 0, sizeof *out);
	if (!method)
		return tr_error_set(err, -1, TR_JOB_E_INTERNAL, NULL, "the stored experiment has no search method");
	out->method = strcmp(method, "grid") == 0     ? TR_EXP_GRID
		      : strcmp(method, "random") == 0 ? TR_EXP_RANDOM
						      : TR_EXP_ASHA;
	out->metric = json_string_value(json_object_get(search, "metric"));
	out->maximize = strcmp(json_string_value(json_object_get(search, "goal")), "max") == 0;
	out->max_trials = (int)json_integer_value(json_object_get(search, "max_trials"));
	out->max_concurrent = (int)json_integer_value(json_object_get(search, "max_concurrent"));
	out->seed = (uint64_t)json_integer_value(json_object_get(search, "seed"));
	out->nrungs = 1;
	if (out->method != TR_EXP_ASHA) {
		spec_length(json_object_get(request, "spec"), out);
		out->rungs[0] = out->max_length;
		return 0;
	}
	const json_t *ml = json_object_get(search, "max_length");
	out->epochs = json_object_get(ml, "epochs") != NULL;
	out->max_length = json_integer_value(json_object_get(ml, out->epochs ? "epochs" : "steps"));
	out->min_length = json_integer_value(json_object_get(search, "min_length"));
	out->reduction_factor = (int)json_integer_value(json_object_get(search, "reduction_factor"));
	out->nrungs = tr_search_rungs(out->max_length, out->min_length, out->reduction_factor, out->rungs);
	return 0;
}

/* The value parameter p takes in trial t. */
static json_t *param_value(const struct param *p, const struct tr_exp_search *s, int t, int64_t grid_index)
{
	double u = tr_search_uniform(s->seed, t, p->pointer);
	if (p->enumerated)
		return json_deep_copy(json_array_get(p->value, (size_t)grid_index));
	if (p->kind == K_CHOICE) {
		size_t n = json_array_size(p->value);
		size_t i = (size_t)(u * (double)n);
		return json_deep_copy(json_array_get(p->value, i < n ? i : n - 1));
	}
	if (p->kind == K_INT_UNIFORM) {
		int64_t lo = json_integer_value(json_array_get(p->value, 0)),
			hi = json_integer_value(json_array_get(p->value, 1));
		int64_t v = lo + (int64_t)(u * (double)(hi - lo + 1));
		return json_integer(v > hi ? hi : v);
	}
	double lo = json_number_value(json_array_get(p->value, 0)), hi = json_number_value(json_array_get(p->value, 1));
	if (p->kind == K_LOG_UNIFORM)
		return json_real(exp(log(lo) + u * (log(hi) - log(lo))));
	return json_real(lo + u * (hi - lo));
}

int tr_exp_trial(const json_t *request, const struct tr_exp_search *search, int trial, json_t **params_out,
		 json_t **spec_out, struct tr_error *err)
{
	struct param ps[TR_EXP_MAX_PARAMS];
	int n = 0;
	char ptr[300];

	*params_out = *spec_out = NULL;
	if (read_params(json_object_get(request, "parameters"), search->method, ps, &n, err) < 0)
		return -1;
	json_t *spec = json_deep_copy(json_object_get(request, "spec"));
	json_t *values = json_object();
	/* The grid point: the last parameter in pointer order varies fastest. */
	int64_t size = grid_size(ps, n), idx = size > 0 ? trial % size : 0;
	int64_t point[TR_EXP_MAX_PARAMS] = {0};
	for (int i = n - 1; i >= 0; i--)
		if (ps[i].enumerated) {
			int64_t m = (int64_t)json_array_size(ps[i].value);
			point[i] = idx % m;
			idx /= m;
		}
	for (int i = 0; i < n; i++) {
		json_t *v = param_value(&ps[i], search, trial, point[i]);
		const char *why;
		json_object_set(values, ps[i].pointer, v);
		if (pointer_set(spec, ps[i].pointer, v, &why) < 0) {
			param_ptr(ptr, sizeof ptr, ps[i].pointer, NULL);
			tr_error_set(err, -1, TR_JOB_E_INVALID_SPEC, ptr, "%s: %s", ptr, why ? why : "cannot be set");
			goto fail;
		}
	}
	if (search->method == TR_EXP_ASHA) {
		/* The full run's end, so that the schedule is the full run's. */
		json_object_del(spec, "max_steps");
		json_object_del(spec, "epochs");
		json_object_set_new(spec, search->epochs ? "epochs" : "max_steps", json_integer(search->max_length));
	}
	*params_out = values;
	*spec_out = spec;
	return 0;
fail:
	json_decref(values);
	json_decref(spec);
	return -1;
}

/* The parameter whose pointer is spec_ptr or a prefix of it (a trial's
 * spec error is about that value), or NULL. */
static const char *param_of(const json_t *params, const char *spec_ptr)
{
	const char *key;
	json_t *v;
	json_object_foreach((json_t *)params, key, v) {
		size_t k = strlen(key);
		if (strncmp(spec_ptr, key, k) == 0 && (spec_ptr[k] == '\0' || spec_ptr[k] == '/'))
			return key;
	}
	return NULL;
}

json_t *tr_exp_request_check(const json_t *body, struct tr_error *err)
{
	static const char *const keys[] = {"name", "spec", "search", "parameters", NULL};
	struct param ps[TR_EXP_MAX_PARAMS];
	int n = 0;
	const char *key;
	json_t *v, *out = NULL;

	json_object_foreach((json_t *)body, key, v) {
		bool known = false;
		for (int i = 0; keys[i]; i++)
			known |= strcmp(key, keys[i]) == 0;
		if (!known) {
			char p[300];
			snprintf(p, sizeof p, "/%.250s", key);
			tr_error_set(err, -1, TR_JOB_E_INVALID_SPEC, p,
				     "%s: unknown key (an experiment has name, spec, search and parameters)", p);
			return NULL;
		}
	}
	v = json_object_get(body, "name");
	if (v && (!json_is_string(v) || json_string_length(v) < 1 || json_string_length(v) > 200)) {
		FAIL(err, "/name", "/name: must be a string of 1 to 200 characters");
		return NULL;
	}
	const json_t *spec = json_object_get(body, "spec");
	if (!json_is_object(spec)) {
		FAIL(err, "/spec", "/spec: required: the base job spec, an object");
		return NULL;
	}
	json_t *search = json_deep_copy(json_object_get(body, "search"));
	if (!json_is_object(search)) {
		json_decref(search);
		FAIL(err, "/search", "/search: required: an object with method (grid, random or asha)");
		return NULL;
	}
	const char *method = json_string_value(json_object_get(search, "method"));
	int m = !method                         ? -1
		: strcmp(method, "grid") == 0   ? TR_EXP_GRID
		: strcmp(method, "random") == 0 ? TR_EXP_RANDOM
						: TR_EXP_ASHA;
	if (m < 0 || (m == TR_EXP_ASHA && strcmp(method, "asha") != 0)) {
		json_decref(search);
		FAIL(err, "/search/method", "/search/method: must be grid, random or asha");
		return NULL;
	}
	if (read_params(json_object_get(body, "parameters"), m, ps, &n, err) < 0 ||
	    check_search(search, spec, ps, n, err) < 0) {
		json_decref(search);
		return NULL;
	}
	out = json_pack("{s:s, s:O, s:o, s:O}", "name", v ? json_string_value(v) : "experiment", "spec", spec, "search",
			search, "parameters", json_object_get(body, "parameters"));
	struct tr_exp_search s;
	if (!out || tr_exp_search_read(out, &s, err) < 0)
		goto fail;
	/* Every trial's spec parses as a job spec: an error names the
	 * parameter it is about (or the base spec's place) and the trial. */
	for (int t = 0; t < s.max_trials; t++) {
		json_t *values, *tspec;
		struct tr_spec parsed;
		struct tr_error serr = {0};
		if (tr_exp_trial(out, &s, t, &values, &tspec, err) < 0)
			goto fail;
		int rc = tr_spec_parse(tspec, &parsed, &serr);
		if (rc == 0)
			tr_spec_finish(&parsed);
		json_decref(tspec);
		if (rc < 0) {
			const char *p = param_of(json_object_get(out, "parameters"), serr.pointer);
			char *vals = json_dumps(values, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(9));
			char ptr[300];
			if (p)
				param_ptr(ptr, sizeof ptr, p, NULL);
			else
				snprintf(ptr, sizeof ptr, "/spec%s", serr.pointer);
			tr_error_set(err, -1, TR_JOB_E_INVALID_SPEC, ptr, "%s: trial %d %s: %s", ptr, t,
				     vals ? vals : "", serr.message);
			free(vals);
			json_decref(values);
			goto fail;
		}
		json_decref(values);
	}
	return out;
fail:
	json_decref(out);
	return NULL;
}
