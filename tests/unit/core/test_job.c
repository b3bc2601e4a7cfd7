/* The job module (core/job.h): every state x request cell of the
 * transition table against the behaviour the daemon promises, the
 * terminal predicate, state names both ways, refusal wording, and RFC 3339
 * times (core/rfc3339.h). */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/job.h"
#include "core/rfc3339.h"

#define R 'R' /* refused (409) */
#define K 'K' /* legal, state unchanged */
#define S 'S' /* set at once */
#define G 'G' /* the runner is signalled */

/* The expected table, written out independently of core/job.c: rows in
 * enum order (queued running stopping paused stopped completed failed
 * cancelled interrupted preempted), columns cancel stop pause resume priority
 * delete checkpoint; for S and G the state the job shows right after. */
static const struct {
	char action[TR_JOB_NREQUESTS];
	const char *to[TR_JOB_NREQUESTS];
} want[TR_JOB_NSTATES] = {
	/* queued */ {{S, S, S, R, K, R, R}, {"cancelled", "cancelled", "paused", 0, "queued", 0, 0}},
	/* running */ {{G, G, G, R, K, R, G}, {"running", "stopping", "running", 0, "running", 0, "running"}},
	/* stopping */ {{G, K, G, R, K, R, G}, {"stopping", "stopping", "stopping", 0, "stopping", 0, "stopping"}},
	/* paused */ {{S, R, R, S, K, R, R}, {"cancelled", 0, 0, "queued", "paused", 0, 0}},
	/* stopped */ {{R, R, R, S, K, K, R}, {0, 0, 0, "queued", "stopped", "stopped", 0}},
	/* completed */ {{R, R, R, R, R, K, R}, {0, 0, 0, 0, 0, "completed", 0}},
	/* failed */ {{R, R, R, R, R, K, R}, {0, 0, 0, 0, 0, "failed", 0}},
	/* cancelled */ {{R, R, R, R, R, K, R}, {0, 0, 0, 0, 0, "cancelled", 0}},
	/* interrupted */ {{S, S, S, R, K, R, R}, {"cancelled", "cancelled", "paused", 0, "interrupted", 0, 0}},
	/* preempted */ {{S, S, S, R, K, R, R}, {"cancelled", "cancelled", "paused", 0, "preempted", 0, 0}},
};

static char action_letter(enum tr_job_action a)
{
	switch (a) {
	case TR_JOB_REFUSE:
		return R;
	case TR_JOB_KEEP:
		return K;
	case TR_JOB_SET:
		return S;
	case TR_JOB_SIGNAL:
		return G;
	}
	return '?';
}

Test(job, every_state_and_request)
{
	int cells = 0;
	for (int st = 0; st < TR_JOB_NSTATES; st++) {
		for (int rq = 0; rq < TR_JOB_NREQUESTS; rq++) {
			struct tr_job_transition t = tr_job_transition((enum tr_job_state)st, (enum tr_job_request)rq);
			const char *sn = tr_job_state_name((enum tr_job_state)st),
				   *rn = tr_job_request_name((enum tr_job_request)rq);
			cr_assert_eq(action_letter(t.action), want[st].action[rq], "%s x %s: %c, expected %c", sn, rn,
				     action_letter(t.action), want[st].action[rq]);
			if (t.action != TR_JOB_REFUSE)
				cr_assert_str_eq(tr_job_state_name(t.to), want[st].to[rq], "%s x %s", sn, rn);
			/* tr_job_check agrees with the table. */
			struct tr_error e = {0};
			struct tr_job_transition c;
			int rc = tr_job_check(7, (enum tr_job_state)st, (enum tr_job_request)rq, &c, &e);
			if (t.action == TR_JOB_REFUSE) {
				cr_assert_eq(rc, -EBUSY, "%s x %s", sn, rn);
				cr_assert_eq(e.kind, TR_JOB_E_ILLEGAL);
				cr_assert(strstr(e.message, "job 7 is ") == e.message, "%s", e.message);
				cr_assert(strstr(e.message, sn), "%s", e.message);
			} else {
				cr_assert_eq(rc, 0, "%s x %s: %s", sn, rn, e.message);
				cr_assert_eq(c.action, t.action);
				cr_assert_eq(e.kind, 0);
			}
			cells++;
		}
	}
	cr_assert_eq(cells, 10 * 7);
}

