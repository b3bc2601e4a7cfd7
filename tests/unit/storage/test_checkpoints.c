/* Storage checkpoints: SHA-256 against the FIPS 180-4 vectors (both block
 * functions, the SHA-NI one against the portable one), chunked
 * write/commit/list/get/load round trips at the chunk-size edges, random
 * access reads across chunk boundaries, pruning, incomplete checkpoints,
 * corruption, a full database, job deletion, the metrics writer running
 * beside a large checkpoint, the page size of new and old databases, the
 * checkpoint files (written once, beside the store's write-ahead log;
 * leftovers swept at open; older checkpoints stored in the database still
 * read), and the reuse of snapshot buffers. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/checkpoint.h"
#include "storage/checkpoints.h"
#include "storage/sha256.h"
#include "storage/store.h"

#define MiB ((size_t)1 << 20)
#define CHUNK (4 * MiB)

/* ---- helpers ------------------------------------------------------------------- */

static char dir[64], db_path[128], files_dir[160];
/* What the last checkpoint call of the test's thread reported (docs/design.md, "Errors"). */
static struct tr_error te;

static void make_dir(void)
{
	snprintf(dir, sizeof dir, "/tmp/trckpt-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(db_path, sizeof db_path, "%s/state.db", dir);
	snprintf(files_dir, sizeof files_dir, "%s-checkpoints", db_path);
}

/* What a walk over the checkpoint files adds up. */
enum file_fact { FILE_COUNT, FILE_BYTES, FILE_CHUNKS, FILE_REMOVE };
static int64_t path_int(const char *path, const char *sql);

/* Walks the checkpoint file directory (missing = empty): counts its
 * checkpoint files or sums their chunk rows (the spare, a pruned file kept
 * for reuse, holds no checkpoint and is left out), sums the sizes of all
 * files, or removes them all. */
static int64_t over_files(enum file_fact what)
{
	int64_t n = 0;
	DIR *d = opendir(files_dir);
	struct dirent *e;
	while (d && (e = readdir(d))) {
		if (e->d_name[0] == '.' ||
		    ((what == FILE_COUNT || what == FILE_CHUNKS) && strcmp(e->d_name, "spare.sqlite") == 0))
			continue;
		char p[512];
		snprintf(p, sizeof p, "%s/%s", files_dir, e->d_name);
		struct stat st;
		if (what == FILE_COUNT)
			n++;
		else if (what == FILE_BYTES && stat(p, &st) == 0)
			n += st.st_size;
		else if (what == FILE_CHUNKS)
			n += path_int(p, "SELECT count(*) FROM chunks");
		else if (what == FILE_REMOVE)
			unlink(p);
	}
	if (d)
		closedir(d);
	return n;
}

static void remove_dir(void)
{
	over_files(FILE_REMOVE);
	rmdir(files_dir);
	const char *suffix[] = {"", "-wal", "-shm"};
	char p[160];
	for (int i = 0; i < 3; i++) {
		snprintf(p, sizeof p, "%s%s", db_path, suffix[i]);
		unlink(p);
	}
	rmdir(dir);
}

TestSuite(sha256);
TestSuite(ckpt, .init = make_dir, .fini = remove_dir);

static tr_store_t *open_store(const struct tr_store_options *opts)
{
	tr_store_t *s = NULL;
	struct tr_error err = {0};
	int rc = tr_store_open(db_path, opts, &s, &err);
	cr_assert_eq(rc, 0, "open: %d %s", rc, err.message);
	return s;
}

static int64_t add_job(tr_store_t *s)
{
	struct tr_job_row r = {.name = "j", .spec = "{\"epochs\":1}"};
	struct tr_error je = {0};
	cr_assert_eq(tr_store_job_insert(s, &r, NULL, &je), 0, "insert: %s", je.message);
	return r.id;
}

/* A single integer from SQL on a separate raw connection to path. */
static int64_t path_int(const char *path, const char *sql)
{
	sqlite3 *db;
	cr_assert_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK, "%s", path);
	sqlite3_busy_timeout(db, 5000);
	sqlite3_stmt *st;
	cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(db));
	cr_assert_eq(sqlite3_step(st), SQLITE_ROW, "%s", sql);
	int64_t v = sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	sqlite3_close(db);
	return v;
}

/* ... on the store's database. */
static int64_t sql_int(const char *sql)
{
	return path_int(db_path, sql);
}

/* Checkpoint id's own file. */
static void file_of(int64_t id, char *out, size_t n)
{
	snprintf(out, n, "%s/%lld.sqlite", files_dir, (long long)id);
}

/* Checkpoint id's chunks in its file; -1 when it has none. */
static int64_t file_chunks(int64_t id)
{
	char p[256];
	file_of(id, p, sizeof p);
	return access(p, F_OK) == 0 ? path_int(p, "SELECT count(*) FROM chunks") : -1;
}

/* The store's pages plus its checkpoint files' bytes. */
static int64_t state_bytes(void)
{
	return sql_int("PRAGMA page_count") * sql_int("PRAGMA page_size") + over_files(FILE_BYTES);
}

static int count_files(void)
{
	return (int)over_files(FILE_COUNT);
}

/* Chunks stored anywhere: in checkpoint files and (older checkpoints) in
 * the store's checkpoint_chunks. */
static int64_t stored_chunks(void)
{
	return sql_int("SELECT count(*) FROM checkpoint_chunks") + over_files(FILE_CHUNKS);
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static uint64_t splitmix(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15u);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
	return z ^ (z >> 31);
}

static unsigned char *random_bytes(size_t n, uint64_t seed)
{
	unsigned char *p = malloc(n ? n : 1);
	cr_assert_not_null(p);
	for (size_t i = 0; i < n; i += 8) {
		uint64_t v = splitmix(&seed);
		memcpy(p + i, &v, n - i < 8 ? n - i : 8);
	}
	return p;
}

/* Writes data in pieces of irregular sizes (small ones, ones that straddle
 * a chunk edge, whole chunks) and commits.  Returns commit's result. */
static int write_ckpt_meta(tr_store_t *s, int64_t job, int64_t step, const char *meta, const unsigned char *data,
			   size_t n, int keep, struct tr_ckpt_row *row)
{
	tr_ckpt_writer_t *w;
	int rc = tr_store_ckpt_begin(s, job, step, step / 10, meta, &w, &te);
	cr_assert_eq(rc, 0, "begin: %s", te.message);
	static const size_t pieces[] = {1, 4093, 3 * MiB, 5 * MiB, 65536, 4 * MiB, 777777};
	size_t off = 0;
	for (int i = 0; off < n; i++) {
		size_t k = pieces[i % 7] < n - off ? pieces[i % 7] : n - off;
		rc = tr_store_ckpt_write(w, data + off, k, &te);
		if (rc < 0) {
			tr_store_ckpt_abort(w);
			return rc;
		}
		off += k;
	}
	static const char header[] = "{\"__metadata__\":{}}";
	size_t poff = n / 3, plen = n - n / 3 - n / 5;
	return tr_store_ckpt_commit(w, header, sizeof header - 1, (int64_t)poff, (int64_t)plen, keep, row, &te);
}

static int write_ckpt(tr_store_t *s, int64_t job, int64_t step, const unsigned char *data, size_t n, int keep,
		      struct tr_ckpt_row *row)
{
	return write_ckpt_meta(s, job, step, "{\"kind\":\"test\"}", data, n, keep, row);
}

static void expect_load(tr_store_t *s, const struct tr_ckpt_row *row, const unsigned char *data, size_t n)
{
	void *got = NULL;
	size_t len = 0;
	int rc = tr_store_ckpt_load(s, row, &got, &len, &te);
	cr_assert_eq(rc, 0, "load %zu bytes: %d %s", n, rc, te.message);
	cr_assert_not_null(got);
	cr_assert_eq(len, n);
	cr_assert(n == 0 || memcmp(got, data, n) == 0, "loaded bytes differ (%zu bytes)", n);
	free(got);
}

/* ---- SHA-256 --------------------------------------------------------------------- */

