/* safetensors reading and writing (see safetensors.h).
 *
 * Files are read with pread so that a large checkpoint is never held in
 * memory twice; writes go through a temporary file and rename so a crash
 * never leaves a half-written file under the final name.
 */
#include "engine/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_HEADER (100u << 20)

static int64_t numel(const struct tr_st_tensor *t)
{
	int64_t n = 1;
	for (int d = 0; d < t->ndim; d++)
		n *= t->shape[d];
	return n;
}

static char *build_header(const struct tr_st_tensor *tensors, int n, const json_t *metadata, size_t *hlen,
			  size_t *data_len)
{
	json_t *h = json_object();
	size_t off = 0;
	if (metadata)
		json_object_set(h, "__metadata__", (json_t *)metadata);
	for (int i = 0; i < n; i++) {
		const struct tr_st_tensor *t = &tensors[i];
		json_t *shape = json_array();
		for (int d = 0; d < t->ndim; d++)
			json_array_append_new(shape, json_integer(t->shape[d]));
		size_t bytes = (size_t)numel(t) * sizeof(float);
		json_object_set_new(h, t->name,
				    json_pack("{s:s, s:o, s:[I, I]}", "dtype", "F32", "shape", shape, "data_offsets",
					      (json_int_t)off, (json_int_t)(off + bytes)));
		off += bytes;
	}
	char *text = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(h);
	if (!text)
		return NULL;
	size_t len = strlen(text);
	size_t padded = (len + 7) & ~(size_t)7;
	char *out = realloc(text, padded + 1);
	if (!out) {
		free(text);
		return NULL;
	}
	memset(out + len, ' ', padded - len);
	out[padded] = 0;
	*hlen = padded;
	*data_len = off;
	return out;
}

static void put_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

int tr_st_serialize(const struct tr_st_tensor *tensors, int n, const json_t *metadata, uint8_t **out, size_t *len,
		    struct tr_error *err)
{
	size_t hlen, dlen;
	char *header = build_header(tensors, n, metadata, &hlen, &dlen);
	if (!header) {
		tr_error_set(err, 0, 0, NULL, "safetensors: cannot build header");
		return -ENOMEM;
	}
	uint8_t *buf = malloc(8 + hlen + dlen);
	if (!buf) {
		free(header);
		tr_error_set(err, 0, 0, NULL, "safetensors: out of memory for %zu bytes", 8 + hlen + dlen);
		return -ENOMEM;
	}
	put_le64(buf, hlen);
	memcpy(buf + 8, header, hlen);
	free(header);
	uint8_t *p = buf + 8 + hlen;
	for (int i = 0; i < n; i++) {
		size_t bytes = (size_t)numel(&tensors[i]) * sizeof(float);
		memcpy(p, tensors[i].data, bytes); /* the host is little-endian (x86-64, aarch64) */
		p += bytes;
	}
	*out = buf;
	*len = 8 + hlen + dlen;
	return 0;
}

static int write_all(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;
	while (len > 0) {
		ssize_t w = write(fd, p, len);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += w;
		len -= (size_t)w;
	}
	return 0;
}

int tr_st_write(const char *path, const struct tr_st_tensor *tensors, int n, const json_t *metadata,
		struct tr_error *err)
{
	size_t hlen, dlen;
	char *header = build_header(tensors, n, metadata, &hlen, &dlen);
	if (!header) {
		tr_error_set(err, 0, 0, NULL, "%s: cannot build header", path);
		return -ENOMEM;
	}
	char tmp[4096];
	snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	int rc = 0;
	if (fd < 0) {
		rc = -errno;
		tr_error_set(err, 0, 0, NULL, "%s: %s", tmp, strerror(errno));
		free(header);
		return rc;
	}
	uint8_t len8[8];
	put_le64(len8, hlen);
	rc = write_all(fd, len8, 8);
	if (!rc)
		rc = write_all(fd, header, hlen);
	for (int i = 0; i < n && !rc; i++)
		rc = write_all(fd, tensors[i].data, (size_t)numel(&tensors[i]) * sizeof(float));
	if (!rc && fsync(fd) < 0)
		rc = -errno;
	if (close(fd) < 0 && !rc)
		rc = -errno;
	free(header);
	if (!rc && rename(tmp, path) < 0)
		rc = -errno;
	if (rc) {
		tr_error_set(err, 0, 0, NULL, "%s: %s", path, strerror(-rc));
		unlink(tmp);
	}
	return rc;
}

struct tr_st_file {
	int fd;             /* -1 for a memory image */
	const uint8_t *mem; /* borrowed memory image, or NULL */
	char *path;         /* file name, or a caller's label, for messages */
	json_t *header;
	uint64_t data_start, file_size;
};

/* Reads len bytes at off from the file or the memory image. */
static ssize_t read_at(tr_st_file_t *f, void *buf, size_t len, uint64_t off)
{
	if (f->mem) {
		if (off > f->file_size)
			return 0;
		size_t n = len < f->file_size - off ? len : (size_t)(f->file_size - off);
		memcpy(buf, f->mem + off, n);
		return (ssize_t)n;
	}
	return pread(f->fd, buf, len, (off_t)off);
}

