/* Experiment requests (daemon/experiment_spec.h): the defaults filled in,
 * grid enumeration order, seeded sampling within its ranges and
 * independent of other trials, parameters set through JSON pointers
 * (array elements, RFC 6901 escapes), and an ASHA trial's end. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/job.h"
#include "daemon/experiment_spec.h"

#define SPEC                                                                                                      \
	"{\"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 8}, {\"type\": \"dense\", \"units\": 3}]},"   \
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 100, \"features\": 4, \"classes\": 3}}," \
	" \"batch_size\": 10, \"epochs\": 2, \"max_steps\": 7, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}"

static json_t *check(const char *search, const char *params, struct tr_error *err)
{
	char text[4096];
	snprintf(text, sizeof text, "{\"spec\": %s, \"search\": %s, \"parameters\": %s}", SPEC, search, params);
	json_t *body = json_loads(text, 0, NULL);
	cr_assert_not_null(body, "%s", text);
	json_t *req = tr_exp_request_check(body, err);
	json_decref(body);
	return req;
}

static json_t *trial(const json_t *req, int t, json_t **params)
{
	struct tr_exp_search s;
	struct tr_error err = {0};
	json_t *spec = NULL;
	cr_assert_eq(tr_exp_search_read(req, &s, &err), 0, "%s", err.message);
	cr_assert_eq(tr_exp_trial(req, &s, t, params, &spec, &err), 0, "%s", err.message);
	return spec;
}

Test(experiment_spec, defaults_are_filled_in)
{
	struct tr_error err = {0};
	json_t *req = check("{\"method\": \"asha\", \"max_trials\": 9, \"max_length\": {\"steps\": 90}}",
			    "{\"/optimizer/lr\": {\"log_uniform\": [0.001, 0.1]}}", &err);
	cr_assert_not_null(req, "%s", err.message);
	json_t *s = json_object_get(req, "search");
	cr_assert_str_eq(json_string_value(json_object_get(s, "metric")), "val_loss");
	cr_assert_str_eq(json_string_value(json_object_get(s, "goal")), "min");
	cr_assert_eq(json_integer_value(json_object_get(s, "reduction_factor")), 3);
	cr_assert_eq(json_integer_value(json_object_get(s, "min_length")), 10);
	cr_assert_eq(json_integer_value(json_object_get(s, "max_concurrent")), 2);
	cr_assert_eq(json_integer_value(json_object_get(s, "seed")), 0);
	struct tr_exp_search rs;
	cr_assert_eq(tr_exp_search_read(req, &rs, &err), 0);
	cr_assert_eq(rs.nrungs, 3);
	cr_assert(rs.rungs[0] == 10 && rs.rungs[1] == 30 && rs.rungs[2] == 90);
	json_decref(req);
}

/* Pointers in order: /model/layers/0/units before /optimizer/lr; the
 * last varies fastest. */
Test(experiment_spec, grid_enumerates_the_last_pointer_fastest)
{
	struct tr_error err = {0};
	json_t *req = check(
		"{\"method\": \"grid\"}",
		"{\"/optimizer/lr\": {\"grid\": [0.1, 0.2, 0.3]}, \"/model/layers/0/units\": {\"choice\": [4, 16]}}",
		&err);
	cr_assert_not_null(req, "%s", err.message);
	cr_assert_eq(json_integer_value(json_object_get(json_object_get(req, "search"), "max_trials")), 6);
	static const double lr[6] = {0.1, 0.2, 0.3, 0.1, 0.2, 0.3};
	static const int units[6] = {4, 4, 4, 16, 16, 16};
	for (int t = 0; t < 6; t++) {
		json_t *params, *spec = trial(req, t, &params);
		cr_assert_eq(json_real_value(json_object_get(params, "/optimizer/lr")), lr[t], "trial %d", t);
		cr_assert_eq(json_real_value(json_object_get(json_object_get(spec, "optimizer"), "lr")), lr[t]);
		json_t *layer0 = json_array_get(json_object_get(json_object_get(spec, "model"), "layers"), 0);
		cr_assert_eq(json_integer_value(json_object_get(layer0, "units")), units[t], "trial %d", t);
		json_decref(params);
		json_decref(spec);
	}
	json_decref(req);
}

