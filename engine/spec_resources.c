/* The job spec's "resources" section: which allocator runs the job.
 *
 *   "resources": {"allocator": "slurm", "nodes": 1, "tasks_per_node": 1,
 *                 "time_limit": "HH:MM:SS", "partition": "gpu"}
 *
 * "local" (this daemon's devices) is the default and is left out of the
 * normalized form, so specs without the section normalize as before.  The
 * Slurm keys are refused with the local allocator rather than ignored. */
#include <stdio.h>
#include <string.h>

#include "engine/spec_fields.h"
#include "engine/spec_resources.h"

static const char *const allocator_names[] = {"local", "slurm"};

/* "H:MM:SS" (hours may exceed 24) -> seconds; -1 when malformed. */
static int parse_hms(const char *s)
{
	unsigned h, m, sec;
	int used = 0;
	if (sscanf(s, "%3u:%2u:%2u%n", &h, &m, &sec, &used) != 3 || s[used] || m > 59 || sec > 59 || strlen(s) < 7 ||
	    s[strlen(s) - 3] != ':' || s[strlen(s) - 6] != ':')
		return -1;
	return (int)(h * 3600 + m * 60 + sec);
}

static int get_count(struct tr_fields_ctx *c, const json_t *o, const char *key, int max, int *out)
{
	const json_t *n = json_object_get(o, key);
	if (!n)
		return 0;
	if (!json_is_integer(n) || json_integer_value(n) < 1 || json_integer_value(n) > max)
		return tr_fields_fail(c, key, "must be an integer from 1 to %d", max);
	*out = (int)json_integer_value(n);
	return 0;
}

int tr_spec_parse_resources(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	struct tr_resources *r = &((struct tr_spec *)base)->resources;
	memset(r, 0, sizeof *r);
	r->nodes = r->tasks_per_node = 1;
	if (!v)
		return 0;
	if (!json_is_object(v))
		return tr_fields_fail(c, NULL, "must be an object, e.g. {\"allocator\": \"slurm\"}");
	const char *key;
	const json_t *e;
	json_object_foreach((json_t *)v, key, e) {
		if (strcmp(key, "allocator") && strcmp(key, "nodes") && strcmp(key, "tasks_per_node") &&
		    strcmp(key, "time_limit") && strcmp(key, "partition"))
			return tr_fields_fail(c, key,
					      "unknown key '%s' (expected allocator, nodes, tasks_per_node, "
					      "time_limit, partition)",
					      key);
	}
	const json_t *a = json_object_get(v, "allocator");
	if (a) {
		const char *name = json_string_value(a);
		if (name && !strcmp(name, "local"))
			r->allocator = TR_ALLOC_LOCAL;
		else if (name && !strcmp(name, "slurm"))
			r->allocator = TR_ALLOC_SLURM;
		else
			return tr_fields_fail(c, "allocator", "must be \"local\" or \"slurm\"");
	}
	if (r->allocator != TR_ALLOC_SLURM) {
		json_object_foreach((json_t *)v, key, e) {
			if (strcmp(key, "allocator"))
				return tr_fields_fail(c, key, "applies to \"allocator\": \"slurm\" only");
		}
		return 0;
	}
	int rc;
	if ((rc = get_count(c, v, "nodes", TR_SPEC_MAX_NODES, &r->nodes)) ||
	    (rc = get_count(c, v, "tasks_per_node", TR_SPEC_MAX_TASKS_PER_NODE, &r->tasks_per_node)))
		return rc;
	if (r->nodes * r->tasks_per_node > TR_SLURM_MAX_TASKS)
		return tr_fields_fail(c, r->tasks_per_node > 1 ? "tasks_per_node" : "nodes",
				      "nodes x tasks_per_node must be at most %d (a job's processes)",
				      TR_SLURM_MAX_TASKS);
	const json_t *t = json_object_get(v, "time_limit");
	if (t) {
		r->time_limit_s = json_is_string(t) ? parse_hms(json_string_value(t)) : -1;
		if (r->time_limit_s <= 0)
			return tr_fields_fail(c, "time_limit", "must be a time \"HH:MM:SS\" longer than zero");
	}
	const json_t *p = json_object_get(v, "partition");
	if (p) {
		const char *s = json_string_value(p);
		size_t n = s ? strlen(s) : 0;
		if (!s || !n || n >= sizeof r->partition || n != json_string_length(p) ||
		    strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") != n)
			return tr_fields_fail(c, "partition",
					      "must be a Slurm partition name (letters, digits, '_', '-', '.'; "
					      "at most %zu bytes)",
					      sizeof r->partition - 1);
		memcpy(r->partition, s, n + 1);
	}
	return 0;
}

int tr_spec_emit_resources(const void *base, json_t *obj, const char *key)
{
	const struct tr_resources *r = &((const struct tr_spec *)base)->resources;
	if (r->allocator != TR_ALLOC_SLURM)
		return 0;
	json_t *o = json_pack("{s:s, s:i, s:i}", "allocator", allocator_names[1], "nodes", r->nodes, "tasks_per_node",
			      r->tasks_per_node);
	if (!o)
		return -1;
	if (r->time_limit_s > 0) {
		char hms[32];
		snprintf(hms, sizeof hms, "%02d:%02d:%02d", r->time_limit_s / 3600, r->time_limit_s / 60 % 60,
			 r->time_limit_s % 60);
		json_object_set_new(o, "time_limit", json_string(hms));
	}
	if (r->partition[0])
		json_object_set_new(o, "partition", json_string(r->partition));
	return json_object_set_new(obj, key, o);
}
