/* ckpt_store: times trainerd's checkpoint storage path directly, without
 * the daemon: tr_store_ckpt_begin / write / commit on a fresh database, as
 * daemon/checkpointer.c calls them (a small header, then the parameters
 * and the optimizer buffers as separate writes), plus the ceilings that
 * bound it: SHA-256 on one thread (the writer hashes beside SQLite on a
 * helper thread) and memcpy.
 *
 *   ckpt_store DIR MB [ROUNDS [PAGE_SIZE]]
 *   ckpt_store --sqlite DIR MB PAGE_SIZE AUTOCHECKPOINT
 *   ckpt_store --metrics DIR PAGE_SIZE POINTS
 *
 * DIR: a directory for the database (created; each round uses a fresh
 * database file there, deleted afterwards).  MB: the blob size in 1e6
 * bytes, split 1/3 parameters + 2/3 Adam state like a checkpoint.  One
 * JSON line per round on stdout.  PAGE_SIZE: create the database with
 * this page size first (as an older trainerd did with 4096) instead of
 * letting tr_store_open choose.
 *
 * --sqlite: a diagnostic of SQLite alone (no hashing, no trainerd code):
 * the same chunk table, connection settings (WAL, synchronous=NORMAL,
 * journal_size_limit 64 MiB) and one BEGIN IMMEDIATE transaction per 4 MiB
 * chunk as the checkpoint writer once did (storage/checkpoints_write.c), with the page size and
 * wal_autocheckpoint given (trainerd runs with SQLite's defaults, 4096 and
 * 1000; AUTOCHECKPOINT 0 = off, one TRUNCATE checkpoint at the end, timed
 * in).  Shows what the storage engine itself costs per MB.
 *
 * --metrics: what the page size costs metrics writes: a store whose
 * database was created with PAGE_SIZE (4096 = databases made before
 * trainerd chose 65536) takes POINTS points (5 names, step by step) through
 * tr_store_metric_append, flushed every 1,000 points (a flush interval's
 * worth for a fast job); the total time, the median and worst flush, the
 * process's CPU time and the bytes it wrote (WAL and database file).
 *
 * Build (bench/checkpoint/run.sh does this):
 *   cc -O2 -std=c11 -I. bench/checkpoint/ckpt_store.c BUILD/storage/libtrstore.a \
 *      $(pkg-config --libs sqlite3 jansson) -lpthread
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

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

/* The database, its WAL and shared memory, and its checkpoint files. */
static void rm_db(const char *path)
{
	char p[4096 + 16];
	const char *suffix[] = {"", "-wal", "-shm"};
	for (int i = 0; i < 3; i++) {
		snprintf(p, sizeof p, "%s%s", path, suffix[i]);
		unlink(p);
	}
	snprintf(p, sizeof p, "%s-checkpoints", path);
	DIR *d = opendir(p);
	struct dirent *e;
	while (d && (e = readdir(d)))
		if (e->d_name[0] != '.')
			unlinkat(dirfd(d), e->d_name, 0);
	if (d)
		closedir(d);
	rmdir(p);
}

/* Bytes in the database's checkpoint files. */
static long long files_bytes(const char *path)
{
	char p[4096 + 16];
	snprintf(p, sizeof p, "%s-checkpoints", path);
	long long n = 0;
	DIR *d = opendir(p);
	struct dirent *e;
	struct stat st;
	while (d && (e = readdir(d)))
		if (e->d_name[0] != '.' && fstatat(dirfd(d), e->d_name, &st, 0) == 0)
			n += st.st_size;
	if (d)
		closedir(d);
	return n;
}

static int exec(sqlite3 *db, const char *sql)
{
	char *msg = NULL;
	if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
		fprintf(stderr, "ckpt_store: %s: %s\n", sql, msg ? msg : "?");
		sqlite3_free(msg);
		return -1;
	}
	return 0;
}