Test(sha256, fips_vectors)
{
	static const struct {
		const char *msg, *hex;
	} v[] = {
		{"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
		{"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
		 "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
		{"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
		 "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
	};
	char hex[65];
	for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
		tr_sha256_hex(v[i].msg, strlen(v[i].msg), hex);
		cr_assert_str_eq(hex, v[i].hex, "vector %zu", i);
	}
	size_t n = 1000000;
	char *a = malloc(n);
	cr_assert_not_null(a);
	memset(a, 'a', n);
	tr_sha256_hex(a, n, hex);
	cr_assert_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
	free(a);
}

/* Hashes p[0..n) with the default implementation, fed in pieces of random
 * sizes below max_piece (some empty) drawn from seed. */
static void hash_random_pieces(const unsigned char *p, size_t n, uint64_t seed, size_t max_piece, char hex[65])
{
	struct tr_sha256 c;
	tr_sha256_init(&c);
	for (size_t off = 0; off < n;) {
		size_t k = splitmix(&seed) % max_piece;
		k = k < n - off ? k : n - off;
		tr_sha256_update(&c, p + off, k);
		off += k;
	}
	tr_sha256_final_hex(&c, hex);
}

Test(sha256, incremental_equals_one_shot)
{
	/* Every split of the padding edge cases (55, 56, 63, 64, 65 bytes)
	 * and pieces of irregular sizes over a larger buffer. */
	size_t n = 300000;
	unsigned char *p = random_bytes(n, 7);
	char one[65], inc[65];
	for (size_t len = 0; len < 200; len++) {
		tr_sha256_hex(p, len, one);
		for (size_t cut = 0; cut <= len; cut += len / 7 + 1) {
			struct tr_sha256 c;
			tr_sha256_init(&c);
			tr_sha256_update(&c, p, cut);
			tr_sha256_update(&c, p + cut, len - cut);
			tr_sha256_final_hex(&c, inc);
			cr_assert_str_eq(inc, one, "len %zu cut %zu", len, cut);
		}
	}
	tr_sha256_hex(p, n, one);
	hash_random_pieces(p, n, 3, 1000, inc);
	cr_assert_str_eq(inc, one);
	free(p);
}

static void hash_pieces(const unsigned char *p, size_t n, size_t piece, char hex[65])
{
	struct tr_sha256 c;
	tr_sha256_init(&c);
	for (size_t off = 0; off < n; off += piece)
		tr_sha256_update(&c, p + off, piece < n - off ? piece : n - off);
	tr_sha256_final_hex(&c, hex);
}

/* The FIPS vectors again, fed in pieces that straddle blocks, and a
 * multi-chunk message hashed chunk by chunk (as the checkpoint writer
 * does) against one shot: the wrapper over nettle keeps no state of its
 * own that a piece boundary could disturb. */
Test(sha256, pieces_fips_and_chunks)
{
	size_t n = 1000000;
	unsigned char *a = malloc(n);
	cr_assert_not_null(a);
	memset(a, 'a', n);
	static const size_t pieces[] = {1, 63, 64, 65, 4097, 1 << 20, 1000000};
	char hex[65];
	for (size_t k = 0; k < sizeof pieces / sizeof pieces[0]; k++) {
		hash_pieces(a, n, pieces[k], hex);
		cr_assert_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0", "piece %zu",
				 pieces[k]);
	}
	hash_pieces((const unsigned char *)"abc", 3, 3, hex);
	cr_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	free(a);

	n = 3 * CHUNK + 12345;
	unsigned char *p = random_bytes(n, 11);
	char one[65];
	tr_sha256_hex(p, n, one);
	hash_pieces(p, n, CHUNK, hex);
	cr_assert_str_eq(hex, one, "4 MiB chunks");
	hash_pieces(p, n, 4093, hex);
	cr_assert_str_eq(hex, one, "odd pieces");
	hash_random_pieces(p, n, 5, 300000, hex);
	cr_assert_str_eq(hex, one, "random pieces");
	free(p);
}

/* ---- round trip ------------------------------------------------------------------ */

Test(ckpt, round_trip_sizes)
{
	tr_store_t *s = open_store(NULL);
	int64_t job = add_job(s);
	const size_t sizes[] = {0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 13 * MiB + 12345};
	const size_t nsizes = sizeof sizes / sizeof sizes[0];
	for (size_t i = 0; i < nsizes; i++) {
		size_t n = sizes[i];
		unsigned char *data = random_bytes(n, 100 + i);
		struct tr_ckpt_row row;
		int64_t step = 100 * (int64_t)(i + 1);
		int rc = write_ckpt(s, job, step, data, n, 0, &row);
		cr_assert_eq(rc, 0, "commit %zu bytes: %d %s", n, rc, te.message);
		char hex[65];
		tr_sha256_hex(data, n, hex);
		cr_assert_str_eq(row.sha256, hex);
		cr_assert_eq(row.bytes, (int64_t)n);
		cr_assert_eq(row.job_id, job);
		cr_assert_eq(row.step, step);
		cr_assert_eq(row.epoch, step / 10);
		cr_assert_eq(row.params_offset, (int64_t)(n / 3));
		cr_assert_eq(row.params_bytes, (int64_t)(n - n / 3 - n / 5));
		cr_assert_eq(row.model_header_len, 19);
		cr_assert_gt(row.created_at, 1e9);
		cr_assert_str_eq(row.meta, "{\"kind\":\"test\"}");

		cr_assert_eq(file_chunks(row.id), (int64_t)((n + CHUNK - 1) / CHUNK), "chunks of %zu bytes", n);

		struct tr_ckpt_row got;
		cr_assert_eq(tr_store_ckpt_get(s, job, step, &got, &te), 0, "%s", te.message);
		cr_assert_eq(got.id, row.id);
		cr_assert_str_eq(got.sha256, hex);
		tr_ckpt_row_finish(&got);
		cr_assert_eq(tr_store_ckpt_get(s, job, -1, &got, &te), 0);
		cr_assert_eq(got.id, row.id, "the newest is the one just written");
		tr_ckpt_row_finish(&got);

		expect_load(s, &row, data, n);

		void *hdr;
		size_t hlen;
		cr_assert_eq(tr_store_ckpt_model_header(s, row.id, &hdr, &hlen, &te), 0);
		cr_assert_eq(hlen, 19);
		cr_assert_arr_eq(hdr, "{\"__metadata__\":{}}", 19);
		free(hdr);
		tr_ckpt_row_finish(&row);
		free(data);
	}

	struct tr_ckpt_row *rows;
	int count;
	cr_assert_eq(tr_store_ckpt_list(s, job, &rows, &count, &te), 0);
	cr_assert_eq(count, (int)nsizes);
	for (int i = 0; i < count; i++)
		cr_assert_eq(rows[i].step, 100 * (int64_t)(nsizes - (size_t)i), "newest first");
	tr_ckpt_rows_free(rows, count);
	cr_assert_eq(tr_store_integrity_check(s, NULL), 0);
	tr_store_close(s);

	/* Everything survives a reopen. */
	s = open_store(NULL);
	cr_assert_eq(tr_store_ckpt_list(s, job, &rows, &count, &te), 0);
	cr_assert_eq(count, (int)nsizes);
	unsigned char *data = random_bytes(sizes[nsizes - 1], 100 + nsizes - 1);
	expect_load(s, &rows[0], data, sizes[nsizes - 1]);
	free(data);
	tr_ckpt_rows_free(rows, count);
	tr_store_close(s);
}

Test(ckpt, reads_across_chunk_boundaries)
{
	tr_store_t *s = open_store(NULL);
	int64_t job = add_job(s);
	size_t n = 13 * MiB + 4321;
	unsigned char *data = random_bytes(n, 42);
	struct tr_ckpt_row row;
	cr_assert_eq(write_ckpt(s, job, 1, data, n, 0, &row), 0, "%s", te.message);

	tr_ckpt_reader_t *r;
	cr_assert_eq(tr_store_ckpt_open(s, row.id, &r, &te), 0, "%s", te.message);
	unsigned char *buf = malloc(n + 16);
	cr_assert_not_null(buf);
	struct {
		uint64_t off;
		size_t len;
	} fixed[] = {
		{0, 1},         {CHUNK - 1, 2}, {CHUNK - 10, 20},   {2 * CHUNK - 1, CHUNK + 2},
		{CHUNK, CHUNK}, {1, 3 * CHUNK}, {3 * CHUNK - 5, 5}, {3 * CHUNK, n - 3 * CHUNK},
		{0, n},         {n - 1, 1},     {123, 0},
	};
	for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
		ssize_t got = tr_store_ckpt_read(r, fixed[i].off, buf, fixed[i].len, &te);
		cr_assert_eq(got, (ssize_t)fixed[i].len, "read %zu at %llu: %zd %s", fixed[i].len,
			     (unsigned long long)fixed[i].off, got, te.message);
		cr_assert_arr_eq(buf, data + fixed[i].off, fixed[i].len, "read %zu", i);
	}
	uint64_t seed = 9;
	for (int i = 0; i < 300; i++) {
		uint64_t off = splitmix(&seed) % n;
		size_t len = (size_t)(splitmix(&seed) % (i % 3 == 0 ? 9 * MiB : 70000));
		size_t want = len < n - off ? len : n - off;
		ssize_t got = tr_store_ckpt_read(r, off, buf, len, &te);
		cr_assert_eq(got, (ssize_t)want, "read %zu at %llu", len, (unsigned long long)off);
		cr_assert_arr_eq(buf, data + off, want, "read %zu at %llu", len, (unsigned long long)off);
	}
	/* At and past the end: 0; across it: the bytes that are there. */
	cr_assert_eq(tr_store_ckpt_read(r, n, buf, 10, &te), 0);
	cr_assert_eq(tr_store_ckpt_read(r, n + 5 * MiB, buf, 10, &te), 0);
	cr_assert_eq(tr_store_ckpt_read(r, n - 3, buf, 16, &te), 3);
	cr_assert_arr_eq(buf, data + n - 3, 3);

	/* The reader keeps its snapshot when the checkpoint is deleted. */
	cr_assert_eq(tr_store_ckpt_delete(s, row.id, &te), 0, "%s", te.message);
	cr_assert_eq(stored_chunks(), 0);
	cr_assert_eq(count_files(), 0, "the file is unlinked while the reader has it open");
	cr_assert_eq(tr_store_ckpt_read(r, CHUNK - 7, buf, 2 * CHUNK + 10, &te), (ssize_t)(2 * CHUNK + 10));
	cr_assert_arr_eq(buf, data + CHUNK - 7, 2 * CHUNK + 10);
	tr_store_ckpt_close(r);
	tr_store_ckpt_close(NULL);
	cr_assert_eq(tr_store_ckpt_open(s, row.id, &r, &te), -ENOENT);
	cr_assert_null(r);
	cr_assert_eq(tr_store_ckpt_delete(s, row.id, &te), -ENOENT);
	cr_assert_eq(stored_chunks(), 0);

	free(buf);
	free(data);
	tr_ckpt_row_finish(&row);
	tr_store_close(s);
}

