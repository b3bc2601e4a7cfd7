/* Data files under attack, against a real daemon: a file swapped for a
 * symlink out of the data root while jobs are submitted, a memory-mapped
 * .npy truncated or rewritten under a training job, a FIFO as a data
 * path, and the answers for paths outside the roots.  After each, the
 * daemon still serves and a small job still completes.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

static struct daemon d;
static char outside[128]; /* a directory next to the data root */

static void start2(void)
{
	daemon_start(&d, 2, NULL);
	snprintf(outside, sizeof outside, "/tmp/trainerd-outside-XXXXXX");
	cr_assert_not_null(mkdtemp(outside));
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

static void stop2(void)
{
	daemon_cleanup(&d);
	if (outside[0])
		nftw(outside, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}

TestSuite(datafiles, .init = start2, .fini = stop2);

static void in_dir(char *buf, size_t len, const char *dir, const char *name)
{
	snprintf(buf, len, "%s/%s", dir, name);
}

/* `rows` lines of `cols` numbers, the last a class label 0..2. */
static void write_csv(const char *path, int rows, int cols)
{
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f, "%s", path);
	for (int r = 0; r < rows; r++)
		for (int c = 0; c < cols; c++)
			fprintf(f, c + 1 < cols ? "%d.5," : "%d\n", c + 1 < cols ? (r * 7 + c) % 5 : r % 3);
	fclose(f);
}

/* x: rows x 64 float32, y: rows int64 in 0..9, as numpy writes them. */
static void write_npy_pair(const char *xpath, const char *ypath, int rows)
{
	const char *paths[2] = {xpath, ypath};
	for (int k = 0; k < 2; k++) {
		char dict[128];
		int hl = k == 0 ? snprintf(dict, sizeof dict,
					   "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, 64), }", rows)
				: snprintf(dict, sizeof dict,
					   "{'descr': '<i8', 'fortran_order': False, 'shape': (%d,), }", rows);
		while ((10 + hl + 1) % 64)
			dict[hl++] = ' ';
		dict[hl++] = '\n';
		FILE *f = fopen(paths[k], "wb");
		cr_assert_not_null(f);
		unsigned char pre[10] = {
			0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hl & 0xff), (unsigned char)(hl >> 8)};
		fwrite(pre, 1, 10, f);
		fwrite(dict, 1, (size_t)hl, f);
		for (int r = 0; r < rows; r++) {
			if (k == 0) {
				float row[64];
				for (int c = 0; c < 64; c++)
					row[c] = (float)((r * 31 + c) % 17) / 17.0f;
				fwrite(row, sizeof row, 1, f);
			} else {
				int64_t v = r % 10;
				fwrite(&v, sizeof v, 1, f);
			}
		}
		cr_assert_eq(fclose(f), 0);
	}
}

/* A job on `path` (3 columns: 2 features and a label). */
static const char *csv_job(const char *name, const char *path, int epochs, int devices)
{
	static char buf[8][1024];
	static int next;
	char *b = buf[next++ % 8];
	snprintf(
		b, sizeof buf[0],
		"{\"name\": \"%s\", \"seed\": 1, \"model\": {\"inputs\": 2, \"layers\": [{\"type\": \"dense\", \"units\":"
		" 3}]}, \"data\": {\"train\": {\"format\": \"csv\", \"path\": \"%s\"}}, \"batch_size\": 16, \"epochs\":"
		" %d, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}, \"devices\": %d, \"prefetch\": {\"workers\": 1,"
		" \"depth\": 2}}",
		name, path, epochs, devices);
	return b;
}

/* A job's final error message ("" when none); static buffer. */
static const char *job_error(long long id, char *code, size_t codelen)
{
	static char msg[2048];
	char path[64];
	struct http_reply r;
	snprintf(path, sizeof path, "/jobs/%lld", id);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	json_t *e = json_object_get(r.json, "error");
	snprintf(msg, sizeof msg, "%s", json_string_value(json_object_get(e, "message")) ?: "");
	if (code)
		snprintf(code, codelen, "%s", json_string_value(json_object_get(e, "code")) ?: "");
	http_free(&r);
	return msg;
}

