/* Datasets against a real daemon: an upload that a job then trains on
 * ("dataset:NAME/FILE"), checksums as sha256sum computes them, a
 * connection broken midway (nothing left, an older file intact), uploads
 * over the quota (413, nothing left), names that try to leave the
 * datasets directory (400), and deleting or replacing a file a job uses
 * (409).  Large bodies are streamed through a raw socket or a curl read
 * callback, so the test holds no more of them than the daemon should.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "harness.h"

static struct daemon d;

static void start(void)
{
	/* A small quota so that over-quota uploads stay cheap. */
	const char *flags[] = {"--datasets-max-bytes", "3000000", NULL};
	daemon_start(&d, 1, flags);
}

static void stop(void)
{
	daemon_cleanup(&d);
}

TestSuite(datasets, .init = start, .fini = stop, .timeout = 120);

/* 64 rows of 2 features and a class label 0..2. */
static const char *toy_csv(void)
{
	static char buf[4096];
	size_t n = 0;
	for (int r = 0; r < 64; r++)
		n += (size_t)snprintf(buf + n, sizeof buf - n, "%d.5,%d.25,%d\n", (r * 7) % 5, (r * 3) % 4, r % 3);
	return buf;
}

static const char *csv_job(const char *name, const char *path, int epochs)
{
	static char buf[4][1024];
	static int next;
	char *b = buf[next++ % 4];
	snprintf(
		b, sizeof buf[0],
		"{\"name\": \"%s\", \"seed\": 1, \"model\": {\"inputs\": 2, \"layers\": [{\"type\": \"dense\", \"units\":"
		" 3}]}, \"data\": {\"train\": {\"format\": \"csv\", \"path\": \"%s\"}}, \"batch_size\": 16, \"epochs\":"
		" %d, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}, \"devices\": 1, \"prefetch\": {\"workers\": 1,"
		" \"depth\": 2}}",
		name, path, epochs);
	return b;
}

/* sha256sum's digest of text, through a file (the tool the docs name). */
static void sha256sum_of(const char *text, size_t len, char out[65])
{
	char path[256], cmd[400];
	snprintf(path, sizeof path, "%s/sum-input", d.dir);
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f);
	cr_assert_eq(fwrite(text, 1, len, f), len);
	fclose(f);
	snprintf(cmd, sizeof cmd, "sha256sum '%s'", path);
	FILE *p = popen(cmd, "r");
	cr_assert_not_null(p);
	cr_assert_eq(fscanf(p, "%64s", out), 1);
	pclose(p);
	unlink(path);
}

/* The entry of NAME/FILE in GET /datasets (new reference) or NULL. */
static json_t *listed(const char *name, const char *file)
{
	struct http_reply r;
	http(&d, "GET", "/datasets", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	json_t *found = NULL, *ds, *f;
	size_t i, j;
	json_array_foreach(json_object_get(r.json, "datasets"), i, ds) {
		if (strcmp(json_string_value(json_object_get(ds, "name")), name) != 0)
			continue;
		json_array_foreach(json_object_get(ds, "files"), j, f)
			if (strcmp(json_string_value(json_object_get(f, "file")), file) == 0)
				found = json_incref(f);
	}
	http_free(&r);
	return found;
}

/* What the datasets directory of NAME holds: -1 when it does not exist,
 * else the number of entries (hidden ones included). */
static int entries(const char *name)
{
	char path[300];
	snprintf(path, sizeof path, "%s/datasets/%s", d.dir, name);
	DIR *dir = opendir(path);
	if (!dir)
		return -1;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(dir)))
		n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
	closedir(dir);
	return n;
}

/* ---- streaming uploads ---- */

struct source {
	size_t left;
	unsigned char fill;
};

static size_t read_source(char *buf, size_t size, size_t n, void *ud)
{
	struct source *s = ud;
	size_t k = size * n < s->left ? size * n : s->left;
	memset(buf, s->fill, k);
	s->left -= k;
	return k;
}