Test(experiment_spec, sampling_is_seeded_and_in_range)
{
	struct tr_error err = {0};
	json_t *req = check(
		"{\"method\": \"random\", \"max_trials\": 50, \"seed\": 5}",
		"{\"/optimizer/lr\": {\"log_uniform\": [0.001, 0.1]}, \"/batch_size\": {\"int_uniform\": [2, 4]}}",
		&err);
	cr_assert_not_null(req, "%s", err.message);
	int seen[5] = {0};
	for (int t = 0; t < 50; t++) {
		json_t *params, *spec = trial(req, t, &params);
		double lr = json_real_value(json_object_get(params, "/optimizer/lr"));
		int64_t b = json_integer_value(json_object_get(params, "/batch_size"));
		cr_assert(lr >= 0.001 && lr <= 0.1, "trial %d: lr %g", t, lr);
		cr_assert(b >= 2 && b <= 4, "trial %d: batch %lld", t, (long long)b);
		seen[b]++;
		/* Asked again: the same values. */
		json_t *again, *spec2 = trial(req, t, &again);
		cr_assert(json_equal(params, again));
		json_decref(again);
		json_decref(spec2);
		json_decref(params);
		json_decref(spec);
	}
	cr_assert(seen[2] && seen[3] && seen[4], "int_uniform never took one of its values");
	json_decref(req);
}

Test(experiment_spec, asha_trials_end_at_max_length)
{
	struct tr_error err = {0};
	json_t *req = check("{\"method\": \"asha\", \"max_length\": {\"epochs\": 9}}",
			    "{\"/optimizer/lr\": {\"grid\": [0.1, 0.01]}}", &err);
	cr_assert_not_null(req, "%s", err.message);
	json_t *params, *spec = trial(req, 1, &params);
	cr_assert_eq(json_integer_value(json_object_get(spec, "epochs")), 9);
	cr_assert_null(json_object_get(spec, "max_steps"), "the spec's other end stays");
	cr_assert_eq(json_real_value(json_object_get(params, "/optimizer/lr")), 0.01);
	json_decref(params);
	json_decref(spec);
	json_decref(req);
}

Test(experiment_spec, pointer_escapes_and_refusals)
{
	struct tr_error err = {0};
	json_t *req = check("{\"method\": \"grid\"}", "{\"/optimizer/a~1b\": {\"grid\": [1]}}", &err);
	cr_assert_null(req, "an unknown key set through ~1 passes the job spec's check");
	cr_assert_eq(err.kind, TR_JOB_E_INVALID_SPEC);
	cr_assert_str_eq(err.pointer, "/parameters/~1optimizer~1a~01b", "%s", err.message);
	cr_assert(strstr(err.message, "trial 0"), "%s", err.message);
	cr_assert_null(check("{\"method\": \"grid\"}", "{\"/model/layers/2/units\": {\"grid\": [1]}}", &err));
	cr_assert_str_eq(err.pointer, "/parameters/~1model~1layers~12~1units");
	cr_assert_null(check("{\"method\": \"grid\"}", "{\"optimizer\": {\"grid\": [1]}}", &err));
	cr_assert_str_eq(err.pointer, "/parameters/optimizer");
	cr_assert_null(check("{\"method\": \"grid\"}", "{\"/seed\": {\"grid\": [1], \"choice\": [2]}}", &err));
	cr_assert_str_eq(err.pointer, "/parameters/~1seed");
	cr_assert_null(check("{\"method\": \"grid\", \"max_trials\": 3}", "{\"/seed\": {\"grid\": [1, 2]}}", &err));
	cr_assert_str_eq(err.pointer, "/search/max_trials");
	cr_assert_null(check("{\"method\": \"random\", \"max_length\": {\"steps\": 3}, \"max_trials\": 1}",
			     "{\"/seed\": {\"grid\": [1]}}", &err));
	cr_assert_str_eq(err.pointer, "/search/max_length");
}
