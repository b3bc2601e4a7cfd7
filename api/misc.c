/* Small routes about the daemon itself: liveness (always 200 while the
 * process answers, and open without a token so probes need no secret),
 * readiness (the daemon's say, false while the API shuts down and while
 * the state database refuses writes),
 * version, devices, and the OpenAPI document, read from disk on each
 * request so the file on disk is the one truth.
 */
#include "api/api_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The spec is a few tens of kilobytes; anything far larger is not it. */
#define OPENAPI_MAX ((long)8 << 20)

void tr_api_health(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	(void)rq;
	tr_api_reply_json(rp, 200, json_pack("{s:s}", "status", "ok"));
}

void tr_api_ready(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_api_t *api = rq->api;
	bool ready = !atomic_load(&api->stopping);

	if (ready && api->cfg.ops.ready)
		ready = api->cfg.ops.ready(api->cfg.ctx);
	if (!ready) {
		tr_api_fail(rp, 503, "not_ready", NULL, "the daemon is starting up or shutting down");
		return;
	}
	/* Not ready while the state database refuses writes: submits would
	 * fail, and what jobs do is only held in memory. */
	char why[768];
	if (api->cfg.store && tr_store_health(api->cfg.store, why, sizeof why) < 0) {
		tr_api_fail(rp, 503, "storage_unavailable", NULL, "%s", why);
		return;
	}
	tr_api_reply_json(rp, 200, json_pack("{s:b}", "ready", 1));
}

void tr_api_version(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_api_reply_json(rp, 200, json_pack("{s:s, s:i}", "version", rq->api->cfg.version, "api", 1));
}

int tr_api_devices_read(tr_api_t *api, struct tr_api_device *out, int max)
{
	int n = api->cfg.ops.devices ? api->cfg.ops.devices(api->cfg.ctx, out, max) : 0;
	return n < 0 ? 0 : n > max ? max : n;
}

/* New reference: {"id":0,"name":"cpu0","kind":"cpu","memory_total":..,
 * "memory_free":..,"job":17|null}; memory is null where the backend
 * cannot say. */
static json_t *device_json(const struct tr_api_device *d)
{
	return json_pack("{s:i, s:s, s:s, s:o, s:o, s:o}", "id", d->id, "name", d->name, "kind", d->kind ? d->kind : "",
			 "memory_total", d->have_memory ? json_integer((json_int_t)d->memory_total) : json_null(),
			 "memory_free", d->have_memory ? json_integer((json_int_t)d->memory_free) : json_null(), "job",
			 d->job ? json_integer(d->job) : json_null());
}

void tr_api_devices(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	struct tr_api_device devs[TR_API_MAX_DEVICES];
	int n = tr_api_devices_read(rq->api, devs, TR_API_MAX_DEVICES);
	json_t *list = json_array();

	for (int i = 0; list && i < n; i++)
		if (json_array_append_new(list, device_json(&devs[i])) < 0) {
			json_decref(list);
			list = NULL;
		}
	if (!list) {
		tr_api_fail(rp, 500, "internal", NULL, "the device list is not available");
		return;
	}
	tr_api_reply_json(rp, 200, json_pack("{s:o}", "devices", list));
}

static int read_file(const char *path, char **out, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	long size;

	if (!f)
		return -errno;
	if (fseek(f, 0, SEEK_END) < 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) < 0)
		goto fail;
	if (size > OPENAPI_MAX) {
		fclose(f);
		return -EFBIG;
	}
	buf = malloc((size_t)size + 1);
	if (!buf)
		goto fail;
	if (fread(buf, 1, (size_t)size, f) != (size_t)size)
		goto fail;
	fclose(f);
	buf[size] = '\0';
	*out = buf;
	*len = (size_t)size;
	return 0;
fail:
	free(buf);
	fclose(f);
	return -EIO;
}

void tr_api_openapi(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	const char *path = rq->api->cfg.openapi_path;
	int rc;

	if (!path) {
		tr_api_fail(rp, 404, "not_found", NULL, "this daemon serves no OpenAPI document");
		return;
	}
	rc = read_file(path, &rp->text, &rp->text_len);
	if (rc < 0) {
		tr_api_fail(rp, rc == -ENOENT ? 404 : 500, rc == -ENOENT ? "not_found" : "internal", NULL,
			    "cannot read the OpenAPI document %s: %s", path, strerror(-rc));
		return;
	}
	rp->content_type = "application/yaml";
	rp->status = 200;
}

/* Asks the daemon to re-read its configuration, as SIGHUP does; what
 * changed goes to the daemon's log. */
void tr_api_reload(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_api_t *api = rq->api;
	struct tr_error err = {0};

	if (!api->cfg.ops.reload) {
		tr_api_fail(rp, 501, "not_implemented", NULL, "this daemon cannot reload its configuration");
		return;
	}
	if (api->cfg.ops.reload(api->cfg.ctx, &err) < 0) {
		tr_api_fail_op(rp, &err);
		return;
	}
	tr_api_reply_json(rp, 202, json_pack("{s:b}", "reloading", 1));
}