/* ---- lifecycle -------------------------------------------------------------------- */

Test(ckpt, keep_prunes_oldest)
{
	tr_store_t *s = open_store(NULL);
	int64_t job = add_job(s), other = add_job(s);
	size_t n = 5 * MiB;
	unsigned char *data = random_bytes(n, 5);
	cr_assert_eq(write_ckpt(s, other, 10, data, n, 0, NULL), 0);
	for (int64_t step = 10; step <= 30; step += 10)
		cr_assert_eq(write_ckpt(s, job, step, data, n, 2, NULL), 0, "%s", te.message);

	struct tr_ckpt_row *rows;
	int count;
	cr_assert_eq(tr_store_ckpt_list(s, job, &rows, &count, &te), 0);
	cr_assert_eq(count, 2);
	cr_assert_eq(rows[0].step, 30);
	cr_assert_eq(rows[1].step, 20);
	tr_ckpt_rows_free(rows, count);
	cr_assert_eq(stored_chunks(), 3 * 2, "the pruned one's chunks are gone");
	struct tr_ckpt_row row;
	cr_assert_eq(tr_store_ckpt_get(s, job, 10, &row, &te), -ENOENT);
	cr_assert_eq(tr_store_ckpt_get(s, other, 10, &row, &te), 0, "another job's checkpoints are left alone");
	tr_ckpt_row_finish(&row);

	/* Two at the same step: the later one wins, the other still counts. */
	cr_assert_eq(write_ckpt(s, job, 30, data, 10, 3, &row), 0);
	struct tr_ckpt_row got;
	cr_assert_eq(tr_store_ckpt_get(s, job, 30, &got, &te), 0);
	cr_assert_eq(got.id, row.id);
	cr_assert_eq(got.bytes, 10);
	tr_ckpt_row_finish(&got);
	tr_ckpt_row_finish(&row);

	/* A lower step written last (a job resumed from an earlier point) is
	 * kept: pruning never removes the checkpoint it is committing. */
	cr_assert_eq(write_ckpt(s, job, 5, data, 100, 1, &row), 0);
	cr_assert_eq(tr_store_ckpt_list(s, job, &rows, &count, &te), 0);
	cr_assert_eq(count, 1);
	cr_assert_eq(rows[0].id, row.id);
	tr_ckpt_rows_free(rows, count);
	tr_ckpt_row_finish(&row);
	cr_assert_eq(sql_int("SELECT count(*) FROM checkpoints"), 2);
	free(data);
	tr_store_close(s);
}

Test(ckpt, incomplete_is_hidden_and_removed)
{
	tr_store_t *s = open_store(NULL);
	int64_t job = add_job(s);
	size_t n = 9 * MiB;
	unsigned char *data = random_bytes(n, 11);
	cr_assert_eq(write_ckpt(s, job, 1, data, 100, 0, NULL), 0);

	/* Aborted: nothing left. */
	tr_ckpt_writer_t *w;
	cr_assert_eq(tr_store_ckpt_begin(s, job, 2, 0, NULL, &w, &te), 0);
	cr_assert_eq(tr_store_ckpt_write(w, data, n, &te), 0);
	cr_assert_eq(sql_int("SELECT count(*) FROM checkpoints WHERE complete = 0"), 1);
	tr_store_ckpt_abort(w);
	tr_store_ckpt_abort(NULL);
	cr_assert_eq(sql_int("SELECT count(*) FROM checkpoints WHERE complete = 0"), 0);
	cr_assert_eq(stored_chunks(), 1);

	/* Left behind (a crash): never listed, gone at the next open. */
	cr_assert_eq(tr_store_ckpt_begin(s, job, 3, 0, NULL, &w, &te), 0);
	cr_assert_eq(tr_store_ckpt_write(w, data, n, &te), 0);
	struct tr_ckpt_row *rows;
	int count;
	cr_assert_eq(tr_store_ckpt_list(s, job, &rows, &count, &te), 0);
	cr_assert_eq(count, 1);
	cr_assert_eq(rows[0].step, 1);
	tr_ckpt_rows_free(rows, count);
	struct tr_ckpt_row row;
	cr_assert_eq(tr_store_ckpt_get(s, job, 3, &row, &te), -ENOENT);
	cr_assert_eq(tr_store_ckpt_get(s, job, -1, &row, &te), 0);
	cr_assert_eq(row.step, 1);
	int64_t partial = sql_int("SELECT max(id) FROM checkpoints");
	tr_ckpt_reader_t *r;
	cr_assert_eq(tr_store_ckpt_open(s, partial, &r, &te), -ENOENT, "an incomplete checkpoint cannot be read");
	cr_assert_eq(stored_chunks(), 1 + 2);
	cr_assert_eq(file_chunks(partial), 2);
	tr_store_close(s);

	s = open_store(NULL);
	cr_assert_eq(sql_int("SELECT count(*) FROM checkpoints WHERE complete = 0"), 0);
	cr_assert_eq(stored_chunks(), 1);
	cr_assert_eq(file_chunks(partial), -1, "the incomplete one's file is deleted at open");
	cr_assert_eq(count_files(), 1);
	expect_load(s, &row, data, 100);
	tr_ckpt_row_finish(&row);
	/* The stray writer is harmless: committing it fails, aborting it
	 * deletes nothing else. */
	cr_assert_eq(tr_store_ckpt_commit(w, NULL, 0, 0, 0, 1, &row, &te), -ENOENT, "%s", te.message);
	cr_assert_eq(row.id, 0);
	cr_assert_eq(sql_int("SELECT count(*) FROM checkpoints"), 1);
	free(data);
	tr_store_close(s);
}

Test(ckpt, bad_arguments)
{
	tr_store_t *s = open_store(NULL);
	int64_t job = add_job(s);
	tr_ckpt_writer_t *w;
	cr_assert_eq(tr_store_ckpt_begin(s, job + 100, 1, 0, NULL, &w, &te), -ENOENT);
	cr_assert_null(w);
	cr_assert(strstr(te.message, "does not exist"), "%s", te.message);
	cr_assert_eq(tr_store_ckpt_begin(s, job, -1, 0, NULL, &w, &te), -EINVAL);
	cr_assert_eq(tr_store_ckpt_begin(s, job, 1, 0, "[1]", &w, &te), -EINVAL);
	cr_assert_eq(tr_store_ckpt_begin(s, job, 1, 0, "{bad", &w, &te), -EINVAL);

	/* A parameter range outside the blob fails the commit and discards. */
	cr_assert_eq(tr_store_ckpt_begin(s, job, 1, 0, NULL, &w, &te), 0);
	cr_assert_eq(tr_store_ckpt_write(w, "0123456789", 10, &te), 0);
	struct tr_ckpt_row row;
	cr_assert_eq(tr_store_ckpt_commit(w, "h", 1, 4, 7, 1, &row, &te), -EINVAL);
	cr_assert(strstr(te.message, "outside"), "%s", te.message);
	cr_assert_eq(sql_int("SELECT count(*) FROM checkpoints"), 0);
	cr_assert_eq(stored_chunks(), 0);

	cr_assert_eq(tr_store_ckpt_begin(s, job, 1, 0, NULL, &w, &te), 0);
	cr_assert_eq(tr_store_ckpt_write(w, "0123456789", 10, &te), 0);
	cr_assert_eq(tr_store_ckpt_commit(w, NULL, 0, 4, 6, 1, &row, &te), 0);
	cr_assert_eq(row.model_header_len, 0);
	cr_assert_null(row.meta);
	void *hdr;
	size_t hlen;
	cr_assert_eq(tr_store_ckpt_model_header(s, row.id, &hdr, &hlen, &te), 0);
	cr_assert_eq(hlen, 0);
	free(hdr);
	cr_assert_eq(tr_store_ckpt_model_header(s, row.id + 1, &hdr, &hlen, &te), -ENOENT);
	expect_load(s, &row, (const unsigned char *)"0123456789", 10);
	tr_ckpt_row_finish(&row);
	tr_store_close(s);
}