Test(job, refusals_name_the_states_that_allow_the_request)
{
	struct tr_error e = {0};
	cr_assert_eq(tr_job_check(3, TR_JOB_COMPLETED, TR_JOB_RESUME, NULL, &e), -EBUSY);
	/* A completed job cannot be extended; the refusal says how to go on
	 * from its weights instead. */
	cr_assert_str_eq(e.message, "job 3 is completed; only a paused or stopped job can be resumed; to train it "
				    "further, submit a new job with \"init\": {\"from\": {\"job\": 3, \"step\": "
				    "\"latest\"}}");
	cr_assert_eq(tr_job_check(3, TR_JOB_FAILED, TR_JOB_RESUME, NULL, &e), -EBUSY);
	cr_assert_str_eq(e.message, "job 3 is failed; only a paused or stopped job can be resumed");
	cr_assert_eq(tr_job_check(4, TR_JOB_QUEUED, TR_JOB_STOP, NULL, &e), 0);
	cr_assert_eq(tr_job_check(4, TR_JOB_RUNNING, TR_JOB_DELETE, NULL, &e), -EBUSY);
	cr_assert_str_eq(e.message, "job 4 is running; only a stopped, completed, failed or cancelled job can be "
				    "deleted (cancel it first)");
	cr_assert_eq(tr_job_check(5, TR_JOB_STOPPED, TR_JOB_CANCEL, NULL, &e), -EBUSY);
	cr_assert_str_eq(e.message, "job 5 is stopped; only a queued, running, stopping, paused, interrupted or "
				    "preempted job can be cancelled");
	cr_assert_eq(tr_job_check(6, TR_JOB_FAILED, TR_JOB_CHECKPOINT, NULL, &e), -EBUSY);
	cr_assert_str_eq(e.message, "job 6 is failed; only a running or stopping job can take a checkpoint");
	/* A state out of range is a bug elsewhere, not the client's fault. */
	cr_assert_eq(tr_job_check(8, TR_JOB_NSTATES, TR_JOB_CANCEL, NULL, &e), -EINVAL);
	cr_assert_eq(e.kind, TR_JOB_E_INTERNAL);
	cr_assert_eq(tr_job_check(8, (enum tr_job_state) - 1, TR_JOB_CANCEL, NULL, &e), -EINVAL);
}

Test(job, terminal_states)
{
	static const char *const terminal[] = {"stopped", "completed", "failed", "cancelled"};
	int n = 0;
	for (int st = 0; st < TR_JOB_NSTATES; st++) {
		bool is = false;
		for (size_t i = 0; i < 4; i++)
			is |= strcmp(tr_job_state_names[st], terminal[i]) == 0;
		cr_assert_eq(tr_job_state_terminal((enum tr_job_state)st), is, "%s", tr_job_state_names[st]);
		cr_assert_eq(tr_job_state_name_terminal(tr_job_state_names[st]), is);
		n += is;
		/* A terminal job holds no devices: nothing may signal its runner. */
		for (int rq = 0; is && rq < TR_JOB_NREQUESTS; rq++)
			cr_assert_neq(tr_job_transition((enum tr_job_state)st, (enum tr_job_request)rq).action,
				      TR_JOB_SIGNAL);
	}
	cr_assert_eq(n, 4);
	cr_assert_not(tr_job_state_name_terminal(NULL));
	cr_assert_not(tr_job_state_name_terminal("done"));
}

Test(job, names_round_trip_and_the_list_matches)
{
	char list[256] = "";
	size_t used = 0;
	for (int st = 0; st < TR_JOB_NSTATES; st++) {
		cr_assert_eq(tr_job_state_parse(tr_job_state_name((enum tr_job_state)st)), st);
		used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", st ? ", " : "",
					 tr_job_state_names[st]);
	}
	cr_assert_null(tr_job_state_names[TR_JOB_NSTATES]);
	cr_assert_str_eq(tr_job_state_list(), list);
	cr_assert_eq(tr_job_state_parse("Queued"), -1);
	cr_assert_eq(tr_job_state_parse(""), -1);
	cr_assert_eq(tr_job_state_parse(NULL), -1);
	cr_assert_null(tr_job_state_name(TR_JOB_NSTATES));
	cr_assert_null(tr_job_request_name(TR_JOB_NREQUESTS));
	cr_assert_eq(tr_job_transition(TR_JOB_NSTATES, TR_JOB_CANCEL).action, TR_JOB_REFUSE);
	cr_assert_eq(tr_job_epoch_shown(0), 1);
}