void tr_st_close(tr_st_file_t *f)
{
	if (!f)
		return;
	if (f->fd >= 0)
		close(f->fd);
	json_decref(f->header);
	free(f->path);
	free(f);
}

static int check_entry(tr_st_file_t *f, const char *name, json_t *e, struct tr_error *err)
{
	json_t *dtype = json_object_get(e, "dtype"), *shape = json_object_get(e, "shape");
	json_t *offs = json_object_get(e, "data_offsets");
	if (!json_is_string(dtype) || !json_is_array(shape) || !json_is_array(offs) || json_array_size(offs) != 2 ||
	    !json_is_integer(json_array_get(offs, 0)) || !json_is_integer(json_array_get(offs, 1))) {
		tr_error_set(err, 0, 0, NULL, "%s: tensor '%s': malformed header entry", f->path, name);
		return -EINVAL;
	}
	json_int_t b = json_integer_value(json_array_get(offs, 0));
	json_int_t e2 = json_integer_value(json_array_get(offs, 1));
	if (b < 0 || e2 < b || (uint64_t)e2 > f->file_size - f->data_start) {
		tr_error_set(err, 0, 0, NULL,
			     "%s: tensor '%s': data_offsets [%lld, %lld] outside the file's %llu data bytes", f->path,
			     name, (long long)b, (long long)e2, (unsigned long long)(f->file_size - f->data_start));
		return -EINVAL;
	}
	return 0;
}

/* Parses the header once the size is known and reads can be made. */
static int parse_header(tr_st_file_t *f, struct tr_error *err)
{
	const char *path = f->path;
	uint8_t len8[8];
	if (f->file_size < 8 || read_at(f, len8, 8, 0) != 8) {
		tr_error_set(err, 0, 0, NULL, "%s: not a safetensors file (shorter than 8 bytes)", path);
		return -EINVAL;
	}
	uint64_t hlen = 0;
	for (int i = 0; i < 8; i++)
		hlen |= (uint64_t)len8[i] << (8 * i);
	if (hlen > MAX_HEADER || 8 + hlen > f->file_size) {
		tr_error_set(err, 0, 0, NULL, "%s: header length %llu does not fit the file (%llu bytes)", path,
			     (unsigned long long)hlen, (unsigned long long)f->file_size);
		return -EINVAL;
	}
	char *text = malloc(hlen + 1);
	if (!text || read_at(f, text, hlen, 8) != (ssize_t)hlen) {
		free(text);
		tr_error_set(err, 0, 0, NULL, "%s: cannot read header", path);
		return -EIO;
	}
	text[hlen] = 0;
	json_error_t jerr;
	f->header = json_loads(text, 0, &jerr);
	free(text);
	if (!json_is_object(f->header)) {
		/* The position, not jansson's text: that quotes the file. */
		if (f->header)
			tr_error_set(err, 0, 0, NULL, "%s: header is not a JSON object", path);
		else
			tr_error_set(err, 0, 0, NULL, "%s: header is not valid JSON (byte %d of the header)", path,
				     jerr.position);
		return -EINVAL;
	}
	f->data_start = 8 + hlen;
	const char *name;
	json_t *e;
	json_object_foreach(f->header, name, e) {
		if (strcmp(name, "__metadata__") == 0)
			continue;
		int rc = check_entry(f, name, e, err);
		if (rc)
			return rc;
	}
	return 0;
}

int tr_st_open(const char *path, tr_st_file_t **out, struct tr_error *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int rc = -errno;
		tr_error_set(err, 0, 0, NULL, "%s: %s", path, strerror(errno));
		return rc;
	}
	return tr_st_open_fd(fd, path, out, err);
}

int tr_st_open_fd(int fd, const char *path, tr_st_file_t **out, struct tr_error *err)
{
	tr_st_file_t *f = calloc(1, sizeof *f);
	if (!f) {
		tr_error_set(err, 0, 0, NULL, "%s: out of memory", path);
		close(fd);
		return -ENOMEM;
	}
	f->path = strdup(path);
	f->fd = fd;
	int rc = 0;
	struct stat st;
	if (fstat(f->fd, &st) < 0) {
		rc = -errno;
		tr_error_set(err, 0, 0, NULL, "%s: %s", path, strerror(errno));
		goto fail;
	}
	f->file_size = (uint64_t)st.st_size;
	if ((rc = parse_header(f, err)) < 0)
		goto fail;
	*out = f;
	return 0;
fail:
	tr_st_close(f);
	return rc;
}

int tr_st_open_mem(const void *data, size_t len, const char *label, tr_st_file_t **out, struct tr_error *err)
{
	tr_st_file_t *f = calloc(1, sizeof *f);
	if (!f) {
		tr_error_set(err, 0, 0, NULL, "%s: out of memory", label);
		return -ENOMEM;
	}
	f->fd = -1;
	f->mem = data;
	f->file_size = len;
	f->path = strdup(label);
	int rc = parse_header(f, err);
	if (rc < 0) {
		tr_st_close(f);
		return rc;
	}
	*out = f;
	return 0;
}