Test(ckpt, flipped_byte_is_detected)
{
	tr_store_t *s = open_store(NULL);
	int64_t job = add_job(s);
	size_t n = 9 * MiB;
	unsigned char *data = random_bytes(n, 13);
	struct tr_ckpt_row row;
	cr_assert_eq(write_ckpt(s, job, 1, data, n, 0, &row), 0);
	expect_load(s, &row, data, n);

	/* One byte of chunk 1 flipped behind the store's back. */
	char path[256];
	file_of(row.id, path, sizeof path);
	sqlite3 *db;
	cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
	sqlite3_blob *b;
	cr_assert_eq(sqlite3_blob_open(db, "main", "chunks", "data", 1, 1, &b), SQLITE_OK, "%s", sqlite3_errmsg(db));
	unsigned char byte;
	cr_assert_eq(sqlite3_blob_read(b, &byte, 1, 12345), SQLITE_OK);
	byte ^= 0x20;
	cr_assert_eq(sqlite3_blob_write(b, &byte, 1, 12345), SQLITE_OK);
	cr_assert_eq(sqlite3_blob_close(b), SQLITE_OK);

	void *got = (void *)1;
	size_t len = 1;
	cr_assert_eq(tr_store_ckpt_load(s, &row, &got, &len, &te), -EBADMSG);
	cr_assert_null(got);
	cr_assert_eq(len, 0);
	cr_assert(strstr(te.message, "corrupt"), "%s", te.message);

	/* A missing chunk is caught before anything is read. */
	cr_assert_eq(sqlite3_exec(db, "DELETE FROM chunks WHERE seq = 2", NULL, NULL, NULL), SQLITE_OK);
	sqlite3_close(db);
	tr_ckpt_reader_t *r;
	cr_assert_eq(tr_store_ckpt_open(s, row.id, &r, &te), -EBADMSG);
	cr_assert(strstr(te.message, "damaged"), "%s", te.message);
	cr_assert_eq(tr_store_ckpt_load(s, &row, &got, &len, &te), -EBADMSG);

	/* So is a missing file, with its name. */
	cr_assert_eq(unlink(path), 0);
	cr_assert_eq(tr_store_ckpt_open(s, row.id, &r, &te), -EBADMSG, "%s", te.message);
	cr_assert(strstr(te.message, "damaged") && strstr(te.message, path), "%s", te.message);
	cr_assert_eq(tr_store_ckpt_load(s, &row, &got, &len, &te), -EBADMSG);
	cr_assert_null(got);
	tr_ckpt_row_finish(&row);
	free(data);
	tr_store_close(s);
}

Test(ckpt, full_database)
{
	tr_store_t *s = open_store(NULL);
	int64_t job = add_job(s);
	size_t small = 1 * MiB + 77;
	unsigned char *a = random_bytes(small, 21);
	struct tr_ckpt_row first;
	cr_assert_eq(write_ckpt(s, job, 1, a, small, 5, &first), 0);
	tr_store_close(s);

	/* The cap covers the database and the checkpoint files together. */
	int64_t used = state_bytes();
	struct tr_store_options opts = {.max_bytes = used + 2 * (int64_t)MiB};
	s = open_store(&opts);

	size_t big = 8 * MiB;
	unsigned char *b = random_bytes(big, 22);
	tr_ckpt_writer_t *w;
	cr_assert_eq(tr_store_ckpt_begin(s, job, 2, 0, NULL, &w, &te), 0);
	int rc = 0;
	for (size_t off = 0; off < big && rc == 0; off += MiB)
		rc = tr_store_ckpt_write(w, b + off, MiB, &te);
	cr_assert_eq(rc, -ENOSPC, "%d %s", rc, te.message);
	cr_assert(strstr(te.message, "database is full"), "%s", te.message);
	cr_assert_eq(tr_store_ckpt_write(w, b, 1, &te), -ENOSPC, "a failed writer stays failed");
	tr_store_ckpt_abort(w);
	cr_assert_eq(sql_int("SELECT count(*) FROM checkpoints WHERE complete = 0"), 0,
		     "the partial checkpoint is deleted at once");

	/* The earlier one is intact and still verifies. */
	expect_load(s, &first, a, small);
	struct tr_ckpt_row row;
	cr_assert_eq(tr_store_ckpt_get(s, job, -1, &row, &te), 0);
	cr_assert_eq(row.id, first.id);
	tr_ckpt_row_finish(&row);

	/* A smaller one fits in the space the aborted one gave back. */
	unsigned char *c = random_bytes(small, 23);
	rc = write_ckpt(s, job, 3, c, small, 5, &row);
	cr_assert_eq(rc, 0, "%d %s", rc, te.message);
	expect_load(s, &row, c, small);
	tr_ckpt_row_finish(&row);
	cr_assert_eq(tr_store_integrity_check(s, NULL), 0);
	cr_assert_leq(state_bytes(), opts.max_bytes);
	cr_assert_eq(count_files(), 2, "the aborted one's file is gone");
	tr_store_close(s);

	struct tr_store_options bad = {.max_bytes = -1};
	struct tr_error err;
	cr_assert_eq(tr_store_open(db_path, &bad, &s, &err), -EINVAL);
	tr_ckpt_row_finish(&first);
	free(a);
	free(b);
	free(c);
}

Test(ckpt, job_delete_cascades)
{
	tr_store_t *s = open_store(NULL);
	int64_t job = add_job(s), other = add_job(s);
	size_t n = 5 * MiB;
	unsigned char *data = random_bytes(n, 31);
	cr_assert_eq(write_ckpt(s, job, 1, data, n, 0, NULL), 0);
	cr_assert_eq(write_ckpt(s, job, 2, data, n, 0, NULL), 0);
	cr_assert_eq(write_ckpt(s, other, 1, data, n, 0, NULL), 0);

	/* A writer in progress for the job fails cleanly once it is gone. */
	tr_ckpt_writer_t *w;
	cr_assert_eq(tr_store_ckpt_begin(s, job, 3, 0, NULL, &w, &te), 0);
	cr_assert_eq(tr_store_ckpt_write(w, data, CHUNK, &te), 0);

	cr_assert_eq(tr_store_job_delete(s, job, NULL), 0);
	cr_assert_eq(sql_int("SELECT count(*) FROM checkpoints"), 1);
	struct tr_ckpt_row *rows;
	int count;
	cr_assert_eq(tr_store_ckpt_list(s, job, &rows, &count, &te), 0);
	cr_assert_eq(count, 0);
	cr_assert_null(rows);

	cr_assert_eq(count_files(), 1, "the job's files are deleted with it, the writer's too");
	/* The writer's chunks go to its (now unlinked) file; its commit finds
	 * the row gone. */
	tr_store_ckpt_write(w, data, CHUNK, &te);
	cr_assert_eq(tr_store_ckpt_commit(w, NULL, 0, 0, 0, 1, NULL, &te), -ENOENT);
	cr_assert_eq(count_files(), 1);
	cr_assert_eq(stored_chunks(), 2);
	cr_assert_eq(tr_store_integrity_check(s, NULL), 0);
	free(data);
	tr_store_close(s);
}

/* ---- concurrency ------------------------------------------------------------------ */

