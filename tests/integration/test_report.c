/* Worker reports (docs/design.md, "Worker reports"), with a real daemon
 * whose Slurm commands are stand-ins (--slurm-bin-dir): `sbatch` hands out
 * job ids, `scontrol show job` says RUNNING until the test ends the job,
 * `scancel` cancels it.  No Slurm and no worker run: the test itself is
 * rank 0, reporting with the token the daemon wrote into the job's folder.
 *   - the token file is 0600; the token authorises POST /jobs/{id}/report
 *     of its own job (200) and nothing else: no token or a wrong one is
 *     401, another job's 403, a read role token 403, GET /jobs/{id} with
 *     it 403; a write role token reports; a job that is not a worker job
 *     is 409;
 *   - a report's progress is the job's live progress, total_steps too;
 *     a bad report is 400 naming its field, and the daemon serves on;
 *   - a retried report stores no point twice, and once the worker
 *     reports, a metrics.jsonl in the job's folder is not read as well;
 *   - the summary reported decides the job's end (here a failure with
 *     its message); the token is then revoked (401, file gone), and it
 *     appears in no log line and no reply;
 *   - a requeued worker fetches the checkpoint its job uploaded (GET
 *     .../report/checkpoint.safetensors, the same auth), and a real worker
 *     uploads each periodic checkpoint as it writes it. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define WRITER "writer-secret-7"
#define READER "reader-secret-7"

static struct daemon d;
static char bin[200];

static void write_file(const char *path, const char *text, mode_t mode)
{
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f, "%s", path);
	fputs(text, f);
	fclose(f);
	cr_assert_eq(chmod(path, mode), 0);
}

static void setup(void)
{
	char dir[] = "/tmp/tr-report-XXXXXX", path[300], tokens[300];
	cr_assert_not_null(mkdtemp(dir));
	snprintf(bin, sizeof bin, "%s", dir);
	/* Job ids from a counter (under a lock: the runners submit at the
	 * same time, and two jobs of one Slurm id would end together); a job
	 * is RUNNING until ended-ID (its state in it) or cancelled-ID exists. */
	snprintf(path, sizeof path, "%s/sbatch", bin);
	write_file(path,
		   "#!/bin/bash\nd=$(dirname \"$0\")\nexec 9>>\"$d/next.lock\"\nflock 9\n"
		   "n=$(( $(cat \"$d/next\" 2>/dev/null || echo 100) + 1 ))\n"
		   "echo $n >\"$d/next\"\necho $n\n",
		   0755);
	snprintf(path, sizeof path, "%s/scontrol", bin);
	write_file(path,
		   "#!/bin/bash\nd=$(dirname \"$0\")\n[ \"$1\" = show ] || exit 0\nid=$4\nst=RUNNING\n"
		   "[ -f \"$d/ended-$id\" ] && st=$(cat \"$d/ended-$id\")\n"
		   "[ -f \"$d/cancelled-$id\" ] && st=CANCELLED\n"
		   "echo \"JobId=$id JobName=x JobState=$st Reason=None Restarts=0 ExitCode=0:0\"\n",
		   0755);
	snprintf(path, sizeof path, "%s/scancel", bin);
	write_file(path, "#!/bin/bash\nd=$(dirname \"$0\")\nfor a; do id=$a; done\ntouch \"$d/cancelled-$id\"\n", 0755);
	snprintf(tokens, sizeof tokens, "%s/tokens", bin);
	write_file(tokens, "write:" WRITER "\nread:" READER "\n", 0600);
	const char *extra[] = {"--slurm-bin-dir", bin, "--token-file", tokens, NULL};
	daemon_start(&d, 1, extra);
}

static void teardown(void)
{
	daemon_cleanup(&d);
	char cmd[300];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", bin);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", bin);
}

TestSuite(report, .init = setup, .fini = teardown, .timeout = 120);

#define SLURM_JOB                                                                                                \
	"{\"name\": \"rep\", \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 4}]},"                    \
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 64, \"features\": 8, \"classes\": 4}}," \
	" \"batch_size\": 8, \"epochs\": 1, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1},"                    \
	" \"resources\": {\"allocator\": \"slurm\"}}"