/* PUTs `bytes` bytes of `fill` to path, streamed by curl; chunked (no
 * Content-Length) when chunked is set, else with Content-Length and
 * "Expect: 100-continue" (curl's default for a PUT of this size). */
static void put_stream(const char *path, size_t bytes, unsigned char fill, bool chunked, struct http_reply *r)
{
	struct source src = {bytes, fill};
	const char *hdrs[] = {"Content-Type: application/octet-stream", NULL};
	struct tr_test_request rq = {.base_url = d.base_url,
				     .method = "PUT",
				     .path = path,
				     .headers = hdrs,
				     .send_fn = read_source,
				     .send_cls = &src,
				     .send_size = chunked ? -1 : (curl_off_t)bytes,
				     .timeout_s = 60};
	struct tr_test_reply tr;
	tr_test_http(&rq, &tr);
	http_reply_take(r, &tr);
}

/* Waits (bounded) until NAME's directory holds `want` entries (-1: gone). */
static int wait_entries(const char *name, int want)
{
	int n = entries(name);
	for (int i = 0; i < 250 && n != want; i++) {
		usleep(20000);
		n = entries(name);
	}
	return n;
}

/* Starts a PUT of `declared` bytes of dataset NAME's FILE on a raw
 * connection, sends `sent` of them, waits until the partial upload is
 * there (NAME's directory holds one entry more than `before`: the
 * temporary file) and closes the socket: a client that went away midway. */
static void put_broken(const char *name, const char *file, int before, size_t declared, size_t sent)
{
	int port = 0;
	cr_assert_eq(sscanf(d.base_url, "http://127.0.0.1:%d", &port), 1);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0, "%s", strerror(errno));
	char head[512];
	int n = snprintf(head, sizeof head,
			 "PUT /datasets/%s/%s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\n"
			 "Content-Length: %zu\r\n\r\n",
			 name, file, declared);
	cr_assert_eq(write(fd, head, (size_t)n), n);
	static char block[65536];
	memset(block, 'x', sizeof block);
	for (size_t done = 0; done < sent;) {
		size_t k = sent - done < sizeof block ? sent - done : sizeof block;
		ssize_t w = write(fd, block, k);
		cr_assert_gt(w, 0, "%s", strerror(errno));
		done += (size_t)w;
	}
	int during = wait_entries(name, (before < 0 ? 0 : before) + 1);
	close(fd);
	cr_assert_eq(during, (before < 0 ? 0 : before) + 1, "the upload did not start (%d entries)", during);
}

/* ---- tests ---- */