Test(ckpt, metrics_flush_between_chunks)
{
	/* Between chunks the writer holds no lock: a flush on the same
	 * thread would otherwise wait out the busy timeout and fail. */
	tr_store_t *s = open_store(NULL);
	int64_t job = add_job(s);
	size_t n = 3 * CHUNK + 5;
	unsigned char *data = random_bytes(n, 41);
	tr_ckpt_writer_t *w;
	cr_assert_eq(tr_store_ckpt_begin(s, job, 1, 0, NULL, &w, &te), 0);
	for (int k = 0; k < 3; k++) {
		cr_assert_eq(tr_store_ckpt_write(w, data + (size_t)k * CHUNK, CHUNK, &te), 0);
		cr_assert_eq(tr_store_metric_append(s, job, "loss", k, 0, 0, 1.0 / (k + 1), NULL), 0);
		double t0 = now_ms();
		cr_assert_eq(tr_store_flush(s, NULL), 0);
		cr_assert_lt(now_ms() - t0, 2000.0, "the flush waited for the checkpoint writer");
	}
	cr_assert_eq(tr_store_ckpt_write(w, data + 3 * CHUNK, 5, &te), 0);
	struct tr_ckpt_row row;
	cr_assert_eq(tr_store_ckpt_commit(w, NULL, 0, 0, 0, 1, &row, &te), 0);
	cr_assert_eq(tr_store_metric_drops(s, job), 0);
	json_t *names = tr_store_metric_names(s, job, NULL);
	cr_assert_eq(json_array_size(names), 1);
	json_decref(names);
	cr_assert_eq(sql_int("SELECT count(*) FROM metrics"), 3);
	expect_load(s, &row, data, n);
	tr_ckpt_row_finish(&row);
	free(data);
	tr_store_close(s);
}

struct bg_ckpt {
	tr_store_t *s;
	int64_t job;
	const unsigned char *data;
	size_t n;
	atomic_bool done;
	/* 1 + the number of commits while a checkpoint is open, else 0 */
	atomic_int open;
	double ms;
	int rc;
	struct tr_error e; /* the writing thread's */
};

/* Two checkpoints, the second pruning the first (keep = 1). */
static void *bg_write(void *arg)
{
	struct bg_ckpt *b = arg;
	double t0 = now_ms();
	for (int64_t step = 1; step <= 2 && b->rc == 0; step++) {
		tr_ckpt_writer_t *w;
		b->rc = tr_store_ckpt_begin(b->s, b->job, step, 0, NULL, &w, &b->e);
		atomic_store(&b->open, (int)step);
		for (size_t off = 0; b->rc == 0 && off < b->n; off += 256 * 1024) {
			size_t k = b->n - off < 256 * 1024 ? b->n - off : 256 * 1024;
			b->rc = tr_store_ckpt_write(w, b->data + off, k, &b->e);
		}
		if (b->rc == 0)
			b->rc = tr_store_ckpt_commit(w, NULL, 0, 0, 0, 1, NULL, &b->e);
		else
			tr_store_ckpt_abort(w);
		atomic_store(&b->open, 0);
	}
	b->ms = now_ms() - t0;
	atomic_store(&b->done, true);
	return NULL;
}

Test(ckpt, metrics_writer_runs_beside_a_large_checkpoint)
{
	tr_store_t *s = open_store(NULL);
	int64_t job = add_job(s);
	size_t n = 48 * MiB;
	unsigned char *data = random_bytes(n, 51);
	struct bg_ckpt b = {.s = s, .job = job, .data = data, .n = n};
	atomic_init(&b.done, false);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, bg_write, &b), 0);

	/* A flush "beside" a checkpoint began and ended while the same
	 * checkpoint stayed open: it did not wait for that commit. */
	int beside = 0, flushes = 0, step = 0;
	while (!atomic_load(&b.done)) {
		for (int i = 0; i < 10; i++, step++)
			cr_assert_eq(tr_store_metric_append(s, job, "loss", step, 0, 0, 1.0, NULL), 0);
		int open_before = atomic_load(&b.open);
		cr_assert_eq(tr_store_flush(s, NULL), 0);
		flushes++;
		if (open_before != 0 && atomic_load(&b.open) == open_before)
			beside++;
		usleep(2000);
	}
	pthread_join(t, NULL);
	cr_assert_eq(b.rc, 0, "checkpoint: %s", b.e.message);
	cr_log_info("2 x 48 MiB checkpoints: %.0f ms; %d metric flushes, %d of them beside an open checkpoint", b.ms,
		    flushes, beside);
	cr_assert_geq(beside, 2, "only %d of %d flushes ran while a checkpoint was open (%.0f ms of writing)", beside,
		      flushes, b.ms);
	cr_assert_eq(tr_store_metric_drops(s, job), 0);
	cr_assert_eq(sql_int("SELECT count(*) FROM metrics"), step);
	struct tr_ckpt_row row;
	cr_assert_eq(tr_store_ckpt_get(s, job, -1, &row, &te), 0);
	cr_assert_eq(row.step, 2);
	expect_load(s, &row, data, n);
	tr_ckpt_row_finish(&row);
	cr_assert_eq(sql_int("SELECT count(*) FROM checkpoints"), 1);
	cr_assert_eq(stored_chunks(), (int64_t)(n / CHUNK));
	free(data);
	tr_store_close(s);
}

/* ---- page size and the write-ahead log -------------------------------------------- */

static int64_t file_size(const char *suffix)
{
	char p[160];
	snprintf(p, sizeof p, "%s%s", db_path, suffix);
	struct stat st;
	return stat(p, &st) == 0 ? (int64_t)st.st_size : -1;
}

/* Bytes this process has handed to write calls so far. */
static int64_t bytes_written(void)
{
	FILE *f = fopen("/proc/self/io", "r");
	cr_assert_not_null(f);
	long long v = -1;
	char line[128];
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "wchar: %lld", &v) == 1)
			break;
	fclose(f);
	return v;
}

/* A checkpoint's bytes go to a file of its own, once: neither the store's
 * database nor its WAL grows by them, the file is about their size (64
 * KiB pages, no journal), and the process writes them about once (a page
 * written early and again later, or a second copy anywhere, would double
 * it). */
static void expect_written_once(tr_store_t *s, size_t n)
{
	int64_t job = add_job(s);
	unsigned char *data = random_bytes(n, 61);
	int64_t db0 = file_size(""), wal0 = file_size("-wal");
	struct tr_ckpt_row row;
	int64_t w0 = bytes_written();
	cr_assert_eq(write_ckpt(s, job, 1, data, n, 1, &row), 0, "%s", te.message);
	int64_t wrote = bytes_written() - w0;
	cr_assert(wrote >= (int64_t)n && wrote < (int64_t)(n + n / 16 + 2 * MiB), "%lld bytes written for %zu",
		  (long long)wrote, n);
	cr_assert_lt(file_size("") - db0, (int64_t)n / 4, "the chunks went into the database");
	cr_assert_lt(file_size("-wal") - (wal0 > 0 ? wal0 : 0), (int64_t)n / 4, "the chunks went through the WAL");
	char p[256];
	file_of(row.id, p, sizeof p);
	struct stat st;
	cr_assert_eq(stat(p, &st), 0, "%s", p);
	cr_assert_geq(st.st_size, (int64_t)n);
	cr_assert_lt(st.st_size, (int64_t)(n + n / 16 + 4 * 65536), "%lld bytes for %zu", (long long)st.st_size, n);
	cr_assert_eq(path_int(p, "PRAGMA page_size"), 65536);
	expect_load(s, &row, data, n);
	tr_ckpt_row_finish(&row);
	free(data);
}

Test(ckpt, new_database_has_large_pages_and_checkpoints_are_written_once)
{
	tr_store_t *s = open_store(NULL);
	cr_assert_eq(sql_int("PRAGMA page_size"), 16384);
	expect_written_once(s, 3 * CHUNK + 99);
	expect_written_once(s, 17 * CHUNK); /* past the WAL's auto-checkpoint size */
	tr_store_close(s);
}

/* A database created with 4 KiB pages (by an earlier trainerd) keeps them,
 * and checkpoints beside it work the same. */
Test(ckpt, old_database_keeps_its_page_size)
{
	sqlite3 *db;
	cr_assert_eq(sqlite3_open(db_path, &db), SQLITE_OK);
	cr_assert_eq(sqlite3_exec(db, "PRAGMA page_size=4096; PRAGMA journal_mode=WAL", NULL, NULL, NULL), SQLITE_OK);
	sqlite3_close(db);
	tr_store_t *s = open_store(NULL);
	cr_assert_eq(sql_int("PRAGMA page_size"), 4096);
	expect_written_once(s, 3 * CHUNK + 99);
	tr_store_close(s);
	s = open_store(NULL);
	cr_assert_eq(sql_int("PRAGMA page_size"), 4096);
	cr_assert_eq(tr_store_integrity_check(s, NULL), 0);
	struct tr_ckpt_row row;
	cr_assert_eq(tr_store_ckpt_get(s, 1, -1, &row, &te), 0, "%s", te.message);
	void *got = NULL;
	size_t len = 0;
	cr_assert_eq(tr_store_ckpt_load(s, &row, &got, &len, &te), 0, "%s", te.message);
	cr_assert_eq(len, 3 * CHUNK + 99);
	free(got);
	tr_ckpt_row_finish(&row);
	tr_store_close(s);
}