static void assert_healthy_and_small_job_completes(void)
{
	struct http_reply r;
	http(&d, "GET", "/healthz", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	http_free(&r);
	char p[256];
	in_dir(p, sizeof p, d.dir, "after.csv");
	write_csv(p, 64, 3);
	long long id = submit_job(&d, csv_job("after", "after.csv", 1, 1));
	cr_assert_str_eq(wait_state(&d, id, "completed|failed|cancelled", 60), "completed", "%s",
			 job_error(id, NULL, 0));
}

/* ---- the race: a file swapped with a symlink out of the root ----------- */

struct swapper {
	char a[256], b[256];
	atomic_bool stop;
	long swaps;
};

static void *swap_main(void *arg)
{
	struct swapper *s = arg;
	while (!atomic_load(&s->stop)) {
		if (renameat2(AT_FDCWD, s->a, AT_FDCWD, s->b, RENAME_EXCHANGE) == 0)
			s->swaps++;
		if ((s->swaps & 63) == 0)
			sched_yield();
	}
	return NULL;
}

Test(datafiles, swapping_in_a_symlink_out_of_the_root_never_reads_outside, .timeout = 240)
{
	/* Inside: 3 columns (2 features).  Outside: 7 columns, which parse
	 * too, so a job that read it fails with "6 features" instead of an
	 * error about the path. */
	char good[256], target[256];
	in_dir(good, sizeof good, d.dir, "data.csv");
	in_dir(target, sizeof target, outside, "secret.csv");
	write_csv(good, 64, 3);
	write_csv(target, 64, 7);
	struct swapper sw = {0};
	snprintf(sw.a, sizeof sw.a, "%s", good);
	in_dir(sw.b, sizeof sw.b, d.dir, "swap.tmp");
	cr_assert_eq(symlink(target, sw.b), 0);
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, swap_main, &sw), 0);

	enum { JOBS = 60 };
	long long ids[JOBS];
	int n = 0, refused = 0;
	double deadline = now_s() + 90;
	for (int i = 0; i < JOBS && now_s() < deadline; i++) {
		struct http_reply r;
		http(&d, "POST", "/jobs", csv_job("race", "data.csv", 1, 1), NULL, NULL, &r);
		if (r.status == 201) {
			ids[n++] = (long long)json_integer_value(json_object_get(r.json, "id"));
		} else {
			/* Refused at submit: the name was the symlink just then,
			 * when its path was resolved (422) or when submit opened
			 * the data to check it against the model (400). */
			if (r.status == 422)
				cr_assert(strstr(r.body, "no file 'data.csv' in the daemon's data roots"), "%s",
					  r.body);
			else
				cr_assert(r.status == 400 && strstr(r.body, "is not a file in the data roots"),
					  "%ld %s", r.status, r.body);
			refused++;
		}
		http_free(&r);
	}
	int completed = 0, failed = 0;
	for (int i = 0; i < n; i++) {
		const char *st = wait_state(&d, ids[i], "completed|failed|cancelled", 60);
		char code[64];
		const char *msg = job_error(ids[i], code, sizeof code);
		cr_assert_null(strstr(msg, "6 features"), "job %lld read the file outside the root: %s", ids[i], msg);
		cr_assert_null(strstr(msg, "secret"), "job %lld: %s", ids[i], msg);
		if (strcmp(st, "completed") == 0) {
			completed++;
		} else {
			cr_assert_str_eq(st, "failed", "job %lld", ids[i]);
			cr_assert(strstr(msg, "data.csv' in the daemon's data roots") ||
					  strstr(msg, "data.csv' is not a file in the data roots"),
				  "job %lld (%s): %s", ids[i], code, msg);
			failed++;
		}
	}
	atomic_store(&sw.stop, true);
	pthread_join(th, NULL);
	cr_log_info("race: %d submitted, %d refused at submit, %d completed, %d failed cleanly, %ld swaps", n + refused,
		    refused, completed, failed, sw.swaps);
	cr_assert_gt(sw.swaps, 100, "the swapper did not run");
	cr_assert_eq(n + refused, JOBS, "only %d submissions within the time bound", n + refused);
	assert_healthy_and_small_job_completes();
}

/* ---- a mapped .npy truncated or rewritten under a running job ----------- */

static const char *npy_job(const char *name, const char *x, const char *y)
{
	static char buf[1024];
	snprintf(buf, sizeof buf,
		 "{\"name\": \"%s\", \"seed\": 1, \"model\": {\"inputs\": 64, \"layers\": [{\"type\": \"dense\", "
		 "\"units\": 10}]}, \"data\": {\"train\": {\"format\": \"npy\", \"x\": \"%s\", \"y\": \"%s\"}}, "
		 "\"batch_size\": 64, \"epochs\": 100000, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.01}, "
		 "\"devices\": 1, \"prefetch\": {\"workers\": 1, \"depth\": 2}}",
		 name, x, y);
	return buf;
}