Test(datasets, upload_list_and_train)
{
	const char *csv = toy_csv();
	char want[65];
	sha256sum_of(csv, strlen(csv), want);

	struct http_reply r;
	http(&d, "PUT", "/datasets/toy/train.csv", csv, "text/csv", NULL, &r);
	cr_assert_eq(r.status, 201, "%s", r.body);
	cr_assert_str_eq(json_string_value(json_object_get(r.json, "sha256")), want);
	cr_assert_str_eq(json_string_value(json_object_get(r.json, "path")), "dataset:toy/train.csv");
	http_free(&r);

	json_t *f = listed("toy", "train.csv");
	cr_assert_not_null(f, "toy/train.csv is not listed");
	cr_assert_str_eq(json_string_value(json_object_get(f, "sha256")), want);
	cr_assert_eq(json_integer_value(json_object_get(f, "bytes")), (json_int_t)strlen(csv));
	json_decref(f);

	long long id = submit_job(&d, csv_job("from-dataset", "dataset:toy/train.csv", 2));
	cr_assert_str_eq(wait_state(&d, id, "completed|failed|cancelled", 60), "completed");

	/* Restartable: a second PUT replaces the file (200, not 201). */
	http(&d, "PUT", "/datasets/toy/train.csv", "1,2,0\n3,4,1\n", "text/csv", NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	http_free(&r);
	sha256sum_of("1,2,0\n3,4,1\n", 12, want);
	f = listed("toy", "train.csv");
	cr_assert_str_eq(json_string_value(json_object_get(f, "sha256")), want);
	json_decref(f);

	/* A dataset file that is not there names the upload that would fix it. */
	http(&d, "POST", "/jobs", csv_job("missing", "dataset:toy/nope.csv", 1), NULL, NULL, &r);
	cr_assert_eq(r.status, 422, "%s", r.body);
	cr_assert(strstr(r.body, "no dataset file 'dataset:toy/nope.csv'"), "%s", r.body);
	http_free(&r);
}

Test(datasets, streamed_upload_matches_sha256sum)
{
	/* 2 MB streamed in pieces: the checksum is of every byte, in order. */
	struct http_reply r;
	put_stream("/datasets/big/ones.bin", 2000000, '1', false, &r);
	cr_assert_eq(r.status, 201, "%s", r.body);
	char want[65], cmd[128];
	snprintf(cmd, sizeof cmd, "head -c 2000000 /dev/zero | tr '\\0' '1' | sha256sum");
	FILE *p = popen(cmd, "r");
	cr_assert_eq(fscanf(p, "%64s", want), 1);
	pclose(p);
	cr_assert_str_eq(json_string_value(json_object_get(r.json, "sha256")), want, "%s", r.body);
	http_free(&r);
	/* And chunked, without a declared length. */
	put_stream("/datasets/big/chunked.bin", 1000000, '1', true, &r);
	cr_assert_eq(r.status, 201, "%s", r.body);
	cr_assert_eq(json_integer_value(json_object_get(r.json, "bytes")), 1000000);
	http_free(&r);
}

Test(datasets, broken_connection_leaves_nothing)
{
	/* A first upload that breaks: no file, no temporary file, no dataset. */
	put_broken("brk", "data.bin", -1, 2000000, 500000);
	cr_assert_eq(wait_entries("brk", -1), -1, "the broken upload left %d entries", entries("brk"));
	cr_assert_null(listed("brk", "data.bin"));

	/* A re-upload that breaks leaves the earlier file as it was. */
	struct http_reply r;
	http(&d, "PUT", "/datasets/brk2/data.csv", "1,2,0\n", "text/csv", NULL, &r);
	cr_assert_eq(r.status, 201, "%s", r.body);
	char before[65];
	snprintf(before, sizeof before, "%s", json_string_value(json_object_get(r.json, "sha256")));
	http_free(&r);
	int n = entries("brk2"); /* the file and its checksum record */
	put_broken("brk2", "data.csv", n, 2000000, 300000);
	cr_assert_eq(wait_entries("brk2", n), n);
	json_t *f = listed("brk2", "data.csv");
	cr_assert_not_null(f);
	cr_assert_str_eq(json_string_value(json_object_get(f, "sha256")), before);
	cr_assert_eq(json_integer_value(json_object_get(f, "bytes")), 6);
	json_decref(f);
	/* The daemon still serves and takes the next upload. */
	http(&d, "PUT", "/datasets/brk/data.bin", "ok", "application/octet-stream", NULL, &r);
	cr_assert_eq(r.status, 201, "%s", r.body);
	http_free(&r);
}

Test(datasets, over_quota_is_413)
{
	struct http_reply r;
	/* Declared over the quota (3,000,000): refused from the headers. */
	put_stream("/datasets/q/too-big.bin", 3500000, 'q', false, &r);
	cr_assert_eq(r.status, 413, "%s", r.body);
	cr_assert(strstr(r.body, "datasets-max-bytes"), "%s", r.body);
	http_free(&r);
	cr_assert_eq(entries("q"), -1);
	/* Chunked: refused once it grows past what is left, nothing kept. */
	put_stream("/datasets/q/chunked.bin", 3500000, 'q', true, &r);
	cr_assert_eq(r.status, 413, "%s", r.body);
	http_free(&r);
	cr_assert_eq(wait_entries("q", -1), -1);
	/* Together: two files that each fit but not both. */
	put_stream("/datasets/q/a.bin", 2000000, 'a', false, &r);
	cr_assert_eq(r.status, 201, "%s", r.body);
	http_free(&r);
	put_stream("/datasets/q/b.bin", 2000000, 'b', false, &r);
	cr_assert_eq(r.status, 413, "%s", r.body);
	http_free(&r);
	/* Replacing a.bin with as much again fits: the old one is freed. */
	put_stream("/datasets/q/a.bin", 2000000, 'c', false, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	http_free(&r);
	http(&d, "DELETE", "/datasets/q", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	cr_assert_eq(json_integer_value(json_object_get(r.json, "freed_bytes")), 2000000);
	http_free(&r);
	cr_assert_eq(entries("q"), -1);
}

/* GET /datasets's used_bytes. */
static long long used_bytes(void)
{
	struct http_reply r;
	http(&d, "GET", "/datasets", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	long long used = json_integer_value(json_object_get(r.json, "used_bytes"));
	http_free(&r);
	return used;
}

/* Writes n bytes of 'a' on fd as chunks of at most 64 KiB. */
static void send_chunks(int fd, size_t n)
{
	static char block[65536];
	memset(block, 'a', sizeof block);
	while (n) {
		size_t k = n < sizeof block ? n : sizeof block;
		char head[32];
		int hl = snprintf(head, sizeof head, "%zx\r\n", k);
		cr_assert_eq(write(fd, head, (size_t)hl), hl);
		for (size_t done = 0; done < k;) {
			ssize_t w = write(fd, block + done, k - done);
			cr_assert_gt(w, 0, "%s", strerror(errno));
			done += (size_t)w;
		}
		cr_assert_eq(write(fd, "\r\n", 2), 2);
		n -= k;
	}
}

/* A chunked upload A of FILE (2 MB) begins; while it streams, FILE is
 * replaced by 1 byte and another file takes the room that frees; then A
 * sends its 2 MB.  The quota used to discount the size FILE had when A
 * began, so A was accepted and the used bytes ended 2 MB over the quota
 * (each round of this adds as much again).  Now A gets 413. */
Test(datasets, replaced_while_streaming_keeps_the_quota)
{
	struct http_reply r;
	put_stream("/datasets/q3/f.bin", 2000000, 'f', false, &r);
	cr_assert_eq(r.status, 201, "%s", r.body);
	http_free(&r);

	int port = 0;
	cr_assert_eq(sscanf(d.base_url, "http://127.0.0.1:%d", &port), 1);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0, "%s", strerror(errno));
	const char *head = "PUT /datasets/q3/f.bin HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
			   "application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
	cr_assert_eq(write(fd, head, strlen(head)), (ssize_t)strlen(head));
	send_chunks(fd, 1);
	/* f.bin, its record and A's temporary file. */
	cr_assert_eq(wait_entries("q3", 3), 3, "the upload did not start");

	http(&d, "PUT", "/datasets/q3/f.bin", "x", "application/octet-stream", NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	http_free(&r);
	put_stream("/datasets/q3/g.bin", 2900000, 'g', false, &r);
	cr_assert_eq(r.status, 201, "%s", r.body);
	http_free(&r);

	send_chunks(fd, 1999999);
	cr_assert_eq(write(fd, "0\r\n\r\n", 5), 5);
	char answer[4096] = "";
	size_t got = 0;
	struct timeval tv = {.tv_sec = 30};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	while (got < sizeof answer - 1 && !strstr(answer, "}")) {
		ssize_t n = read(fd, answer + got, sizeof answer - 1 - got);
		if (n <= 0)
			break;
		got += (size_t)n;
		answer[got] = 0;
	}
	close(fd);
	cr_assert(strncmp(answer, "HTTP/1.1 413", 12) == 0, "A was answered: %.300s", answer);
	cr_assert(strstr(answer, "quota"), "%.300s", answer);
	long long used = used_bytes();
	cr_assert_leq(used, 3000000, "used_bytes %lld is over the quota of 3000000", used);
	cr_assert_eq(used, 2900001);

	http(&d, "DELETE", "/datasets/q3", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	http_free(&r);
}

/* A PUT whose URL is sent exactly as written (no dot-segment removal).
 * Not recorded: no route of the OpenAPI document has such a path. */
static long put_as_is(const char *path)
{
	struct tr_test_request rq = {.base_url = d.base_url,
				     .method = "PUT",
				     .path = path,
				     .body = "x",
				     .path_as_is = true,
				     .no_expect = true,
				     .timeout_s = 30,
				     .no_record = true};
	struct tr_test_reply r;
	tr_test_http(&rq, &r);
	long status = r.status;
	tr_test_reply_free(&r);
	return status;
}

Test(datasets, path_escapes_are_refused)
{
	cr_assert_eq(put_as_is("/datasets/../x"), 400);
	cr_assert_eq(put_as_is("/datasets/a/.."), 400);
	cr_assert_eq(put_as_is("/datasets/../a"), 400);
	cr_assert_eq(put_as_is("/datasets/%2E%2E/passwd"), 400);
	cr_assert_eq(put_as_is("/datasets/a/..%2F..%2Fescape"), 404); /* decoded: more segments, no route */
	cr_assert_eq(put_as_is("/datasets/a/.hidden"), 400);
	cr_assert_eq(put_as_is("/datasets/a/b%20c"), 400);
	/* An encoded NUL used to end the name early: b%00c wrote b. */
	cr_assert_eq(put_as_is("/datasets/nul/b%00c"), 400);
	cr_assert_eq(put_as_is("/datasets/nul%00x/b"), 400);
	cr_assert_eq(entries("nul"), -1, "a file was written for a name with an encoded NUL");
	char p[300];
	snprintf(p, sizeof p, "%s/escape", d.dir);
	cr_assert_neq(access(p, F_OK), 0, "a file was written outside the datasets directory");

	struct http_reply r;
	http(&d, "PUT", "/datasets/a/.upload-x", "x", "text/plain", NULL, &r);
	cr_assert_eq(r.status, 400, "%s", r.body);
	cr_assert(strstr(r.body, "starts with '.'"), "%s", r.body);
	http_free(&r);

	/* In a job spec: refused at submit with the field's pointer. */
	const char *bad[] = {"dataset:../etc/passwd", "dataset:a/../../x", "dataset:a", "dataset:/etc/passwd"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		http(&d, "POST", "/jobs", csv_job("escape", bad[i], 1), NULL, NULL, &r);
		cr_assert_eq(r.status, 400, "%s: %s", bad[i], r.body);
		const char *ptr = json_string_value(json_object_get(json_object_get(r.json, "error"), "pointer"));
		cr_assert_str_eq(ptr ? ptr : "", "/data/train/path", "%s: %s", bad[i], r.body);
		http_free(&r);
	}
}

Test(datasets, delete_while_used_is_409)
{
	struct http_reply r;
	http(&d, "PUT", "/datasets/busy/train.csv", toy_csv(), "text/csv", NULL, &r);
	cr_assert_eq(r.status, 201, "%s", r.body);
	http_free(&r);
	long long id = submit_job(&d, csv_job("long", "dataset:busy/train.csv", 1000000));
	wait_state(&d, id, "running", 30);

	http(&d, "DELETE", "/datasets/busy/train.csv", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 409, "%s", r.body);
	cr_assert(strstr(r.body, "is used by job"), "%s", r.body);
	http_free(&r);
	http(&d, "DELETE", "/datasets/busy", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 409, "%s", r.body);
	http_free(&r);
	http(&d, "PUT", "/datasets/busy/train.csv", "1,2,0\n", "text/csv", NULL, &r);
	cr_assert_eq(r.status, 409, "%s", r.body);
	http_free(&r);
	/* Another file of the dataset is free to go and come. */
	http(&d, "PUT", "/datasets/busy/other.csv", "1,2,0\n", "text/csv", NULL, &r);
	cr_assert_eq(r.status, 201, "%s", r.body);
	http_free(&r);
	http(&d, "DELETE", "/datasets/busy/other.csv", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	http_free(&r);

	char path[64];
	snprintf(path, sizeof path, "/jobs/%lld/cancel", id);
	http(&d, "POST", path, NULL, NULL, NULL, &r);
	http_free(&r);
	cr_assert_str_eq(wait_state(&d, id, "cancelled", 30), "cancelled");
	http(&d, "DELETE", "/datasets/busy/train.csv", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	http_free(&r);
	cr_assert_null(listed("busy", "train.csv"));
	http(&d, "DELETE", "/datasets/busy/train.csv", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 404, "%s", r.body);
	http_free(&r);
	cr_assert_eq(entries("busy"), -1);
}

/* "In use" compared strings: a job naming the file as iu//train.csv,
 * ./iu/train.csv or through the state directory did not hold it, and the
 * file could be deleted under the running job.  Now the file's identity
 * (device and inode) is compared. */
Test(datasets, in_use_whatever_the_spelling)
{
	struct http_reply r;
	http(&d, "PUT", "/datasets/iu/train.csv", toy_csv(), "text/csv", NULL, &r);
	cr_assert_eq(r.status, 201, "%s", r.body);
	http_free(&r);
	const char *spellings[] = {"iu//train.csv", "./iu/train.csv", "datasets/iu/train.csv"};
	for (size_t i = 0; i < sizeof spellings / sizeof spellings[0]; i++) {
		long long id = submit_job(&d, csv_job("spelled", spellings[i], 1000000));
		cr_assert_str_eq(wait_state(&d, id, "running", 30), "running", "%s", spellings[i]);
		http(&d, "DELETE", "/datasets/iu/train.csv", NULL, NULL, NULL, &r);
		cr_assert_eq(r.status, 409, "%s: %ld %s", spellings[i], r.status, r.body);
		http_free(&r);
		http(&d, "DELETE", "/datasets/iu", NULL, NULL, NULL, &r);
		cr_assert_eq(r.status, 409, "%s: %ld %s", spellings[i], r.status, r.body);
		http_free(&r);
		http(&d, "PUT", "/datasets/iu/train.csv", "1,2,0\n", "text/csv", NULL, &r);
		cr_assert_eq(r.status, 409, "%s: %ld %s", spellings[i], r.status, r.body);
		http_free(&r);
		char path[64];
		snprintf(path, sizeof path, "/jobs/%lld/cancel", id);
		http(&d, "POST", path, NULL, NULL, NULL, &r);
		http_free(&r);
		cr_assert_str_eq(wait_state(&d, id, "cancelled", 30), "cancelled");
	}
	http(&d, "DELETE", "/datasets/iu", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	http_free(&r);
}

/* A path outside the data roots gets an answer that lists the roots (the
 * datasets directory among them) and names the option that sets them. */
Test(datasets, outside_the_roots_lists_them_and_the_option)
{
	char real[4096], want[8300];
	cr_assert_not_null(realpath(d.dir, real));
	struct http_reply r;
	http(&d, "POST", "/jobs", csv_job("outside", "../elsewhere.csv", 1), NULL, NULL, &r);
	cr_assert_eq(r.status, 422, "%s", r.body);
	snprintf(want, sizeof want, "in the daemon's data roots (%s, %s/datasets)", real, real);
	cr_assert(strstr(r.body, want), "wanted '%s' in %s", want, r.body);
	cr_assert(strstr(r.body, "set with --data-root DIR or data-root lines in the config file"), "%s", r.body);
	http_free(&r);
}

/* The daemon's peak resident memory (VmHWM) in kB. */
static long peak_kb(pid_t pid)
{
	char path[64], line[256];
	long kb = -1;
	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f, "%s", path);
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "VmHWM: %ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

/* A large upload is streamed to disk, not held: 96 MB through the daemon
 * raise its peak memory by far less than the file. */
Test(datasets, large_upload_is_not_held_in_memory)
{
	daemon_cleanup(&d);
	const char *flags[] = {"--datasets-max-bytes", "0", NULL};
	daemon_start(&d, 1, flags);
	struct http_reply r;
	http(&d, "GET", "/datasets", NULL, NULL, NULL, &r); /* the API's threads and buffers are up */
	http_free(&r);
	long before = peak_kb(d.pid);
	put_stream("/datasets/large/ones.bin", (size_t)96 << 20, '1', false, &r);
	cr_assert_eq(r.status, 201, "%s", r.body);
	http_free(&r);
	long after = peak_kb(d.pid);
	cr_assert_lt(after - before, 24 * 1024, "the peak grew by %ld kB for a 96 MiB upload (from %ld kB)",
		     after - before, before);
	json_t *f = listed("large", "ones.bin");
	cr_assert_eq(json_integer_value(json_object_get(f, "bytes")), (json_int_t)96 << 20);
	json_decref(f);
}

/* PUT of a one-byte file; returns the status. */
static long put_small(const char *name, const char *file)
{
	char path[300];
	struct http_reply r;
	snprintf(path, sizeof path, "/datasets/%s/%s", name, file);
	http(&d, "PUT", path, "x", "text/plain", NULL, &r);
	long status = r.status;
	if (status == 413)
		cr_assert(strstr(r.body, "datasets-max-files") && strstr(r.body, "of 5 files"), "%s", r.body);
	http_free(&r);
	return status;
}

/* Small files take no quota bytes but an inode each: past the file-count
 * limit a new file is 413; a replacement still fits, and a delete frees a
 * place. */
Test(datasets, file_count_limit_is_413)
{
	daemon_cleanup(&d);
	const char *flags[] = {"--datasets-max-files", "5", NULL};
	daemon_start(&d, 1, flags);
	const char *files[] = {"a", "b", "c", "d", "e"};
	for (int i = 0; i < 5; i++)
		cr_assert_eq(put_small(i < 3 ? "fa" : "fb", files[i]), 201, "file %d", i);
	cr_assert_eq(put_small("fc", "f"), 413);
	cr_assert_eq(entries("fc"), -1, "a refused upload leaves no dataset");
	cr_assert_eq(put_small("fa", "a"), 200, "replacing a file adds none");
	struct http_reply r;
	http(&d, "GET", "/datasets", NULL, NULL, NULL, &r);
	cr_assert_eq(json_integer_value(json_object_get(r.json, "files")), 5, "%s", r.body);
	cr_assert_eq(json_integer_value(json_object_get(r.json, "max_files")), 5, "%s", r.body);
	http_free(&r);
	http(&d, "DELETE", "/datasets/fb/e", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	http_free(&r);
	cr_assert_eq(put_small("fc", "f"), 201);
	/* Counted again from the disk at start. */
	daemon_stop(&d, NULL);
	daemon_restart(&d, 1, flags);
	cr_assert_eq(put_small("fc", "g"), 413);
}

/* GET /datasets pages by file: limit files a page and "next" the cursor
 * for after=, null on the last page.  A dataset split across pages keeps
 * its whole size on each. */
Test(datasets, list_pages)
{
	const char *names[][2] = {{"pa", "1"}, {"pa", "2"}, {"pa", "3"}, {"pb", "1"}, {"pc", "1"}};
	for (int i = 0; i < 5; i++)
		cr_assert_eq(put_small(names[i][0], names[i][1]), 201);
	char after[300] = "", path[400];
	int seen = 0, pages = 0;
	for (; pages < 10; pages++) {
		struct http_reply r;
		snprintf(path, sizeof path, "/datasets?limit=2%s%s", after[0] ? "&after=" : "", after);
		http(&d, "GET", path, NULL, NULL, NULL, &r);
		cr_assert_eq(r.status, 200, "%s", r.body);
		json_t *ds;
		size_t i;
		int here = 0;
		json_array_foreach(json_object_get(r.json, "datasets"), i, ds) {
			json_t *f;
			size_t j;
			json_array_foreach(json_object_get(ds, "files"), j, f) {
				cr_assert_str_eq(json_string_value(json_object_get(ds, "name")), names[seen][0]);
				cr_assert_str_eq(json_string_value(json_object_get(f, "file")), names[seen][1]);
				seen++, here++;
			}
			if (strcmp(json_string_value(json_object_get(ds, "name")), "pa") == 0)
				cr_assert_eq(json_integer_value(json_object_get(ds, "bytes")), 3, "%s", r.body);
		}
		cr_assert_leq(here, 2, "%s", r.body);
		const char *next = json_string_value(json_object_get(r.json, "next"));
		if (next)
			snprintf(after, sizeof after, "%s", next);
		cr_assert_eq(json_object_get(r.json, "used_bytes") != NULL, 1);
		http_free(&r);
		if (!next)
			break;
	}
	cr_assert_eq(seen, 5);
	cr_assert_eq(pages, 2, "three pages of two, the last without next");
	struct http_reply r;
	http(&d, "GET", "/datasets?after=nocursor", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 400, "%s", r.body);
	cr_assert(strstr(r.body, "after"), "%s", r.body);
	http_free(&r);
	http(&d, "GET", "/datasets?limit=0", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 400, "%s", r.body);
	http_free(&r);
}

/* The datasets directory on a 2 MiB tmpfs, mounted in a mount namespace
 * of this test's own (criterion runs each test in a process of its own,
 * and the daemon it starts inherits the namespace): nothing outside sees
 * it, and it goes with the process.  false when that is not allowed. */
static bool small_datasets_fs(void)
{
	char path[300];
	snprintf(path, sizeof path, "%s/datasets", d.dir);
	if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		return false;
	return mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "size=2m,mode=0700") == 0;
}

/* A disk that fills during an upload, past "100 Continue" and well past
 * the bytes the daemon drops after a refusal: the client gets 507 naming
 * the full disk, not a broken connection, nothing of the upload is left,
 * and the daemon goes on serving. */
Test(datasets, disk_full_midway_is_507)
{
	daemon_stop(&d, NULL);
	if (!small_datasets_fs())
		cr_skip_test("needs a private mount namespace and a tmpfs (root, or CAP_SYS_ADMIN): %s",
			     strerror(errno));
	const char *flags[] = {"--datasets-max-bytes", "0", NULL};
	daemon_restart(&d, 1, flags);
	struct http_reply r;
	put_stream("/datasets/full/big.bin", (size_t)24 << 20, 'f', false, &r);
	cr_assert_eq(r.status, 507, "status %ld: %s", r.status, r.body ? r.body : "");
	cr_assert(strstr(r.body, "big.bin") && strstr(r.body, "No space left"), "%s", r.body);
	http_free(&r);
	cr_assert_eq(wait_entries("full", -1), -1, "the partial upload is deleted");
	cr_assert_eq(put_small("after", "ok"), 201);
	json_t *f = listed("after", "ok");
	cr_assert(f, "the daemon serves after a full disk");
	json_decref(f);
	daemon_stop(&d, NULL);
	char path[300];
	snprintf(path, sizeof path, "%s/datasets", d.dir);
	umount2(path, MNT_DETACH);
}