/* Puts checkpoint id (complete or not) into an older trainerd's layout:
 * its row with the columns of schema version 2, its chunks `seqs` (each
 * CHUNK bytes of data from seq * CHUNK, the last one short) in the
 * store's checkpoint_chunks. */
static void old_checkpoint(sqlite3 *db, int64_t id, int64_t job, int64_t step, const unsigned char *data, size_t n,
			   int complete, const int *seqs, int nseqs)
{
	char hex[65], sql[512];
	tr_sha256_hex(data, n, hex);
	snprintf(
		sql, sizeof sql,
		"INSERT INTO checkpoints (id, job_id, step, epoch, created_at, bytes, sha256, model_header, params_offset,"
		" params_bytes, complete) VALUES (%lld, %lld, %lld, 0, 1e9, %zu, '%s', X'', 0, %zu, %d)",
		(long long)id, (long long)job, (long long)step, n, hex, n, complete);
	cr_assert_eq(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK, "%s", sqlite3_errmsg(db));
	sqlite3_stmt *st;
	cr_assert_eq(sqlite3_prepare_v2(db,
					"INSERT INTO checkpoint_chunks (checkpoint_id, seq, data) VALUES (?1, ?2, ?3)",
					-1, &st, NULL),
		     SQLITE_OK);
	for (int k = 0; k < nseqs; k++) {
		size_t off = (size_t)seqs[k] * CHUNK, len = n - off < CHUNK ? n - off : CHUNK;
		sqlite3_bind_int64(st, 1, id);
		sqlite3_bind_int(st, 2, seqs[k]);
		sqlite3_bind_blob64(st, 3, data + off, len, SQLITE_STATIC);
		cr_assert_eq(sqlite3_step(st), SQLITE_DONE, "%s", sqlite3_errmsg(db));
		sqlite3_reset(st);
	}
	sqlite3_finalize(st);
}

/* A database written by an older trainerd (schema version 2: checkpoint
 * chunks in the store's checkpoint_chunks table, no chunk_file column) is
 * migrated at open: each complete checkpoint moves into a file of its own,
 * once, and reads, verifies and prunes like any other; an incomplete one
 * goes; a damaged one stays damaged and says so; a file left by a move
 * that was cut short is replaced. */
Test(ckpt, older_checkpoints_move_into_files_at_open)
{
	tr_store_t *s = open_store(NULL);
	int64_t job = add_job(s);
	tr_store_close(s);
	size_t n = 2 * CHUNK + 5;
	unsigned char *data = random_bytes(n, 91), *other = random_bytes(CHUNK + 7, 92);
	sqlite3 *db;
	cr_assert_eq(sqlite3_open(db_path, &db), SQLITE_OK);
	/* Back to schema version 2, as the older trainerd left it. */
	cr_assert_eq(
		sqlite3_exec(db,
			     "ALTER TABLE checkpoints DROP COLUMN best; ALTER TABLE checkpoints DROP COLUMN chunk_file;"
			     " ALTER TABLE jobs DROP COLUMN info; DROP TABLE job_results;"
			     " ALTER TABLE metrics_rollup DROP COLUMN last_step; ALTER TABLE metrics_rollup DROP COLUMN"
			     " last_epoch; ALTER TABLE metrics_rollup DROP COLUMN last_wall; ALTER TABLE metrics_rollup"
			     " DROP COLUMN last_value; ALTER TABLE jobs DROP COLUMN loader_threads;"
			     " ALTER TABLE jobs DROP COLUMN crashes; ALTER TABLE jobs DROP COLUMN train_s;"
			     " ALTER TABLE jobs DROP COLUMN preemptible; ALTER TABLE jobs DROP COLUMN preemption;"
			     " DROP INDEX jobs_by_trial; ALTER TABLE jobs DROP COLUMN experiment_id;"
			     " ALTER TABLE jobs DROP COLUMN trial; ALTER TABLE jobs DROP COLUMN pause_at;"
			     " DROP TABLE experiment_events; DROP TABLE experiments; DROP TABLE job_tokens;"
			     " PRAGMA user_version = 2;",
			     NULL, NULL, NULL),
		SQLITE_OK, "%s", sqlite3_errmsg(db));
	const int all[] = {0, 1, 2}, gap[] = {0};
	old_checkpoint(db, 50, job, 7, data, n, 1, all, 3);
	old_checkpoint(db, 51, job, 5, other, CHUNK + 7, 1, gap, 1); /* chunk 1 is missing */
	old_checkpoint(db, 52, job, 9, data, n, 0, all, 2);          /* never completed */
	sqlite3_close(db);
	/* A move that was cut short left a file for 50 with a chunk too few. */
	mkdir(files_dir, 0700);
	char stale[256];
	file_of(50, stale, sizeof stale);
	cr_assert_eq(sqlite3_open(stale, &db), SQLITE_OK);
	cr_assert_eq(sqlite3_exec(db,
				  "CREATE TABLE chunks (seq INTEGER PRIMARY KEY, data BLOB NOT NULL);"
				  " INSERT INTO chunks VALUES (0, X'00')",
				  NULL, NULL, NULL),
		     SQLITE_OK);
	sqlite3_close(db);

	s = open_store(NULL);
	cr_assert_geq(sql_int("PRAGMA user_version"), 5, "the schema was not migrated");
	cr_assert_eq(sql_int("SELECT count(*) FROM checkpoint_chunks"), 0, "chunks were left in the database");
	cr_assert_eq(sql_int("SELECT count(*) FROM checkpoints WHERE chunk_file = 0"), 0);
	cr_assert_eq(sql_int("SELECT count(*) FROM checkpoints"), 2, "the incomplete checkpoint is still there");
	cr_assert_eq(file_chunks(50), 3);
	cr_assert_eq(file_chunks(51), 1);
	cr_assert_eq(file_chunks(52), -1);

	struct tr_ckpt_row row;
	cr_assert_eq(tr_store_ckpt_get(s, job, 7, &row, &te), 0, "%s", te.message);
	cr_assert_eq(row.id, 50);
	expect_load(s, &row, data, n);
	tr_ckpt_reader_t *r;
	cr_assert_eq(tr_store_ckpt_open(s, 50, &r, &te), 0, "%s", te.message);
	unsigned char buf[64];
	cr_assert_eq(tr_store_ckpt_read(r, CHUNK - 20, buf, 40, &te), 40);
	cr_assert_arr_eq(buf, data + CHUNK - 20, 40);
	tr_store_ckpt_close(r);
	tr_ckpt_row_finish(&row);
	cr_assert_eq(tr_store_ckpt_open(s, 51, &r, &te), -EBADMSG);
	cr_assert(strstr(te.message, "is damaged: 1 of 2 chunks present"), "%s", te.message);

	/* Once: a second open finds nothing to move and reads the same. */
	tr_store_close(s);
	s = open_store(NULL);
	cr_assert_eq(tr_store_ckpt_get(s, job, 7, &row, &te), 0, "%s", te.message);
	expect_load(s, &row, data, n);
	tr_ckpt_row_finish(&row);

	/* A new checkpoint with keep = 1 prunes both moved ones, files and all. */
	cr_assert_eq(write_ckpt(s, job, 8, data, 100, 1, &row), 0, "%s", te.message);
	cr_assert_eq(sql_int("SELECT count(*) FROM checkpoints"), 1);
	cr_assert_eq(file_chunks(50), -1);
	cr_assert_eq(file_chunks(51), -1);
	cr_assert_eq(stored_chunks(), 1);
	expect_load(s, &row, data, 100);
	tr_ckpt_row_finish(&row);
	free(data);
	free(other);
	tr_store_close(s);
}

static ino_t inode_of(const char *path)
{
	struct stat st;
	cr_assert_eq(stat(path, &st), 0, "%s", path);
	return st.st_ino;
}

static bool spare_exists(void)
{
	char p[256];
	snprintf(p, sizeof p, "%s/spare.sqlite", files_dir);
	return access(p, F_OK) == 0;
}

/* A pruned checkpoint's file becomes the spare and the next checkpoint is
 * written over it in place (same inode, the bytes written once), whatever
 * the sizes; a file a reader has open is never reused; the spare goes on
 * request and at the next open. */