int tr_st_read_f32(tr_st_file_t *f, const char *name, int ndim, const int64_t *shape, float *dst, struct tr_error *err)
{
	json_t *e = json_object_get(f->header, name);
	if (!e) {
		tr_error_set(err, 0, 0, NULL, "%s: has no tensor '%s'", f->path, name);
		return -ENOENT;
	}
	const char *dtype = json_string_value(json_object_get(e, "dtype"));
	if (strcmp(dtype, "F32") != 0) {
		tr_error_set(err, 0, 0, NULL, "%s: tensor '%s' has dtype %.8s, expected F32", f->path, name, dtype);
		return -EINVAL;
	}
	json_t *js = json_object_get(e, "shape");
	bool same = json_array_size(js) == (size_t)ndim;
	for (int d = 0; same && d < ndim; d++)
		same = json_integer_value(json_array_get(js, (size_t)d)) == shape[d];
	if (!same) {
		char want[128] = "", got[128] = "";
		size_t wl = 0, gl = 0;
		for (int d = 0; d < ndim; d++)
			wl += (size_t)snprintf(want + wl, sizeof want - wl, "%s%lld", d ? ", " : "",
					       (long long)shape[d]);
		for (size_t d = 0; d < json_array_size(js) && gl < sizeof got; d++)
			gl += (size_t)snprintf(got + gl, sizeof got - gl, "%s%lld", d ? ", " : "",
					       (long long)json_integer_value(json_array_get(js, d)));
		tr_error_set(err, 0, 0, NULL, "%s: tensor '%s' has shape [%s], the model expects [%s]", f->path, name,
			     got, want);
		return -EINVAL;
	}
	json_t *offs = json_object_get(e, "data_offsets");
	uint64_t b = (uint64_t)json_integer_value(json_array_get(offs, 0));
	uint64_t end = (uint64_t)json_integer_value(json_array_get(offs, 1));
	size_t want_bytes = sizeof(float);
	for (int d = 0; d < ndim; d++)
		want_bytes *= (size_t)shape[d];
	if (end - b != want_bytes) {
		tr_error_set(err, 0, 0, NULL, "%s: tensor '%s' holds %llu bytes, its shape needs %zu", f->path, name,
			     (unsigned long long)(end - b), want_bytes);
		return -EINVAL;
	}
	uint8_t *p = (uint8_t *)dst;
	size_t done = 0;
	while (done < want_bytes) {
		ssize_t r = read_at(f, p + done, want_bytes - done, f->data_start + b + done);
		if (r <= 0) {
			tr_error_set(err, 0, 0, NULL, "%s: short read in tensor '%s'", f->path, name);
			return -EIO;
		}
		done += (size_t)r;
	}
	return 0;
}

int tr_st_read_count(tr_st_file_t *f, const char *name, float *dst, struct tr_error *err)
{
	json_t *e = json_object_get(f->header, name);
	if (!e) {
		tr_error_set(err, 0, 0, NULL, "%s: has no tensor '%s'", f->path, name);
		return -ENOENT;
	}
	const char *dtype = json_string_value(json_object_get(e, "dtype"));
	json_t *js = json_object_get(e, "shape");
	bool i64 = strcmp(dtype, "I64") == 0;
	if (!i64 || (json_array_size(js) == 1 && json_integer_value(json_array_get(js, 0)) != 1) ||
	    json_array_size(js) > 1)
		return tr_st_read_f32(f, name, 0, NULL, dst, err); /* F32 or its error */
	json_t *offs = json_object_get(e, "data_offsets");
	uint64_t b = (uint64_t)json_integer_value(json_array_get(offs, 0));
	uint64_t end = (uint64_t)json_integer_value(json_array_get(offs, 1));
	uint8_t le[8];
	if (end - b != sizeof le) {
		tr_error_set(err, 0, 0, NULL, "%s: tensor '%s' holds %llu bytes, its shape needs 8", f->path, name,
			     (unsigned long long)(end - b));
		return -EINVAL;
	}
	if (read_at(f, le, sizeof le, f->data_start + b) != (ssize_t)sizeof le) {
		tr_error_set(err, 0, 0, NULL, "%s: short read in tensor '%s'", f->path, name);
		return -EIO;
	}
	uint64_t u = 0;
	for (int i = 0; i < 8; i++)
		u |= (uint64_t)le[i] << (8 * i);
	int64_t v = (int64_t)u;
	if (v < 0 || v > (INT64_C(1) << 24)) {
		tr_error_set(err, 0, 0, NULL, "%s: tensor '%s' is %lld, outside the counter range [0, 2^24]", f->path,
			     name, (long long)v);
		return -EINVAL;
	}
	*dst = (float)v;
	return 0;
}

const json_t *tr_st_metadata(const tr_st_file_t *f)
{
	return json_object_get(f->header, "__metadata__");
}

int tr_st_count(const tr_st_file_t *f)
{
	int n = (int)json_object_size(f->header);
	return json_object_get(f->header, "__metadata__") ? n - 1 : n;
}

bool tr_st_has(const tr_st_file_t *f, const char *name)
{
	return strcmp(name, "__metadata__") != 0 && json_object_get(f->header, name) != NULL;
}
