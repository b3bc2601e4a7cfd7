/* The job spec's "resources" section (engine/spec_resources.c): the local
 * default leaves the normalized form as it was, the Slurm keys round-trip,
 * and each bad value is refused at its JSON pointer. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "engine/spec.h"

static const char *base =
	"{\"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 2}]},"
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 8, \"features\": 2,"
	" \"classes\": 2}}, \"batch_size\": 4, \"epochs\": 1, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}%s}";

static int parse(const char *resources, struct tr_spec *spec, struct tr_error *err)
{
	char text[1024], extra[512] = "";
	if (resources)
		snprintf(extra, sizeof extra, ", \"resources\": %s", resources);
	snprintf(text, sizeof text, base, extra);
	memset(err, 0, sizeof *err);
	return tr_spec_parse_text(text, spec, err);
}

Test(spec_resources, absent_or_local_is_left_out_of_the_normalized_form)
{
	const char *forms[] = {NULL, "{}", "{\"allocator\": \"local\"}"};
	for (int i = 0; i < 3; i++) {
		struct tr_spec spec;
		struct tr_error err;
		cr_assert_eq(parse(forms[i], &spec, &err), 0, "%s: %s", forms[i] ? forms[i] : "absent", err.message);
		cr_expect_neq(spec.resources.allocator, TR_ALLOC_SLURM);
		json_t *j = tr_spec_to_json(&spec);
		cr_expect_null(json_object_get(j, "resources"));
		json_decref(j);
		tr_spec_finish(&spec);
	}
}

Test(spec_resources, slurm_round_trips)
{
	struct tr_spec spec;
	struct tr_error err;
	cr_assert_eq(parse("{\"allocator\": \"slurm\", \"time_limit\": \"26:03:09\", \"partition\": \"gpu-a.1\"}",
			   &spec, &err),
		     0, "%s", err.message);
	cr_expect_eq(spec.resources.allocator, TR_ALLOC_SLURM);
	cr_expect_eq(spec.resources.nodes, 1);
	cr_expect_eq(spec.resources.tasks_per_node, 1);
	cr_expect_eq(spec.resources.time_limit_s, 26 * 3600 + 3 * 60 + 9);
	cr_expect_str_eq(spec.resources.partition, "gpu-a.1");
	json_t *j = tr_spec_to_json(&spec);
	char *text = json_dumps(json_object_get(j, "resources"), JSON_COMPACT | JSON_SORT_KEYS);
	cr_expect_str_eq(text, "{\"allocator\":\"slurm\",\"nodes\":1,\"partition\":\"gpu-a.1\",\"tasks_per_node\":1,"
			       "\"time_limit\":\"26:03:09\"}");
	free(text);
	json_decref(j);
	tr_spec_finish(&spec);
}

Test(spec_resources, bad_values_name_their_pointer)
{
	static const struct {
		const char *resources, *pointer, *words;
	} rows[] = {
		{"[]", "/resources", "must be an object"},
		{"{\"allocator\": \"pbs\"}", "/resources/allocator", "\"local\" or \"slurm\""},
		{"{\"allocator\": \"slurm\", \"gpus\": 2}", "/resources/gpus", "unknown key"},
		{"{\"partition\": \"gpu\"}", "/resources/partition", "\"allocator\": \"slurm\" only"},
		{"{\"allocator\": \"slurm\", \"nodes\": 0}", "/resources/nodes", "from 1 to"},
		{"{\"allocator\": \"slurm\", \"tasks_per_node\": 2.5}", "/resources/tasks_per_node", "from 1 to"},
		{"{\"allocator\": \"slurm\", \"tasks_per_node\": 2}", "/resources/tasks_per_node", "exact mode"},
		{"{\"allocator\": \"slurm\", \"nodes\": 2}", "/resources/nodes", "exact mode"},
		{"{\"allocator\": \"slurm\", \"nodes\": 5, \"tasks_per_node\": 13}", "/resources/tasks_per_node",
		 "at most 64"},
		{"{\"allocator\": \"slurm\", \"time_limit\": \"10\"}", "/resources/time_limit", "HH:MM:SS"},
		{"{\"allocator\": \"slurm\", \"time_limit\": \"1:60:00\"}", "/resources/time_limit", "HH:MM:SS"},
		{"{\"allocator\": \"slurm\", \"time_limit\": \"00:00:00\"}", "/resources/time_limit",
		 "longer than zero"},
		{"{\"allocator\": \"slurm\", \"time_limit\": 60}", "/resources/time_limit", "HH:MM:SS"},
		{"{\"allocator\": \"slurm\", \"partition\": \"a b\"}", "/resources/partition", "partition name"},
		{"{\"allocator\": \"slurm\", \"partition\": \"\"}", "/resources/partition", "partition name"},
	};
	for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
		struct tr_spec spec;
		struct tr_error err;
		cr_expect_neq(parse(rows[i].resources, &spec, &err), 0, "%s was accepted", rows[i].resources);
		cr_expect_str_eq(err.pointer, rows[i].pointer, "%s: pointer %s", rows[i].resources, err.pointer);
		cr_expect_not_null(strstr(err.message, rows[i].words), "%s: '%s' lacks '%s'", rows[i].resources,
				   err.message, rows[i].words);
	}
}

/* Several tasks are the job's processes: exact mode runs them, and a
 * "processes" count must be the task count. */
Test(spec_resources, several_tasks_in_exact_mode)
{
	static const char *fmt =
		"{\"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 2}]},"
		" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 8, \"features\": 2,"
		" \"classes\": 2}}, \"batch_size\": 4, \"epochs\": 1, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1},"
		" \"exact\": true%s, \"resources\": {\"allocator\": \"slurm\", \"nodes\": 2, \"tasks_per_node\": 3}}";
	char text[1024];
	struct tr_spec spec;
	struct tr_error err = {0};
	snprintf(text, sizeof text, fmt, "");
	cr_assert_eq(tr_spec_parse_text(text, &spec, &err), 0, "%s", err.message);
	cr_expect_eq(spec.resources.nodes * spec.resources.tasks_per_node, 6);
	tr_spec_finish(&spec);
	snprintf(text, sizeof text, fmt, ", \"processes\": 6");
	cr_assert_eq(tr_spec_parse_text(text, &spec, &err), 0, "%s", err.message);
	tr_spec_finish(&spec);
	snprintf(text, sizeof text, fmt, ", \"processes\": 2");
	cr_expect_neq(tr_spec_parse_text(text, &spec, &err), 0);
	cr_expect_str_eq(err.pointer, "/processes");
	cr_expect_not_null(strstr(err.message, "nodes x tasks_per_node (6)"), "%s", err.message);
}