Test(ckpt, a_pruned_file_is_written_over_by_the_next_checkpoint)
{
	tr_store_t *s = open_store(NULL);
	int64_t job = add_job(s);
	const size_t sizes[] = {2 * CHUNK + 5, 2 * CHUNK + 5, 2 * CHUNK + 5, CHUNK + 7, 4 * CHUNK + 1, 3 * CHUNK, 100};
	unsigned char *data[7];
	struct tr_ckpt_row row[7];
	ino_t ino[7];
	char p[256];
	tr_ckpt_reader_t *r = NULL;
	for (int i = 0; i < 7; i++) {
		data[i] = random_bytes(sizes[i], 100 + (uint64_t)i);
		if (i == 5) /* a download of checkpoint 4 is under way when it is pruned */
			cr_assert_eq(tr_store_ckpt_open(s, row[4].id, &r, &te), 0, "%s", te.message);
		int64_t w0 = bytes_written();
		cr_assert_eq(write_ckpt(s, job, i + 1, data[i], sizes[i], 1, &row[i]), 0, "%d: %s", i, te.message);
		int64_t wrote = bytes_written() - w0;
		cr_assert_lt(wrote, (int64_t)(sizes[i] + sizes[i] / 16 + 2 * MiB), "%d: %lld bytes written", i,
			     (long long)wrote);
		file_of(row[i].id, p, sizeof p);
		ino[i] = inode_of(p);
		cr_assert_eq(file_chunks(row[i].id), (int64_t)((sizes[i] + CHUNK - 1) / CHUNK), "%d", i);
		expect_load(s, &row[i], data[i], sizes[i]);
		cr_assert_eq(count_files(), 1, "%d: keep = 1", i);
	}
	/* Two files take turns: each checkpoint prunes the one before into
	 * the spare and is written over the one before that, at the same size
	 * (3 over 1), a smaller one (4 over 2) and a larger one (5 over 3).
	 * 6 is written over 4's file and prunes 5, which a reader has open:
	 * that file is deleted, not reused, so 7 gets a new one. */
	cr_assert_eq(ino[2], ino[0], "checkpoint 3 did not reuse checkpoint 1's file");
	cr_assert_eq(ino[3], ino[1], "checkpoint 4 did not reuse checkpoint 2's file");
	cr_assert_eq(ino[4], ino[2], "checkpoint 5 did not reuse checkpoint 3's file");
	cr_assert_eq(ino[5], ino[3], "checkpoint 6 did not reuse checkpoint 4's file");
	cr_assert_neq(ino[6], ino[4], "checkpoint 7 reused the file a reader had open");
	/* The reader still reads checkpoint 5's bytes (it opened 5: row[4]). */
	unsigned char *buf = malloc(sizes[4]);
	cr_assert_eq(tr_store_ckpt_read(r, 0, buf, sizes[4], &te), (ssize_t)sizes[4]);
	cr_assert_arr_eq(buf, data[4], sizes[4]);
	free(buf);
	tr_store_ckpt_close(r);

	cr_assert(spare_exists());
	tr_store_ckpt_drop_spare(s);
	cr_assert(!spare_exists());
	cr_assert_eq(write_ckpt(s, job, 8, data[0], 10, 1, NULL), 0, "%s", te.message);
	cr_assert(spare_exists());
	tr_store_close(s);
	s = open_store(NULL);
	cr_assert(!spare_exists(), "the spare outlived a restart");
	struct tr_ckpt_row last;
	cr_assert_eq(tr_store_ckpt_get(s, job, -1, &last, &te), 0);
	expect_load(s, &last, data[0], 10);
	tr_ckpt_row_finish(&last);
	for (int i = 0; i < 7; i++) {
		tr_ckpt_row_finish(&row[i]);
		free(data[i]);
	}
	tr_store_close(s);
}

/* Files a crash left behind (a checkpoint file whose row never came, or
 * whose delete was cut short) are deleted at open; files that are not
 * checkpoint files are not touched. */
Test(ckpt, leftover_files_are_swept_at_open)
{
	tr_store_t *s = open_store(NULL);
	int64_t job = add_job(s);
	unsigned char *data = random_bytes(CHUNK + 1, 93);
	struct tr_ckpt_row row;
	cr_assert_eq(write_ckpt(s, job, 1, data, CHUNK + 1, 0, &row), 0, "%s", te.message);
	tr_store_close(s);
	const char *names[] = {"999.sqlite", "notes.txt", "12.sqlite.bak"};
	for (int i = 0; i < 3; i++) {
		char p[256];
		snprintf(p, sizeof p, "%s/%s", files_dir, names[i]);
		FILE *f = fopen(p, "w");
		cr_assert_not_null(f, "%s", p);
		fputs("x", f);
		fclose(f);
	}
	cr_assert_eq(count_files(), 4);
	s = open_store(NULL);
	cr_assert_eq(count_files(), 3, "only the stray checkpoint file goes");
	char p[256];
	snprintf(p, sizeof p, "%s/999.sqlite", files_dir);
	cr_assert_neq(access(p, F_OK), 0);
	expect_load(s, &row, data, CHUNK + 1);
	tr_ckpt_row_finish(&row);
	free(data);
	tr_store_close(s);
}

/* ---- snapshot buffers ------------------------------------------------------------- */

TestSuite(snapshot);

static bool among(const float *p, float *const set[3])
{
	return p == set[0] || p == set[1] || p == set[2];
}

/* A freed snapshot's buffers serve the next snapshot of the same size (no
 * fresh pages to fault in), never one of another size. */
Test(snapshot, buffers_are_reused_for_the_same_size_only)
{
	size_t n = 1 << 20;
	struct tr_snapshot *a = tr_snapshot_alloc(n, 2);
	cr_assert_not_null(a);
	float *old[3] = {a->params, a->state[0], a->state[1]};
	tr_snapshot_free(a);
	struct tr_snapshot *b = tr_snapshot_alloc(n, 2);
	cr_assert_not_null(b);
	cr_assert(among(b->params, old) && among(b->state[0], old) && among(b->state[1], old), "not reused");
	cr_assert(b->params != b->state[0] && b->state[0] != b->state[1] && b->params != b->state[1]);
	tr_snapshot_free(b);
	/* Bigger: fresh buffers of the full size (ASan checks the extent). */
	struct tr_snapshot *c = tr_snapshot_alloc(n + 1, 1);
	cr_assert_not_null(c);
	cr_assert(!among(c->params, old) && !among(c->state[0], old));
	memset(c->params, 1, (n + 1) * sizeof(float));
	memset(c->state[0], 1, (n + 1) * sizeof(float));
	cr_assert_null(c->state[1]);
	tr_snapshot_free(c);
	tr_snapshot_trim();
	struct tr_snapshot *d = tr_snapshot_alloc(n + 1, 0);
	cr_assert_not_null(d);
	memset(d->params, 2, (n + 1) * sizeof(float));
	tr_snapshot_free(d);
	tr_snapshot_trim();
}

/* Pages of p[0, n) that are in memory. */
static size_t resident_pages(const float *p, size_t n, size_t *pages)
{
	long page = sysconf(_SC_PAGESIZE);
	uintptr_t lo = (uintptr_t)p & ~(uintptr_t)(page - 1), hi = (uintptr_t)(p + n);
	size_t count = (hi - lo + (size_t)page - 1) / (size_t)page;
	unsigned char *vec = malloc(count);
	cr_assert_not_null(vec);
	cr_assert_eq(mincore((void *)lo, hi - lo, vec), 0, "mincore: %s", strerror(errno));
	size_t in = 0;
	for (size_t i = 0; i < count; i++)
		in += vec[i] & 1;
	free(vec);
	*pages = count;
	return in;
}

/* A prepared snapshot's buffers are the next snapshot's, already in
 * memory: its copy faults nothing in. */
Test(snapshot, prepared_buffers_are_resident_and_reused)
{
	tr_snapshot_trim();
	size_t n = 8 << 20; /* 32 MiB per buffer: fresh mappings */
	tr_snapshot_prepare(n, 2);
	struct tr_snapshot *s = tr_snapshot_alloc(n, 2);
	cr_assert_not_null(s);
	float *bufs[3] = {s->params, s->state[0], s->state[1]};
	for (int k = 0; k < 3; k++) {
		size_t pages, in = resident_pages(bufs[k], n, &pages);
		cr_assert_eq(in, pages, "buffer %d: %zu of %zu pages in memory", k, in, pages);
	}
	tr_snapshot_free(s);
	/* Another size, without optimizer state. */
	tr_snapshot_trim();
	tr_snapshot_prepare(n / 2 + 3, 0);
	s = tr_snapshot_alloc(n / 2 + 3, 0);
	cr_assert_not_null(s);
	size_t pages, in = resident_pages(s->params, n / 2 + 3, &pages);
	cr_assert_eq(in, pages, "%zu of %zu pages in memory", in, pages);
	tr_snapshot_free(s);
	tr_snapshot_trim();
}