Test(job, errors_carry_kind_pointer_and_whole_utf8)
{
	struct tr_error e;
	memset(&e, 'x', sizeof e);
	cr_assert_eq(tr_job_fail(&e, TR_JOB_E_INVALID_REQUEST, "/epochs", "/epochs: %d", 3), -1);
	cr_assert_eq(e.kind, TR_JOB_E_INVALID_REQUEST);
	cr_assert_str_eq(e.pointer, "/epochs");
	cr_assert_str_eq(e.message, "/epochs: 3");
	cr_assert_eq(tr_error_set(&e, -ENOENT, 0, NULL, "%s", "gone"), -ENOENT);
	cr_assert_str_eq(e.pointer, "");
	/* A message cut inside a multi-byte character loses the partial one. */
	char big[1000];
	memset(big, 'a', sizeof big);
	memcpy(big + sizeof e.message - 2, "\xc3\xa9", 2); /* é across the end */
	big[sizeof big - 1] = '\0';
	tr_error_set(&e, -1, 0, NULL, "%s", big);
	cr_assert_eq(strlen(e.message), sizeof e.message - 2);
	cr_assert_eq(tr_error_set(NULL, -5, 0, NULL, "x"), -5);
}

Test(rfc3339, format_and_parse)
{
	char buf[TR_RFC3339_LEN];
	cr_assert(tr_rfc3339_format(1764609934.12, buf, sizeof buf));
	cr_assert_str_eq(buf, "2025-12-01T17:25:34.120Z");
	/* Rounding carries into the second. */
	cr_assert(tr_rfc3339_format(1764609934.9996, buf, sizeof buf));
	cr_assert_str_eq(buf, "2025-12-01T17:25:35.000Z");
	cr_assert_not(tr_rfc3339_format(0, buf, sizeof buf));
	cr_assert_str_eq(buf, "");
	cr_assert_not(tr_rfc3339_format(NAN, buf, sizeof buf));
	cr_assert_not(tr_rfc3339_format(1e12, buf, sizeof buf)); /* year 33658 */
	cr_assert_not(tr_rfc3339_format(1.0, buf, 10));

	double t;
	cr_assert(tr_rfc3339_parse("2025-12-01T17:25:34.120Z", &t));
	cr_assert_float_eq(t, 1764609934.12, 1e-6);
	cr_assert(tr_rfc3339_parse("2025-12-01T18:25:34+01:00", &t));
	cr_assert_float_eq(t, 1764609934.0, 1e-9);
	cr_assert(tr_rfc3339_parse("1970-01-01t00:00:00z", &t));
	cr_assert_float_eq(t, 0.0, 1e-9);
	cr_assert(tr_rfc3339_parse("2024-02-29T00:00:00Z", &t)); /* leap day */
	cr_assert_float_eq(t, 1709164800.0, 1e-9);
	static const char *const bad[] = {"2025-12-01",
					  "2025-12-01T17:25:34",
					  "2025-12-01T17:25:34.Z",
					  "2025-13-01T00:00:00Z",
					  "2025-12-01T17:25:34Zjunk",
					  "1764609934.12",
					  "2025-12-01T17:25:34+0100"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		cr_assert_not(tr_rfc3339_parse(bad[i], &t), "%s", bad[i]);
	/* Round trip over a range of times. */
	for (double x = 1.5; x < 4e9; x = x * 3.7 + 0.123) {
		cr_assert(tr_rfc3339_format(x, buf, sizeof buf));
		cr_assert(tr_rfc3339_parse(buf, &t), "%s", buf);
		cr_assert(fabs(t - x) <= 0.0005 + 1e-9, "%.4f -> %s -> %.4f", x, buf, t);
	}
}
