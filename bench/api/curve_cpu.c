/* bench/api/curve_cpu.c: CPU time of a whole downsampled metrics answer
 * (the text GET /jobs/{id}/metrics renders) for a job with five series,
 * computed from scratch and after each commit of one more step, with and
 * without the whole-curve memo (bench/api/RESULTS.md).  Thread CPU time,
 * so other load on the machine matters less than for latencies.
 *
 *   cc -O2 -I. -IBUILD bench/api/curve_cpu.c BUILD/api/libtrapi.a \
 *      BUILD/storage/libtrstore.a $(pkg-config --libs jansson sqlite3 libmicrohttpd) -lm -lpthread
 *   ./a.out POINTS_PER_SERIES MAX_POINTS [memo]
 */
#include "api/metrics_stream.h"
#include "storage/store.h"

#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double cpu_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static double render(tr_store_t *s, int64_t job, const struct tr_metrics_query *q)
{
	char *text;
	size_t len;
	double t = cpu_ms();
	struct tr_error e = {0};
	if (tr_api_metrics_render(s, job, q, 0, &text, &len, &e) != 0) {
		fprintf(stderr, "render: %s\n", e.message);
		exit(1);
	}
	t = cpu_ms() - t;
	free(text);
	return t;
}

int main(int argc, char **argv)
{
	int npts = argc > 1 ? atoi(argv[1]) : 5000, mp = argc > 2 ? atoi(argv[2]) : 500;
	char path[] = "/tmp/curve_cpu_XXXXXX", db[64];
	const char *names[] = {"loss", "lr", "step_ms", "data_wait_ms", "samples_per_sec"};
	tr_store_t *s;
	int64_t existing;

	if (!mkdtemp(path))
		return 1;
	snprintf(db, sizeof db, "%s/t.db", path);
	struct tr_error oerr;
	if (tr_store_open(db, NULL, &s, &oerr)) {
		fprintf(stderr, "%s\n", oerr.message);
		return 1;
	}
	struct tr_job_row r = {.name = "a", .spec = "{}", .normalized = "{}", .devices = "[]", .submitted_at = 1};
	tr_store_job_insert(s, &r, &existing, NULL);
	for (int i = 0; i < npts; i++)
		for (int k = 0; k < 5; k++)
			tr_store_metric_append(s, r.id, names[k], i, 0, 1e9 + i, sin(i * 0.01 * k) + i * 1e-3, NULL);
	tr_store_flush(s, NULL);
	/* As a long-running daemon's database is: mostly checkpointed. */
	sqlite3 *raw;
	sqlite3_open(db, &raw);
	sqlite3_exec(raw, "PRAGMA wal_checkpoint(TRUNCATE)", 0, 0, 0);
	sqlite3_close(raw);
	struct tr_metrics_query q = {.to_step = INT64_MAX, .max_points = mp, .want_text = argc > 3};
	double best = 1e9, sum = 0;
	for (int i = 0; i < 20; i++) {
		double t = render(s, r.id, &q);
		best = t < best ? t : best;
		sum += t;
	}
	printf("%d points x 5 series, max_points %d, memo %s: repeated: best %.2f mean %.2f ms CPU\n", npts, mp,
	       q.want_text ? "on" : "off", best, sum / 20);
	best = 1e9;
	sum = 0;
	for (int i = 0; i < 50; i++) {
		for (int k = 0; k < 5; k++)
			tr_store_metric_append(s, r.id, names[k], npts + i, 0, 1e9, 0.5, NULL);
		tr_store_flush(s, NULL);
		double t = render(s, r.id, &q);
		best = t < best ? t : best;
		sum += t;
	}
	printf("%d points x 5 series, max_points %d, memo %s: after each commit: best %.2f mean %.2f ms CPU\n", npts,
	       mp, q.want_text ? "on" : "off", best, sum / 50);
	tr_store_close(s);
	unlink(db);
	char side[80];
	snprintf(side, sizeof side, "%s-wal", db);
	unlink(side);
	snprintf(side, sizeof side, "%s-shm", db);
	unlink(side);
	rmdir(path);
	return 0;
}