/* Waits until job id has trained some steps. */
static void wait_training(long long id)
{
	char path[64];
	snprintf(path, sizeof path, "/jobs/%lld", id);
	double deadline = now_s() + 60;
	while (now_s() < deadline) {
		struct http_reply r;
		http(&d, "GET", path, NULL, NULL, NULL, &r);
		json_int_t step = json_integer_value(json_object_get(json_object_get(r.json, "progress"), "step"));
		const char *st = json_string_value(json_object_get(r.json, "state"));
		bool go = st && strcmp(st, "running") == 0 && step > 5;
		cr_assert(st && (strcmp(st, "running") == 0 || strcmp(st, "queued") == 0), "job %lld is %s: %s", id, st,
			  r.body);
		http_free(&r);
		if (go)
			return;
		usleep(50 * 1000);
	}
	cr_assert_fail("job %lld did not start training", id);
}

Test(datafiles, a_mapped_npy_truncated_or_rewritten_fails_its_job_not_the_daemon, .timeout = 240)
{
	char x[256], y[256];
	in_dir(x, sizeof x, d.dir, "x.npy");
	in_dir(y, sizeof y, d.dir, "y.npy");
	write_npy_pair(x, y, 20000);
	/* Another job on the other device, which must not notice. */
	char by[256];
	in_dir(by, sizeof by, d.dir, "by.csv");
	write_csv(by, 64, 3);
	long long other = submit_job(&d, csv_job("bystander", "by.csv", 100000, 1));
	(void)other;

	long long id = submit_job(&d, npy_job("truncated", "x.npy", "y.npy"));
	wait_training(id);
	cr_assert_eq(truncate(x, 128), 0);
	cr_assert_str_eq(wait_state(&d, id, "completed|failed|cancelled", 30), "failed");
	const char *msg = job_error(id, NULL, 0);
	cr_assert(strstr(msg, "x.npy: the file changed while the job was reading it"), "%s", msg);
	cr_assert(strstr(msg, "a data file must not be modified while a job uses it"), "%s", msg);

	/* np.save over the file: truncated to 0 and written again, same size. */
	write_npy_pair(x, y, 20000);
	id = submit_job(&d, npy_job("rewritten", "x.npy", "y.npy"));
	wait_training(id);
	usleep(30 * 1000); /* past the file clock's tick since the job opened it */
	write_npy_pair(x, y, 20000);
	cr_assert_str_eq(wait_state(&d, id, "completed|failed|cancelled", 30), "failed");
	msg = job_error(id, NULL, 0);
	/* x is written first, then y: a loader may fault on either. */
	cr_assert(strstr(msg, "x.npy: the file changed while the job was reading it") ||
			  strstr(msg, "y.npy: the file changed while the job was reading it"),
		  "%s", msg);

	char path[64];
	snprintf(path, sizeof path, "/jobs/%lld", other);
	struct http_reply r;
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_str_eq(json_string_value(json_object_get(r.json, "state")), "running", "%s", r.body);
	http_free(&r);
	snprintf(path, sizeof path, "/jobs/%lld/cancel", other);
	http(&d, "POST", path, NULL, NULL, NULL, &r);
	http_free(&r);
	assert_healthy_and_small_job_completes();
}

/* ---- a FIFO as a data path ------------------------------------------------ */

Test(datafiles, a_fifo_is_refused_at_submit_and_at_start_without_hanging, .timeout = 120)
{
	char fifo[256], p[256];
	in_dir(fifo, sizeof fifo, d.dir, "pipe.csv");
	cr_assert_eq(mkfifo(fifo, 0600), 0);
	struct http_reply r;
	http(&d, "POST", "/jobs", csv_job("fifo", "pipe.csv", 1, 1), NULL, NULL, &r);
	cr_assert_eq(r.status, 422, "%s", r.body);
	json_t *e = json_object_get(r.json, "error");
	cr_assert_str_eq(json_string_value(json_object_get(e, "code")), "invalid_path");
	cr_assert_str_eq(json_string_value(json_object_get(e, "pointer")), "/data/train/path");
	cr_assert(strstr(r.body, "'pipe.csv' is a FIFO, not a regular file"), "%s", r.body);
	http_free(&r);

	/* A FIFO put in place after the submit: the job is queued behind one
	 * that holds both devices, the file becomes a FIFO, the blocker goes. */
	in_dir(p, sizeof p, d.dir, "later.csv");
	write_csv(p, 64, 3);
	long long blocker = submit_job(&d, csv_job("blocker", "later.csv", 100000, 2));
	cr_assert_str_eq(wait_state(&d, blocker, "running", 30), "running");
	long long id = submit_job(&d, csv_job("swapped", "later.csv", 1, 1));
	long long queued = submit_job(&d, csv_job("queued", "later.csv", 1, 1));
	cr_assert_eq(rename(fifo, p), 0);
	char path[64];
	snprintf(path, sizeof path, "/jobs/%lld/cancel", queued);
	http(&d, "POST", path, NULL, NULL, NULL, &r);
	cr_assert_lt(r.status, 300, "%s", r.body);
	http_free(&r);
	snprintf(path, sizeof path, "/jobs/%lld/cancel", blocker);
	http(&d, "POST", path, NULL, NULL, NULL, &r);
	cr_assert_lt(r.status, 300, "%s", r.body);
	http_free(&r);
	cr_assert_str_eq(wait_state(&d, blocker, "completed|failed|cancelled", 30), "cancelled");
	cr_assert_str_eq(wait_state(&d, queued, "completed|failed|cancelled", 30), "cancelled");
	cr_assert_str_eq(wait_state(&d, id, "completed|failed|cancelled", 30), "failed");
	const char *msg = job_error(id, NULL, 0);
	cr_assert(strstr(msg, "is a FIFO, not a regular file"), "%s", msg);
	unlink(p);
	assert_healthy_and_small_job_completes();
	/* Nothing holds the daemon at shutdown. */
	int status;
	cr_assert_lt(daemon_stop(&d, &status), 15.0);
}