/* 40 steps of about 0.15 s, a checkpoint every 2. */
#define SLURM_JOB_SLOW                                                                                                   \
	"{\"name\": \"rep-slow\", \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 4}]},"                       \
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 320, \"features\": 8, \"classes\": 4,"          \
	" \"load_cost_us\": 20000}}, \"batch_size\": 8, \"epochs\": 1, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}," \
	" \"checkpoint\": {\"every_steps\": 2}, \"resources\": {\"allocator\": \"slurm\"}}"

static long post(const char *path, const char *body, const char *token, struct http_reply *r)
{
	char h[200];
	snprintf(h, sizeof h, "Authorization: Bearer %s", token ? token : "");
	http(&d, "POST", path, body, NULL, token ? h : NULL, r);
	return r->status;
}

static long status_of(const char *method, const char *path, const char *body, const char *token)
{
	struct http_reply r;
	char h[200];
	snprintf(h, sizeof h, "Authorization: Bearer %s", token ? token : "");
	http(&d, method, path, body, NULL, token ? h : NULL, &r);
	long s = r.status;
	http_free(&r);
	return s;
}

static long long submit(const char *spec)
{
	struct http_reply r;
	post("/jobs", spec, WRITER, &r);
	cr_assert_eq(r.status, 201, "%s", r.body);
	long long id = json_integer_value(json_object_get(r.json, "id"));
	http_free(&r);
	return id;
}

/* The token the daemon wrote into the job's folder (checked 0600). */
static void read_token(long long id, char *token, size_t n)
{
	char path[300];
	snprintf(path, sizeof path, "%s/slurm/job-%lld/report.token", d.dir, id);
	struct stat sb;
	for (int i = 0; i < 100 && stat(path, &sb) < 0; i++)
		usleep(100 * 1000);
	cr_assert_eq(stat(path, &sb), 0, "no %s", path);
	cr_assert_eq(sb.st_mode & 0777, 0600, "%s has mode %o", path, sb.st_mode & 0777);
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f);
	cr_assert(fgets(token, (int)n, f));
	fclose(f);
	token[strcspn(token, "\n")] = 0;
	cr_assert_geq(strlen(token), 32, "a token of at least 128 bits");
}

