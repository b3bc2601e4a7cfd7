/* A Slurm requeue seen as a preemption (daemon/slurm.h): when Slurm holds
 * a requeued job back, the job is `preempted` with a preemption record
 * of the shape daemon/preemption.c writes, naming Slurm as the cause. */
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/slurm.h"

bool tr_slurm_held_after_requeue(const struct tr_slurm_job_state *st)
{
	/* Not COMPLETING: a job that ends for good after a restart passes
	 * through it too.  By PENDING (or REQUEUED once the steps are gone)
	 * the worker has ended, with its checkpoint written. */
	static const char *const held[] = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", NULL};
	if (st->restarts <= 0)
		return false;
	for (int i = 0; held[i]; i++)
		if (!strcmp(st->state, held[i]))
			return true;
	return false;
}

int64_t tr_slurm_checkpoint_step(const char *dir)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/checkpoint.safetensors", dir);
	FILE *f = fopen(path, "rb");
	if (!f)
		return -1;
	uint8_t len8[8];
	uint64_t n = 0;
	int64_t step = -1;
	if (fread(len8, 1, 8, f) == 8) {
		for (int i = 7; i >= 0; i--)
			n = n << 8 | len8[i];
	}
	/* Only the header is read: the weights may be large. */
	char *head = n > 0 && n < (64u << 20) ? malloc(n) : NULL;
	if (head && fread(head, 1, n, f) == n) {
		json_t *h = json_loadb(head, n, 0, NULL);
		const char *s = json_string_value(json_object_get(json_object_get(h, "__metadata__"), "step"));
		char *end = NULL;
		long long v = s ? strtoll(s, &end, 10) : -1;
		if (s && end != s && *end == 0 && v >= 0)
			step = v;
		json_decref(h);
	}
	free(head);
	fclose(f);
	return step;
}

char *tr_slurm_preemption_json(const char *slurm_id, const struct tr_slurm_job_state *st, int priority, int64_t step,
			       const char *at)
{
	char message[400];
	bool kept = step >= 0;
	if (kept)
		snprintf(message, sizeof message,
			 "preempted by Slurm: Slurm job %s was requeued (restart %d, reason %s) after step %lld, "
			 "with a checkpoint; it resumes when Slurm starts it again",
			 slurm_id, st->restarts, st->reason[0] ? st->reason : "none", (long long)step);
	else
		snprintf(message, sizeof message,
			 "preempted by Slurm: Slurm job %s was requeued (restart %d, reason %s) before its first "
			 "checkpoint; it starts again from step 0 when Slurm starts it again",
			 slurm_id, st->restarts, st->reason[0] ? st->reason : "none");
	/* "checkpoint": the worker stopped at a step boundary with a
	 * checkpoint (TERM or USR1); "hard": it left none, the steps are lost. */
	json_t *o = json_pack("{s:s, s:i, s:s, s:I, s:s, s:s, s:s, s:i, s:s}", "by", "slurm", "priority", priority,
			      "at", at, "step", (json_int_t)(kept ? step : 0), "mode", kept ? "checkpoint" : "hard",
			      "message", message, "slurm_job_id", slurm_id, "restarts", st->restarts, "reason",
			      st->reason);
	char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	return text;
}