/* ---- no existence oracle outside the roots ------------------------------- */

/* The refusal's message for `path`, with the path itself cut out. */
static void refusal(const char *path, char *out, size_t len)
{
	struct http_reply r;
	http(&d, "POST", "/jobs", csv_job("oracle", path, 1, 1), NULL, NULL, &r);
	cr_assert_eq(r.status, 422, "%s: %s", path, r.body);
	json_t *e = json_object_get(r.json, "error");
	cr_assert_str_eq(json_string_value(json_object_get(e, "code")), "invalid_path");
	const char *m = json_string_value(json_object_get(e, "message"));
	const char *at = strstr(m, path);
	cr_assert_not_null(at, "%s", m);
	snprintf(out, len, "%.*s<path>%s", (int)(at - m), m, at + strlen(path));
	http_free(&r);
}

Test(datafiles, outside_paths_get_one_answer_whether_they_exist_or_not, .timeout = 60)
{
	char exists[256], missing[256], a[2048], b[2048], rel_exists[256], rel_missing[256];
	in_dir(exists, sizeof exists, outside, "secret.csv");
	in_dir(missing, sizeof missing, outside, "nothing.csv");
	write_csv(exists, 8, 3);
	refusal(exists, a, sizeof a);
	refusal(missing, b, sizeof b);
	cr_assert_str_eq(a, b);
	/* It says where files are looked for and how to change that. */
	char real[4096];
	cr_assert_not_null(realpath(d.dir, real));
	cr_assert(strstr(a, real), "%s", a);
	cr_assert(strstr(a, "--data-root"), "%s", a);
	cr_assert(strstr(a, "data-root lines in the config file"), "%s", a);
	/* The same through "..", and for a file missing inside the root. */
	snprintf(rel_exists, sizeof rel_exists, "..%s", exists + 4);
	snprintf(rel_missing, sizeof rel_missing, "..%s", missing + 4);
	refusal(rel_exists, b, sizeof b);
	cr_assert_str_eq(a, b);
	refusal(rel_missing, b, sizeof b);
	cr_assert_str_eq(a, b);
	refusal("not-here.csv", b, sizeof b);
	cr_assert_str_eq(a, b);
}

/* ---- the re-open after a restart goes through the same confined open ---- */

Test(datafiles, a_job_resumed_after_restart_does_not_follow_a_new_symlink_out, .timeout = 120)
{
	char good[256], target[256];
	in_dir(good, sizeof good, d.dir, "resume.csv");
	in_dir(target, sizeof target, outside, "secret.csv");
	write_csv(good, 64, 3);
	write_csv(target, 64, 7);
	long long id = submit_job(&d, csv_job("resumed", "resume.csv", 100000, 1));
	cr_assert_str_eq(wait_state(&d, id, "running", 30), "running");
	int status;
	daemon_stop(&d, &status);
	/* While the daemon is down the file becomes a symlink out of the root. */
	cr_assert_eq(unlink(good), 0);
	cr_assert_eq(symlink(target, good), 0);
	daemon_restart(&d, 2, NULL);
	cr_assert_str_eq(wait_state(&d, id, "completed|failed|cancelled", 60), "failed");
	char code[64];
	const char *msg = job_error(id, code, sizeof code);
	cr_assert_null(strstr(msg, "6 features"), "the resumed job read the file outside the root: %s", msg);
	cr_assert_str_eq(code, "invalid_path", "%s", msg);
	cr_assert(strstr(msg, "resume.csv' in the daemon's data roots"), "%s", msg);
	assert_healthy_and_small_job_completes();
}