static json_t *job_get(long long id)
{
	struct http_reply r;
	char path[64], h[100];
	snprintf(path, sizeof path, "/jobs/%lld", id);
	snprintf(h, sizeof h, "Authorization: Bearer %s", READER);
	http(&d, "GET", path, NULL, NULL, h, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	json_t *j = json_incref(r.json);
	http_free(&r);
	return j;
}

/* The steps of the job's stored points of one series. */
static int series_steps(long long id, const char *name, long long *steps, int max)
{
	char path[128], h[100];
	snprintf(path, sizeof path, "/jobs/%lld/metrics?names=%s&max_points=0", id, name);
	snprintf(h, sizeof h, "Authorization: Bearer %s", READER);
	struct http_reply r;
	http(&d, "GET", path, NULL, NULL, h, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	json_t *pts = json_object_get(json_object_get(json_object_get(r.json, "series"), name), "steps");
	int n = 0;
	size_t i;
	json_t *p;
	json_array_foreach(pts, i, p)
		if (n < max)
			steps[n++] = json_integer_value(p);
	http_free(&r);
	return n;
}

/* wait_state with the read token this daemon needs. */
static const char *wait_for(long long id, const char *states, double timeout_s)
{
	static char state[32];
	char want[256], probe[48];
	snprintf(want, sizeof want, "|%s|", states);
	for (double deadline = now_s() + timeout_s;;) {
		json_t *j = job_get(id);
		snprintf(state, sizeof state, "%s", json_string_value(json_object_get(j, "state")));
		json_decref(j);
		snprintf(probe, sizeof probe, "|%s|", state);
		if (strstr(want, probe) || now_s() > deadline)
			return state;
		usleep(50 * 1000);
	}
}

static bool file_has(const char *path, const char *needle)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return false;
	char line[4096];
	bool found = false;
	while (!found && fgets(line, sizeof line, f))
		found = strstr(line, needle) != NULL;
	fclose(f);
	return found;
}

Test(report, a_job_token_reports_for_its_job_alone)
{
	long long a = submit(SLURM_JOB), b = submit(SLURM_JOB);
	cr_assert_str_eq(wait_for(a, "running|failed", 30), "running");
	cr_assert_str_eq(wait_for(b, "running|failed", 30), "running");
	char ta[128], tb[128], pa[64], pb[64], path[300];
	read_token(a, ta, sizeof ta);
	read_token(b, tb, sizeof tb);
	cr_assert_str_neq(ta, tb);
	snprintf(pa, sizeof pa, "/jobs/%lld/report", a);
	snprintf(pb, sizeof pb, "/jobs/%lld/report", b);
	const char *progress = "{\"progress\": {\"step\": 3, \"total_steps\": 8, \"epoch\": 0, \"loss\": 1.5}}";

	cr_assert_eq(status_of("POST", pa, progress, NULL), 401, "no token");
	cr_assert_eq(status_of("POST", pa, progress, "0123456789abcdef0123456789abcdef"), 401, "a wrong token");
	cr_assert_eq(status_of("POST", pa, progress, tb), 403, "another job's token");
	cr_assert_eq(status_of("POST", pa, progress, READER), 403, "a read role token");
	snprintf(path, sizeof path, "/jobs/%lld", a);
	cr_assert_eq(status_of("GET", path, NULL, ta), 403, "a job token on another route");
	snprintf(path, sizeof path, "/jobs/%lld/cancel", a);
	cr_assert_eq(status_of("POST", path, NULL, ta), 403, "a job token on another route");
	cr_assert_eq(status_of("POST", pb, progress, WRITER), 200, "a write role token");

	/* A job that is not a worker job: 409 (with a token that may report). */
	long long local = submit("{\"name\": \"local\", \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 4}]},"
				 " \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 64, \"features\": 8,"
				 " \"classes\": 4}}, \"batch_size\": 8, \"epochs\": 1,"
				 " \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}");
	wait_for(local, "completed|failed", 60);
	snprintf(path, sizeof path, "/jobs/%lld/report", local);
	cr_assert_eq(status_of("POST", path, progress, WRITER), 409);

	/* Its own token: live progress with total_steps. */
	struct http_reply r;
	cr_assert_eq(post(pa, progress, ta, &r), 200, "%s", r.body);
	http_free(&r);
	json_t *j = job_get(a);
	json_t *p = json_object_get(j, "progress");
	cr_assert_eq(json_integer_value(json_object_get(p, "step")), 3, "%s", json_dumps(j, 0));
	cr_assert_eq(json_integer_value(json_object_get(p, "total_steps")), 8, "%s", json_dumps(j, 0));
	json_decref(j);

	/* Bad input names its field; the daemon serves on. */
	cr_assert_eq(post(pa, "{\"progress\": {\"step\": -1}}", ta, &r), 400);
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(r.json, "error"), "pointer")),
			 "/progress/step");
	http_free(&r);
	cr_assert_eq(post(pa, "{\"points\": [{\"name\": \"loss\", \"step\": 1, \"value\": \"x\"}]}", ta, &r), 400);
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(r.json, "error"), "pointer")),
			 "/points/0/value");
	http_free(&r);
	cr_assert_eq(post(pa, "{\"summary\": {\"state\": \"done\"}}", ta, &r), 400);
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(r.json, "error"), "pointer")),
			 "/summary/state");
	http_free(&r);
	cr_assert_eq(status_of("GET", "/healthz", NULL, NULL), 200);

	/* A retried report stores no point twice; a metrics.jsonl in the
	 * folder (a shared file system) is not read as well. */
	const char *points = "{\"points\": [{\"name\": \"loss\", \"step\": 1, \"epoch\": 0, \"value\": 2.0},"
			     " {\"name\": \"loss\", \"step\": 2, \"epoch\": 0, \"value\": 1.8},"
			     " {\"name\": \"loss\", \"step\": 3, \"epoch\": 0, \"value\": 1.5}]}";
	cr_assert_eq(status_of("POST", pa, points, ta), 200);
	cr_assert_eq(status_of("POST", pa, points, ta), 200);
	snprintf(path, sizeof path, "%s/slurm/job-%lld/metrics.jsonl", d.dir, a);
	write_file(path,
		   "{\"step\":1,\"epoch\":0,\"name\":\"loss\",\"value\":2.0}\n"
		   "{\"step\":7,\"epoch\":0,\"name\":\"loss\",\"value\":0.5}\n",
		   0644);
	usleep(1500 * 1000); /* three rounds of the runner's tail, and the store's flush */
	long long steps[16];
	int n = series_steps(a, "loss", steps, 16);
	cr_assert_eq(n, 3, "%d points of loss (one source, no duplicates)", n);
	cr_assert(steps[0] == 1 && steps[1] == 2 && steps[2] == 3);

	/* The summary reported decides the end; the token is then revoked. */
	cr_assert_eq(status_of("POST", pa,
			       "{\"summary\": {\"state\": \"failed\", \"steps\": 3, \"error\": \"boom at 3\"}}", ta),
		     200);
	char sid[32] = "";
	snprintf(path, sizeof path, "%s/slurm/job-%lld/slurm_job_id", d.dir, a);
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f, "%s", path);
	cr_assert(fgets(sid, sizeof sid, f));
	fclose(f);
	snprintf(path, sizeof path, "%s/ended-%s", bin, sid);
	f = fopen(path, "w");
	cr_assert_not_null(f);
	fputs("COMPLETED", f);
	fclose(f);
	cr_assert_str_eq(wait_for(a, "completed|failed|cancelled", 30), "failed");
	j = job_get(a);
	const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
	cr_assert(msg && strstr(msg, "boom at 3"), "%s", json_dumps(j, 0));
	char *shown = json_dumps(j, 0);
	bool token_shown = shown && strstr(shown, ta);
	free(shown);
	cr_assert(!token_shown, "the token in a reply");
	json_decref(j);
	cr_assert_eq(status_of("POST", pa, progress, ta), 401, "a revoked token");
	snprintf(path, sizeof path, "%s/slurm/job-%lld/report.token", d.dir, a);
	cr_assert_neq(access(path, F_OK), 0, "the token file outlives its job");
	snprintf(path, sizeof path, "/jobs/%lld/logs", a);
	http(&d, "GET", path, NULL, NULL, "Authorization: Bearer " READER, &r);
	cr_assert_eq(r.status, 200);
	cr_assert_null(strstr(r.body, ta), "the token in the job's log");
	http_free(&r);
	cr_assert(!file_has(d.log_path, ta), "the token in the daemon's log");
	cr_assert(!file_has(d.log_path, tb), "the token in the daemon's log");
	cr_assert_eq(status_of("POST", pb, progress, tb), 200, "the other job reports on");
}