static int sqlite_only(const char *dir, double mb, int page_size, int autockpt)
{
	const size_t chunk = (size_t)4 << 20;
	size_t total = (size_t)(mb * 1e6);
	unsigned char *buf = malloc(total);
	if (!buf)
		return 1;
	fill((float *)buf, total / 4, 7);
	mkdir(dir, 0755);
	char path[4096], sql[256];
	snprintf(path, sizeof path, "%s/sqlite_only.db", dir);
	rm_db(path);
	sqlite3 *db;
	if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, NULL) !=
	    SQLITE_OK)
		return 1;
	snprintf(sql, sizeof sql, "PRAGMA page_size=%d", page_size);
	if (exec(db, sql) || exec(db, "PRAGMA journal_mode=WAL") ||
	    exec(db, "PRAGMA synchronous=NORMAL; PRAGMA journal_size_limit=67108864"))
		return 1;
	snprintf(sql, sizeof sql, "PRAGMA wal_autocheckpoint=%d", autockpt);
	if (exec(db, sql) || exec(db, "CREATE TABLE c (id INTEGER PRIMARY KEY, checkpoint_id INTEGER NOT NULL,"
				      " seq INTEGER NOT NULL, data BLOB NOT NULL, UNIQUE (checkpoint_id, seq))"))
		return 1;
	sqlite3_stmt *st;
	if (sqlite3_prepare_v2(db, "INSERT INTO c (checkpoint_id, seq, data) VALUES (1, ?1, ?2)", -1, &st, NULL) !=
	    SQLITE_OK)
		return 1;
	double t0 = now_s();
	int64_t seq = 0;
	for (size_t off = 0; off < total; off += chunk, seq++) {
		size_t n = total - off < chunk ? total - off : chunk;
		if (exec(db, "BEGIN IMMEDIATE"))
			return 1;
		sqlite3_bind_int64(st, 1, seq);
		sqlite3_bind_blob64(st, 2, buf + off, n, SQLITE_STATIC);
		if (sqlite3_step(st) != SQLITE_DONE) {
			fprintf(stderr, "ckpt_store: insert: %s\n", sqlite3_errmsg(db));
			return 1;
		}
		sqlite3_reset(st);
		if (exec(db, "COMMIT"))
			return 1;
	}
	double t1 = now_s();
	if (autockpt == 0 && exec(db, "PRAGMA wal_checkpoint(TRUNCATE)"))
		return 1;
	double t2 = now_s();
	sqlite3_finalize(st);
	sqlite3_close(db);
	printf("{\"mode\":\"sqlite_only\",\"mb\":%.1f,\"page_size\":%d,\"wal_autocheckpoint\":%d,"
	       "\"insert_ms\":%.1f,\"final_checkpoint_ms\":%.1f,\"mb_per_s\":%.1f}\n",
	       total / 1e6, page_size, autockpt, (t1 - t0) * 1e3, (t2 - t1) * 1e3, total / 1e6 / (t2 - t0));
	rm_db(path);
	free(buf);
	return 0;
}

/* An empty WAL database with the given page size (which SQLite then keeps). */
static int precreate(const char *path, int page_size)
{
	sqlite3 *db;
	char sql[64];
	if (sqlite3_open(path, &db) != SQLITE_OK)
		return -1;
	snprintf(sql, sizeof sql, "PRAGMA page_size=%d", page_size);
	int rc = exec(db, sql) || exec(db, "PRAGMA journal_mode=WAL") ? -1 : 0;
	sqlite3_close(db);
	return rc;
}

/* A fresh database at path (page_size 0: tr_store_open's choice) holding
 * one job named `name`; NULL with a message on stderr. */
static tr_store_t *fresh_store(const char *path, int page_size, const char *name, int64_t *job)
{
	rm_db(path);
	if (page_size > 0 && precreate(path, page_size) < 0)
		return NULL;
	tr_store_t *s;
	struct tr_error err;
	if (tr_store_open(path, NULL, &s, &err) < 0) {
		fprintf(stderr, "ckpt_store: %s\n", err.message);
		return NULL;
	}
	struct tr_job_row row = {.name = (char *)name, .spec = "{}", .normalized = "{}", .devices = "[]"};
	if (tr_store_job_insert(s, &row, NULL, &err) < 0) {
		fprintf(stderr, "ckpt_store: job insert: %s\n", err.message);
		tr_store_close(s);
		return NULL;
	}
	*job = row.id;
	return s;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Bytes this process has handed to write calls so far (/proc/self/io). */
static long long written_bytes(void)
{
	FILE *f = fopen("/proc/self/io", "r");
	long long v = -1;
	char line[128];
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "wchar: %lld", &v) == 1)
			break;
	if (f)
		fclose(f);
	return v;
}