/* Labels are checked when the job opens its data: a bad one fails the job
 * before its first step naming pointer, file and line; a label column with
 * one value is a warning in the job's log and the job trains. */
Test(datafiles, a_bad_label_fails_the_job_at_start_naming_file_and_line, .timeout = 120)
{
	char p[512], want[1024];
	in_dir(p, sizeof p, d.dir, "labels.csv");
	FILE *f = fopen(p, "w");
	cr_assert_not_null(f);
	fputs("1,1.5,2\n1,2.5,1\n1,3.5,0\n1,4.5,3\n", f); /* the model has 3 classes */
	cr_assert_eq(fclose(f), 0);
	long long id = submit_job(&d, csv_job("badlabel", "labels.csv", 1, 1));
	cr_assert_str_eq(wait_state(&d, id, "completed|failed|cancelled", 60), "failed");
	char real[512];
	cr_assert_not_null(realpath(p, real));
	snprintf(want, sizeof want, "/data/train: %s:4: label 3 is out of range: the model has 3 classes, 0 to 2",
		 real);
	const char *msg = job_error(id, NULL, 0);
	cr_assert(strstr(msg, want), "%s", msg);

	in_dir(p, sizeof p, d.dir, "one.csv");
	f = fopen(p, "w");
	cr_assert_not_null(f);
	fputs("1,1.5,2\n1,2.5,2\n1,3.5,2\n", f);
	cr_assert_eq(fclose(f), 0);
	id = submit_job(&d, csv_job("onelabel", "one.csv", 1, 1));
	cr_assert_str_eq(wait_state(&d, id, "completed|failed|cancelled", 60), "completed");
	char path[64];
	struct http_reply r;
	snprintf(path, sizeof path, "/jobs/%lld/logs", id);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	cr_assert(strstr(r.body, "/data/train: all 3 labels are 2: a label column with a single value teaches nothing; "
				 "is it the right column?"),
		  "%s", r.body);
	http_free(&r);
}

/* Whether text holds a control character (ESC, BEL, a newline...). */
static bool has_control(const char *text)
{
	for (const unsigned char *p = (const unsigned char *)text; *p; p++)
		if (*p < 0x20 || *p == 0x7f)
			return true;
	return false;
}

/* A data path with ESC and BEL (a terminal title and a screen clear) in it
 * reached terminals through the job's error, its log (trainctl show/logs)
 * and the daemon's log; each now shows them as \xNN. */
Test(datafiles, control_characters_in_a_path_are_escaped_in_messages, .timeout = 120)
{
	const char *name = "ctl\x1b]0;owned\x07\x1b[2J.csv";
	char p[512];
	in_dir(p, sizeof p, d.dir, name);
	FILE *f = fopen(p, "w");
	cr_assert_not_null(f);
	fputs("1,1.5,2\n1,2.5,1\n1,3.5,0\n1,4.5,3\n", f); /* label 3 is out of range */
	cr_assert_eq(fclose(f), 0);
	long long id = submit_job(&d, csv_job("ctl", "ctl\\u001b]0;owned\\u0007\\u001b[2J.csv", 1, 1));
	cr_assert_str_eq(wait_state(&d, id, "completed|failed|cancelled", 60), "failed");
	const char *msg = job_error(id, NULL, 0);
	cr_assert(!has_control(msg), "a control character in the job's error: %s", msg);
	cr_assert(strstr(msg, "ctl\\x1b]0;owned\\x07\\x1b[2J.csv"), "%s", msg);

	char path[64];
	struct http_reply r;
	snprintf(path, sizeof path, "/jobs/%lld/logs", id);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	size_t i;
	json_t *line;
	json_array_foreach(json_object_get(r.json, "logs"), i, line) {
		const char *text = json_string_value(json_object_get(line, "message"));
		cr_assert(text && !has_control(text), "a control character in a log line: %s", text ? text : "(none)");
	}
	http_free(&r);

	/* The daemon's own log (stderr), the whole file so far. */
	FILE *log = fopen(d.log_path, "r");
	cr_assert_not_null(log);
	int c, esc = 0;
	while ((c = fgetc(log)) != EOF)
		esc += c == 0x1b || c == 0x07;
	fclose(log);
	cr_assert_eq(esc, 0, "%d ESC or BEL bytes in the daemon's log", esc);
	unlink(p);
}