/* A real `trainerd run --report-url --report-token-file` as the job's
 * worker, writing into a folder of its own that the daemon does not read
 * (as on a node without a shared file system): its progress, total_steps,
 * every metric point once, its summary and its final weights reach the
 * daemon over the API, and the job completes serving the worker's
 * model.safetensors byte for byte. */
Test(report, a_worker_run_reports_over_the_api)
{
	long long a = submit(SLURM_JOB);
	cr_assert_str_eq(wait_for(a, "running|failed", 30), "running");
	char token[128], dir[300], out[300], cmd[2000], path[400];
	read_token(a, token, sizeof token);
	snprintf(dir, sizeof dir, "%s/slurm/job-%lld", d.dir, a);
	snprintf(out, sizeof out, "%s/node-local", bin);
	/* The token file as the worker gets it, beside its outputs. */
	snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp -p '%s/report.token' '%s/' && cp '%s/job.json' '%s/'", out, dir,
		 out, dir, out);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
	snprintf(cmd, sizeof cmd,
		 "'%s' run '%s/job.json' --out '%s' --backend cpu --devices 1 --quiet"
		 " --report-url '%s/jobs/%lld/report' --report-token-file '%s/report.token'",
		 getenv("TR_TRAINERD"), out, out, d.base_url, a, out);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
	snprintf(path, sizeof path, "%s/reported", dir);
	cr_assert_eq(access(path, F_OK), 0, "no report arrived");
	char sid[32] = "";
	snprintf(path, sizeof path, "%s/slurm_job_id", dir);
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f);
	cr_assert(fgets(sid, sizeof sid, f));
	fclose(f);
	snprintf(path, sizeof path, "%s/ended-%s", bin, sid);
	write_file(path, "COMPLETED", 0644);
	cr_assert_str_eq(wait_for(a, "completed|failed|cancelled", 30), "completed");
	json_t *j = job_get(a);
	json_t *p = json_object_get(j, "progress");
	cr_assert_eq(json_integer_value(json_object_get(p, "total_steps")), 8, "%s", json_dumps(j, 0));
	cr_assert_eq(json_integer_value(json_object_get(p, "step")), 8, "%s", json_dumps(j, 0));
	json_decref(j);
	/* Each point of the worker's file once. */
	int lines = 0;
	snprintf(path, sizeof path, "%s/metrics.jsonl", out);
	f = fopen(path, "r");
	cr_assert_not_null(f);
	char line[512];
	while (fgets(line, sizeof line, f))
		lines += strstr(line, "\"name\":\"loss\"") != NULL;
	fclose(f);
	long long steps[64];
	usleep(500 * 1000); /* the store's flush */
	cr_assert_eq(series_steps(a, "loss", steps, 64), lines, "loss points: the file has %d", lines);
	cr_assert_eq(lines, 8);
	/* The weights served are the worker's file, byte for byte. */
	snprintf(path, sizeof path, "/jobs/%lld/checkpoints/latest/model.safetensors", a);
	struct http_reply r;
	http(&d, "GET", path, NULL, NULL, "Authorization: Bearer " READER, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	snprintf(path, sizeof path, "%s/model.safetensors", out);
	f = fopen(path, "rb");
	cr_assert_not_null(f);
	static char want[1 << 20];
	size_t n = fread(want, 1, sizeof want, f);
	fclose(f);
	cr_assert(n > 0 && n == r.len && memcmp(want, r.body, n) == 0, "served %zu bytes, the worker wrote %zu", r.len,
		  n);
	http_free(&r);
	/* An upload with another credential than the job's token. */
	long long b = submit(SLURM_JOB);
	cr_assert_str_eq(wait_for(b, "running|failed", 30), "running");
	char pb[64];
	snprintf(pb, sizeof pb, "/jobs/%lld/report/model.safetensors", b);
	cr_assert_eq(status_of("PUT", pb, "x", READER), 403);
	cr_assert_eq(status_of("PUT", pb, "x", NULL), 401);
	snprintf(pb, sizeof pb, "/jobs/%lld/report/other.bin", b);
	cr_assert_eq(status_of("PUT", pb, "x", WRITER), 400);
}