static double cpu_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int metrics_only(const char *dir, int page_size, long points)
{
	char path[4096];
	mkdir(dir, 0755);
	snprintf(path, sizeof path, "%s/metrics_only.db", dir);
	int64_t job;
	tr_store_t *s = fresh_store(path, page_size, "metrics-bench", &job);
	if (!s)
		return 1;
	static const char *names[] = {"loss", "lr", "step_ms", "data_wait_ms", "samples_per_sec"};
	long nflush = points / 1000 + 1, k = 0;
	double *flush_ms = calloc((size_t)nflush, sizeof *flush_ms);
	double t0 = now_s(), c0 = cpu_s();
	long long w0 = written_bytes();
	for (long i = 0; i < points; i++) {
		if (tr_store_metric_append(s, job, names[i % 5], i / 5, 0, 0, 1.0 / (double)(i + 1), NULL) < 0)
			return 1;
		if ((i + 1) % 1000 == 0 || i + 1 == points) {
			double t = now_s();
			if (tr_store_flush(s, NULL) < 0)
				return 1;
			flush_ms[k++] = (now_s() - t) * 1e3;
		}
	}
	double total = now_s() - t0, cpu = cpu_s() - c0;
	long long written = written_bytes() - w0;
	tr_store_close(s);
	qsort(flush_ms, (size_t)k, sizeof *flush_ms, cmp_double);
	printf("{\"mode\":\"metrics_only\",\"page_size\":%d,\"points\":%ld,\"total_ms\":%.1f,"
	       "\"points_per_s\":%.0f,\"flush_ms_median\":%.2f,\"flush_ms_max\":%.2f,\"cpu_ms\":%.1f,"
	       "\"written_mb\":%.1f}\n",
	       page_size, points, total * 1e3, points / total, flush_ms[k / 2], flush_ms[k - 1], cpu * 1e3,
	       written / 1e6);
	free(flush_ms);
	rm_db(path);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 6 && strcmp(argv[1], "--sqlite") == 0)
		return sqlite_only(argv[2], atof(argv[3]), atoi(argv[4]), atoi(argv[5]));
	if (argc == 5 && strcmp(argv[1], "--metrics") == 0)
		return metrics_only(argv[2], atoi(argv[3]), atol(argv[4]));
	if (argc < 3) {
		fprintf(stderr, "usage: ckpt_store DIR MB [ROUNDS]\n");
		return 2;
	}
	const char *dir = argv[1];
	double mb = atof(argv[2]);
	int rounds = argc > 3 ? atoi(argv[3]) : 1;
	int page_size = argc > 4 ? atoi(argv[4]) : 0;
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
		int64_t job;
		tr_store_t *s = fresh_store(path, page_size, "ckpt-bench", &job);
		if (!s)
			return 1;
		tr_ckpt_writer_t *w;
		struct tr_error e = {0};
		double c0 = cpu_s(); /* all threads: the hashing helpers too */
		double t0 = now_s();
		int rc = tr_store_ckpt_begin(s, job, 100, 0, "{\"reason\":\"bench\"}", &w, &e);
		double t1 = now_s();
		if (rc == 0)
			rc = tr_store_ckpt_write(w, header, sizeof header, &e);
		for (int k = 0; rc == 0 && k < 3; k++)
			rc = tr_store_ckpt_write(w, seg[k], bytes, &e);
		double t2 = now_s();
		struct tr_ckpt_row out = {0};
		if (rc == 0)
			rc = tr_store_ckpt_commit(w, model_header, sizeof model_header, sizeof header, (int64_t)bytes,
						  3, &out, &e);
		else
			tr_store_ckpt_abort(w);
		double t3 = now_s(), c3 = cpu_s();
		if (rc < 0) {
			fprintf(stderr, "ckpt_store: %s\n", e.message);
			return 1;
		}
		tr_ckpt_row_finish(&out);
		tr_store_close(s);
		double t4 = now_s();
		struct stat st;
		long long db_bytes = stat(path, &st) == 0 ? (long long)st.st_size : -1;
		long long file_bytes = files_bytes(path);
		double total_mb = (double)(3 * bytes + sizeof header) / 1e6;
		printf("{\"round\":%d,\"mb\":%.1f,\"begin_ms\":%.1f,\"write_ms\":%.1f,\"commit_ms\":%.1f,"
		       "\"total_ms\":%.1f,\"mb_per_s\":%.1f,\"cpu_ms\":%.1f,"
		       "\"close_ms\":%.1f,\"db_bytes\":%lld,\"file_bytes\":%lld,"
		       "\"sha256_1thread_mb_per_s\":%.1f,\"memcpy_mb_per_s\":%.1f}\n",
		       r + 1, total_mb, (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, (t3 - t0) * 1e3,
		       total_mb / (t3 - t0), (c3 - c0) * 1e3, (t4 - t3) * 1e3, db_bytes, file_bytes,
		       3 * bytes / 1e6 / sha_s, 3 * bytes / 1e6 / memcpy_s);
		fflush(stdout);
		rm_db(path);
	}
	for (int k = 0; k < 3; k++)
		free(seg[k]);
	return 0;
}
