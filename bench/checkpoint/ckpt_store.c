/* ckpt_store: times trainerd's checkpoint storage path directly, without
 * the daemon: tr_store_ckpt_begin / write / commit on a fresh database, as
 * daemon/checkpointer.c calls them (a small header, then the parameters
 * and the optimizer buffers as separate writes), plus the ceilings that
 * bound it: SHA-256 on one thread (the writer hashes beside SQLite on a
 * helper thread) and memcpy.
 *
 *   ckpt_store DIR MB [ROUNDS]
 *
 * DIR: a directory for the database (created; each round uses a fresh
 * database file there, deleted afterwards).  MB: the blob size in 1e6
 * bytes, split 1/3 parameters + 2/3 Adam state like a checkpoint.  One
 * JSON line per round on stdout.
 *
 * Build (bench/checkpoint/run.sh does this):
 *   cc -O2 -std=c11 -I. bench/checkpoint/ckpt_store.c BUILD/storage/libtrstore.a \
 *      $(pkg-config --libs sqlite3 jansson) -lpthread
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "storage/checkpoints.h"
#include "storage/sha256.h"
#include "storage/store.h"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void fill(float *p, size_t n, uint64_t seed)
{
	/* Not zeros: float bit patterns like real weights (SQLite does not
	 * compress, but a page full of zeros is not a fair test of anything). */
	uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = (float)((int64_t)(x >> 11) - (int64_t)(1ull << 52)) * 1e-17f;
	}
}

static void rm_db(const char *path)
{
	char p[4096];
	const char *suffix[] = {"", "-wal", "-shm"};
	for (int i = 0; i < 3; i++) {
		snprintf(p, sizeof p, "%s%s", path, suffix[i]);
		unlink(p);
	}
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: ckpt_store DIR MB [ROUNDS]\n");
		return 2;
	}
	const char *dir = argv[1];
	double mb = atof(argv[2]);
	int rounds = argc > 3 ? atoi(argv[3]) : 1;
	if (mb <= 0 || mb > 8000 || rounds < 1 || rounds > 20) {
		fprintf(stderr, "ckpt_store: 0 < MB <= 8000, 1 <= ROUNDS <= 20\n");
		return 2;
	}
	mkdir(dir, 0755);
	size_t n_params = (size_t)(mb * 1e6 / 12.0); /* params + 2 Adam buffers, 4 bytes each */
	size_t bytes = n_params * 4;
	float *seg[3];
	for (int k = 0; k < 3; k++) {
		seg[k] = malloc(bytes);
		if (!seg[k]) {
			fprintf(stderr, "ckpt_store: out of memory\n");
			return 1;
		}
		fill(seg[k], n_params, (uint64_t)k + 1);
	}
	char header[4096];
	memset(header, ' ', sizeof header);
	static char model_header[512];
	memset(model_header, ' ', sizeof model_header);

	/* Ceilings on this machine, same buffers. */
	double t = now_s();
	struct tr_sha256 sha;
	tr_sha256_init(&sha);
	for (int k = 0; k < 3; k++)
		tr_sha256_update(&sha, seg[k], bytes);
	unsigned char dg[32];
	tr_sha256_final(&sha, dg);
	double sha_s = now_s() - t;
	char *copy = malloc(bytes);
	memcpy(copy, seg[0], bytes); /* fault the pages in first */
	t = now_s();
	for (int k = 0; k < 3; k++)
		memcpy(copy, seg[k], bytes);
	double memcpy_s = now_s() - t;
	free(copy);

	char path[4096];
	snprintf(path, sizeof path, "%s/ckpt_store.db", dir);
	for (int r = 0; r < rounds; r++) {
		rm_db(path);
		tr_store_t *s;
		char err[512];
		if (tr_store_open(path, NULL, &s, err, sizeof err) < 0) {
			fprintf(stderr, "ckpt_store: %s\n", err);
			return 1;
		}
		struct tr_job_row row = {.name = "ckpt-bench", .spec = "{}", .normalized = "{}", .devices = "[]"};
		if (tr_store_job_insert(s, &row, NULL) < 0) {
			fprintf(stderr, "ckpt_store: job insert: %s\n", tr_store_error(s));
			return 1;
		}
		tr_ckpt_writer_t *w;
		double t0 = now_s();
		int rc = tr_store_ckpt_begin(s, row.id, 100, 0, "{\"reason\":\"bench\"}", &w);
		double t1 = now_s();
		if (rc == 0)
			rc = tr_store_ckpt_write(w, header, sizeof header);
		for (int k = 0; rc == 0 && k < 3; k++)
			rc = tr_store_ckpt_write(w, seg[k], bytes);
		double t2 = now_s();
		struct tr_ckpt_row out = {0};
		if (rc == 0)
			rc = tr_store_ckpt_commit(w, model_header, sizeof model_header, sizeof header, (int64_t)bytes, 3,
						  &out);
		else
			tr_store_ckpt_abort(w);
		double t3 = now_s();
		if (rc < 0) {
			fprintf(stderr, "ckpt_store: %s\n", tr_store_error(s));
			return 1;
		}
		tr_ckpt_row_finish(&out);
		tr_store_close(s);
		double t4 = now_s();
		struct stat st;
		long long db_bytes = stat(path, &st) == 0 ? (long long)st.st_size : -1;
		double total_mb = (double)(3 * bytes + sizeof header) / 1e6;
		printf("{\"round\":%d,\"mb\":%.1f,\"begin_ms\":%.1f,\"write_ms\":%.1f,\"commit_ms\":%.1f,"
		       "\"total_ms\":%.1f,\"mb_per_s\":%.1f,\"close_ms\":%.1f,\"db_bytes\":%lld,"
		       "\"sha256_1thread_mb_per_s\":%.1f,\"memcpy_mb_per_s\":%.1f}\n",
		       r + 1, total_mb, (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, (t3 - t0) * 1e3,
		       total_mb / (t3 - t0), (t4 - t3) * 1e3, db_bytes, 3 * bytes / 1e6 / sha_s,
		       3 * bytes / 1e6 / memcpy_s);
		fflush(stdout);
		rm_db(path);
	}
	for (int k = 0; k < 3; k++)
		free(seg[k]);
	return 0;
}