/* The step in a checkpoint's header (safetensors: 8-byte length, then
 * JSON whose __metadata__ has the step as a string); -1 when none. */
static long long checkpoint_step(const char *body, size_t len)
{
	unsigned long long n = 0;
	for (int i = 7; len >= 8 && i >= 0; i--)
		n = n << 8 | (unsigned char)body[i];
	if (len < 8 || n == 0 || n > len - 8)
		return -1;
	json_t *h = json_loadb(body + 8, n, 0, NULL);
	const char *s = json_string_value(json_object_get(json_object_get(h, "__metadata__"), "step"));
	long long step = s ? atoll(s) : -1;
	json_decref(h);
	return step;
}

/* A worker that starts again after a requeue, on a node without the
 * daemon's folder, fetches the checkpoint the job uploaded with
 * GET /jobs/{id}/report/checkpoint.safetensors: with the job's token
 * (another job's is 403, none or a wrong one 401; a read role token
 * reads it too), 404 while none was uploaded, 400 for another file.  A
 * real worker uploads its periodic checkpoints as it writes them: killed
 * (SIGKILL, no final upload) after one, the daemon serves a checkpoint
 * of a step before its last. */
Test(report, a_worker_fetches_the_checkpoint_it_uploaded)
{
	long long a = submit(SLURM_JOB_SLOW), b = submit(SLURM_JOB);
	cr_assert_str_eq(wait_for(a, "running|failed", 30), "running");
	cr_assert_str_eq(wait_for(b, "running|failed", 30), "running");
	char ta[128], tb[128], path[128], dir[300], out[300], cmd[2000], file[400];
	read_token(a, ta, sizeof ta);
	read_token(b, tb, sizeof tb);
	snprintf(path, sizeof path, "/jobs/%lld/report/checkpoint.safetensors", a);
	cr_expect_eq(status_of("GET", path, NULL, NULL), 401);
	cr_expect_eq(status_of("GET", path, NULL, "not-a-token"), 401);
	cr_expect_eq(status_of("GET", path, NULL, tb), 403, "another job's token");
	cr_expect_eq(status_of("GET", path, NULL, ta), 404, "nothing uploaded yet");
	cr_expect_eq(status_of("GET", path, NULL, READER), 404);
	char other[128];
	snprintf(other, sizeof other, "/jobs/%lld/report/model.safetensors", a);
	cr_expect_eq(status_of("GET", other, NULL, ta), 400);

	/* The worker, in a folder of its own, checkpointing every 2 steps. */
	snprintf(dir, sizeof dir, "%s/slurm/job-%lld", d.dir, a);
	snprintf(out, sizeof out, "%s/node-a", bin);
	snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp -p '%s/report.token' '%s/' && cp '%s/job.json' '%s/'", out, dir,
		 out, dir, out);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
	snprintf(cmd, sizeof cmd,
		 "exec '%s' run '%s/job.json' --out '%s' --backend cpu --devices 1 --quiet"
		 " --report-url '%s/jobs/%lld/report' --report-token-file '%s/report.token' & echo $! >'%s/pid'",
		 getenv("TR_TRAINERD"), out, out, d.base_url, a, out, out);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
	snprintf(file, sizeof file, "%s/pid", out);
	FILE *f = fopen(file, "r");
	cr_assert_not_null(f);
	int pid = 0;
	cr_assert_eq(fscanf(f, "%d", &pid), 1);
	fclose(f);
	/* Until the daemon's folder has a checkpoint (bounded), then killed. */
	snprintf(file, sizeof file, "%s/checkpoint.safetensors", dir);
	double end = now_s() + 60;
	while (access(file, F_OK) != 0 && now_s() < end)
		usleep(20 * 1000);
	kill(pid, SIGKILL);
	cr_assert_eq(access(file, F_OK), 0, "no periodic checkpoint was uploaded within 60 s");
	snprintf(file, sizeof file, "%s/summary.json", out);
	cr_expect_neq(access(file, F_OK), 0, "the worker ended before it was killed: a test too slow to tell");
	struct http_reply r;
	char h[200];
	snprintf(h, sizeof h, "Authorization: Bearer %s", ta);
	http(&d, "GET", path, NULL, NULL, h, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	long long step = checkpoint_step(r.body, r.len);
	cr_expect(step >= 2 && step < 40, "the checkpoint served is of step %lld (periodic: 2, 4, ...; the last is 40)",
		  step);
	http_free(&r);
	/* The job ends: its token goes, and with it the fetch. */
	char sid[32] = "";
	snprintf(file, sizeof file, "%s/slurm_job_id", dir);
	f = fopen(file, "r");
	cr_assert_not_null(f);
	cr_assert(fgets(sid, sizeof sid, f));
	fclose(f);
	sid[strcspn(sid, "\n")] = 0;
	snprintf(file, sizeof file, "%s/cancelled-%s", bin, sid);
	write_file(file, "", 0644);
	wait_for(a, "cancelled|failed|completed", 30);
	cr_expect_eq(status_of("GET", path, NULL, ta), 401);
}