/* ---- durability: which writes sync the WAL ------------------------------------------- */

/* A VFS over the default one that counts xSync calls on WAL files: the
 * files stay the default VFS's own, only a WAL file's method table is a
 * copy with xSync (and xClose, to forget the file) wrapped. */
static sqlite3_vfs *real_vfs, counting_vfs;
static const sqlite3_io_methods *real_io;
static sqlite3_io_methods counting_io;
static atomic_int wal_syncs;
static sqlite3_file *wal_files[16];
static pthread_mutex_t wal_files_lock = PTHREAD_MUTEX_INITIALIZER;

static int counting_sync(sqlite3_file *f, int flags)
{
	pthread_mutex_lock(&wal_files_lock);
	for (int i = 0; i < 16; i++)
		if (wal_files[i] == f)
			atomic_fetch_add(&wal_syncs, 1);
	pthread_mutex_unlock(&wal_files_lock);
	return real_io->xSync(f, flags);
}

static int counting_close(sqlite3_file *f)
{
	pthread_mutex_lock(&wal_files_lock);
	for (int i = 0; i < 16; i++)
		if (wal_files[i] == f)
			wal_files[i] = NULL;
	pthread_mutex_unlock(&wal_files_lock);
	return real_io->xClose(f);
}

static int counting_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags, int *out)
{
	(void)vfs;
	int rc = real_vfs->xOpen(real_vfs, name, f, flags, out);
	if (rc != SQLITE_OK || !f->pMethods || !(flags & SQLITE_OPEN_WAL))
		return rc;
	cr_assert(!real_io || real_io == f->pMethods, "WAL files of several method tables");
	if (!real_io) {
		real_io = f->pMethods;
		counting_io = *real_io;
		counting_io.xSync = counting_sync;
		counting_io.xClose = counting_close;
	}
	f->pMethods = &counting_io;
	pthread_mutex_lock(&wal_files_lock);
	for (int i = 0; i < 16; i++) {
		if (!wal_files[i]) {
			wal_files[i] = f;
			break;
		}
	}
	pthread_mutex_unlock(&wal_files_lock);
	return rc;
}

/* The chunks never touch the store's WAL, so writing them syncs nothing
 * there; the commit that makes the checkpoint visible syncs it (after the
 * file's own sync), so a listed checkpoint survives a power cut. */
Test(ckpt, only_the_visible_commit_syncs_the_wal)
{
	real_vfs = sqlite3_vfs_find(NULL);
	counting_vfs = *real_vfs;
	counting_vfs.zName = "trckpt-counting";
	counting_vfs.xOpen = counting_open;
	cr_assert_eq(sqlite3_vfs_register(&counting_vfs, 1), SQLITE_OK);
	tr_store_t *s = open_store(NULL);
	int64_t job = add_job(s);
	size_t n = 3 * CHUNK + 7;
	unsigned char *data = random_bytes(n, 71);
	tr_ckpt_writer_t *w;
	cr_assert_eq(tr_store_ckpt_begin(s, job, 1, 0, NULL, &w, &te), 0);
	int before = atomic_load(&wal_syncs);
	cr_assert_eq(tr_store_ckpt_write(w, data, n, &te), 0, "%s", te.message);
	cr_assert_eq(atomic_load(&wal_syncs), before, "a chunk's commit synced the WAL");
	struct tr_ckpt_row row;
	cr_assert_eq(tr_store_ckpt_commit(w, NULL, 0, 0, 0, 1, &row, &te), 0, "%s", te.message);
	cr_assert_gt(atomic_load(&wal_syncs), before, "the commit did not sync the WAL");
	expect_load(s, &row, data, n);

	/* Deleting a checkpoint, or a job with its checkpoints, is durable
	 * before the files go: a complete row must never outlive its file. */
	cr_assert_eq(write_ckpt(s, job, 2, data, 100, 0, NULL), 0, "%s", te.message);
	before = atomic_load(&wal_syncs);
	cr_assert_eq(tr_store_ckpt_delete(s, row.id, &te), 0, "%s", te.message);
	cr_assert_gt(atomic_load(&wal_syncs), before, "the delete did not sync the WAL");
	before = atomic_load(&wal_syncs);
	cr_assert_eq(tr_store_job_delete(s, job, NULL), 0);
	cr_assert_gt(atomic_load(&wal_syncs), before, "the job's delete did not sync the WAL");
	cr_assert_eq(count_files(), 0);
	tr_ckpt_row_finish(&row);
	free(data);
	tr_store_close(s);
	sqlite3_vfs_unregister(&counting_vfs);
}

/* A checkpoint file that cannot be read for a reason other than being
 * missing (here a directory stands in its place) is an error with its
 * cause, not "damaged": a resume must not give a good checkpoint up for
 * a passing failure such as running out of descriptors. */
Test(ckpt, unreadable_file_is_not_called_damaged)
{
	tr_store_t *s = open_store(NULL);
	int64_t job = add_job(s);
	unsigned char *data = random_bytes(1000, 95);
	struct tr_ckpt_row row;
	cr_assert_eq(write_ckpt(s, job, 1, data, 1000, 0, &row), 0, "%s", te.message);
	char p[256];
	file_of(row.id, p, sizeof p);
	cr_assert_eq(unlink(p), 0);
	cr_assert_eq(mkdir(p, 0700), 0);
	tr_ckpt_reader_t *r;
	int rc = tr_store_ckpt_open(s, row.id, &r, &te);
	cr_assert(rc < 0 && rc != -EBADMSG && rc != -ENOENT, "%d %s", rc, te.message);
	cr_assert(strstr(te.message, "damaged") == NULL, "%s", te.message);
	cr_assert_eq(rmdir(p), 0);
	tr_ckpt_row_finish(&row);
	free(data);
	tr_store_close(s);
}

/* Early stopping's best checkpoint: a commit whose meta reason is "best"
 * takes the flag from the previous best, pruning by keep never removes the
 * flagged one, and TR_CKPT_BEST finds it. */
Test(ckpt, best_survives_pruning)
{
	static const char best_meta[] = "{\"reason\":\"best\"}";
	tr_store_t *s = open_store(NULL);
	int64_t job = add_job(s), other = add_job(s);
	unsigned char *data = random_bytes(4096, 9);
	struct tr_ckpt_row row, best;

	cr_assert_eq(tr_store_ckpt_get(s, job, TR_CKPT_BEST, &row, &te), -ENOENT);
	cr_assert_eq(write_ckpt_meta(s, other, 5, best_meta, data, 100, 1, NULL), 0);
	cr_assert_eq(write_ckpt_meta(s, job, 10, best_meta, data, 200, 1, &best), 0, "%s", te.message);
	cr_assert(best.best);
	for (int64_t step = 20; step <= 50; step += 10)
		cr_assert_eq(write_ckpt(s, job, step, data, 300, 1, NULL), 0);
	struct tr_ckpt_row *rows;
	int count;
	cr_assert_eq(tr_store_ckpt_list(s, job, &rows, &count, &te), 0);
	cr_assert_eq(count, 2, "keep = 1 plus the best");
	cr_assert_eq(rows[0].step, 50);
	cr_assert(!rows[0].best);
	cr_assert_eq(rows[1].step, 10);
	cr_assert(rows[1].best);
	tr_ckpt_rows_free(rows, count);
	cr_assert_eq(tr_store_ckpt_get(s, job, TR_CKPT_BEST, &row, &te), 0);
	cr_assert_eq(row.id, best.id);
	expect_load(s, &row, data, 200);
	tr_ckpt_row_finish(&row);
	tr_ckpt_row_finish(&best);

	/* A new best replaces it; the old best is pruned like any other. */
	cr_assert_eq(write_ckpt_meta(s, job, 60, best_meta, data, 400, 1, &best), 0);
	cr_assert_eq(tr_store_ckpt_list(s, job, &rows, &count, &te), 0);
	cr_assert_eq(count, 1, "the new best is also the newest");
	cr_assert_eq(rows[0].step, 60);
	cr_assert(rows[0].best);
	tr_ckpt_rows_free(rows, count);
	cr_assert_eq(sql_int("SELECT count(*) FROM checkpoints WHERE best = 1"), 2, "one per job");
	cr_assert_eq(tr_store_ckpt_get(s, other, TR_CKPT_BEST, &row, &te), 0, "another job's best is left alone");
	cr_assert_eq(row.step, 5);
	tr_ckpt_row_finish(&row);
	tr_ckpt_row_finish(&best);
	free(data);
	tr_store_close(s);
}
