/* Unit tests of api/rcache.c: the response cache itself: one computation for concurrent
 * misses, answers served for their generation and newer ones, failed and
 * stuck computations releasing their waiters, and the refresh of polled
 * entries.
 * Over real HTTP against the in-process API of tests/unit/api/fixture.h.
 */
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <regex.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "api/rcache.h"
#include "api/routes.h"
#include "engine/safetensors.h"
#include "tests/unit/api/fixture.h"

TestSuite(api, .init = api_fixture_setup, .fini = api_fixture_teardown, .timeout = 60);

/* A computation for tr_rcache_get that the test steers: the first call
 * waits until `expect` callers have arrived (and a little longer, so they
 * reach their wait), then until `release` when `hold` is set, then fails
 * when `fail_first` is set. */
struct steered {
	atomic_int calls, arrived;
	int expect;
	bool hold, fail_first;
	atomic_bool release;
};

static int steered_answer(void *ctx, char **body, size_t *len)
{
	struct steered *sc = ctx;
	double t0 = now_s();

	if (atomic_fetch_add(&sc->calls, 1) == 0) {
		while (atomic_load(&sc->arrived) < sc->expect && now_s() - t0 < 10)
			usleep(1000);
		usleep(200000);
		while (sc->hold && !atomic_load(&sc->release) && now_s() - t0 < 10)
			usleep(1000);
		if (sc->fail_first)
			return -EIO;
	}
	*body = strdup("answer\n");
	*len = 7;
	return 0;
}

struct asker {
	const struct tr_rcache_key *key;
	int wait_ms;
	struct steered *sc;
	int rc;
	char *body;
	size_t len;
};

static void *ask(void *cls)
{
	struct asker *a = cls;

	atomic_fetch_add(&a->sc->arrived, 1);
	a->rc = tr_rcache_get(a->key, a->wait_ms, steered_answer, a->sc, &a->body, &a->len);
	return NULL;
}

/* Asks key from n threads at once; returns the stats' change. */
static struct tr_rcache_stats ask_together(const struct tr_rcache_key *key, int wait_ms, struct steered *sc,
					   struct asker *a, int n)
{
	pthread_t th[8];
	struct tr_rcache_stats s0, s1;

	tr_rcache_stats(&s0);
	for (int i = 0; i < n; i++) {
		a[i] = (struct asker){.key = key, .wait_ms = wait_ms, .sc = sc};
		pthread_create(&th[i], NULL, ask, &a[i]);
	}
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	tr_rcache_stats(&s1);
	return (struct tr_rcache_stats){s1.hits - s0.hits, s1.shared - s0.shared, s1.computed - s0.computed,
					s1.wait_timeouts - s0.wait_timeouts, s1.refreshed - s0.refreshed};
}

Test(api, rcache_computes_once_for_concurrent_misses)
{
	static const char owner[] = "once";
	struct tr_rcache_key key = {owner, 1, "q", 5};
	struct steered sc = {.expect = 8};
	struct asker a[8];
	struct tr_rcache_stats d = ask_together(&key, 5000, &sc, a, 8);

	cr_assert_eq(atomic_load(&sc.calls), 1, "%d computations", atomic_load(&sc.calls));
	cr_assert_eq(d.computed, 1);
	cr_assert_eq(d.shared, 7);
	cr_assert_eq(d.wait_timeouts, 0);
	for (int i = 0; i < 8; i++) {
		cr_assert_eq(a[i].rc, 0);
		cr_assert_eq(a[i].len, 7);
		cr_assert_eq(memcmp(a[i].body, "answer\n", 7), 0);
		free(a[i].body);
	}
	tr_rcache_forget(owner);
}

Test(api, rcache_serves_its_generation_and_newer)
{
	static const char owner[] = "gens";
	struct tr_rcache_key key = {owner, 1, "q", 5};
	struct steered sc = {0};
	char *body;
	size_t len;

	for (int i = 0; i < 2; i++) {
		cr_assert_eq(tr_rcache_get(&key, 100, steered_answer, &sc, &body, &len), 0);
		free(body);
	}
	cr_assert_eq(atomic_load(&sc.calls), 1, "the same generation was computed again");
	key.gen = 4; /* asked by someone who read an older generation */
	cr_assert_eq(tr_rcache_get(&key, 100, steered_answer, &sc, &body, &len), 0);
	free(body);
	cr_assert_eq(atomic_load(&sc.calls), 1);
	key.gen = 6;
	cr_assert_eq(tr_rcache_get(&key, 100, steered_answer, &sc, &body, &len), 0);
	free(body);
	cr_assert_eq(atomic_load(&sc.calls), 2, "a newer generation was served an older answer");
	key.job = 2;
	cr_assert_eq(tr_rcache_get(&key, 100, steered_answer, &sc, &body, &len), 0);
	free(body);
	cr_assert_eq(atomic_load(&sc.calls), 3, "another job was served this job's answer");
	tr_rcache_forget(owner);
	cr_assert_eq(tr_rcache_get(&key, 100, steered_answer, &sc, &body, &len), 0);
	free(body);
	cr_assert_eq(atomic_load(&sc.calls), 4, "forgotten entries were served");
	tr_rcache_forget(owner);
}

/* A failing computation hands its waiters no answer and no long wait:
 * each computes on its own at once. */
Test(api, rcache_failed_computation_releases_its_waiters)
{
	static const char owner[] = "fail";
	struct tr_rcache_key key = {owner, 1, "q", 5};
	struct steered sc = {.expect = 4, .fail_first = true};
	struct asker a[4];
	double t0 = now_s();
	struct tr_rcache_stats d = ask_together(&key, 5000, &sc, a, 4);
	int failed = 0;

	cr_assert_lt(now_s() - t0, 4.0, "waiters sat out their wait bound");
	cr_assert_eq(d.wait_timeouts, 0);
	for (int i = 0; i < 4; i++) {
		if (a[i].rc == -EIO)
			failed++;
		else
			cr_assert(a[i].rc == 0 && a[i].len == 7 && memcmp(a[i].body, "answer\n", 7) == 0);
		free(a[i].body);
	}
	cr_assert_eq(failed, 1, "%d callers saw the failure", failed);
	tr_rcache_forget(owner);
}

/* A stuck computation holds the others for wait_ms at most. */
Test(api, rcache_wait_is_bounded)
{
	static const char owner[] = "stuck";
	struct tr_rcache_key key = {owner, 1, "q", 5};
	struct steered sc = {.expect = 1, .hold = true};
	struct asker leader = {.key = &key, .wait_ms = 5000, .sc = &sc}, late;
	pthread_t th;
	struct tr_rcache_stats s0, s1;

	pthread_create(&th, NULL, ask, &leader);
	while (atomic_load(&sc.calls) == 0)
		usleep(1000);
	tr_rcache_stats(&s0);
	late = (struct asker){.key = &key, .wait_ms = 100, .sc = &sc};
	double t0 = now_s();
	ask(&late);
	double waited = now_s() - t0;
	tr_rcache_stats(&s1);
	cr_assert_eq(late.rc, 0);
	cr_assert_geq(waited, 0.09, "did not wait for the computation (%.3f s)", waited);
	cr_assert_lt(waited, 3.0, "waited %.3f s", waited);
	cr_assert_eq(s1.wait_timeouts, s0.wait_timeouts + 1);
	atomic_store(&sc.release, true);
	pthread_join(th, NULL);
	cr_assert_eq(leader.rc, 0);
	free(leader.body);
	free(late.body);
	tr_rcache_forget(owner);
}

/* A refresh computes the new generation's answer of the entries clients
 * were served from the cache, and only of those: an answer computed once
 * and never asked again (an incremental poll's) is left alone. */
static atomic_int refresh_calls;

static int count_refresh(const void *owner, int64_t job, const char *query, char **body, size_t *len)
{
	(void)owner;
	(void)job;
	atomic_fetch_add(&refresh_calls, 1);
	*body = strdup(query);
	*len = strlen(query);
	return 0;
}

Test(api, rcache_refreshes_what_clients_poll)
{
	static const char owner[] = "refresh";
	struct tr_rcache_key polled = {owner, 1, "polled", 5}, once = {owner, 1, "once", 5};
	struct steered sc = {0};
	char *body;
	size_t len;

	for (int i = 0; i < 2; i++) {
		cr_assert_eq(tr_rcache_get_refreshable(&polled, count_refresh, 100, steered_answer, &sc, &body, &len),
			     0);
		free(body);
	}
	cr_assert_eq(tr_rcache_get_refreshable(&once, count_refresh, 100, steered_answer, &sc, &body, &len), 0);
	free(body);
	cr_assert_eq(atomic_load(&sc.calls), 2);
	cr_assert_eq(tr_rcache_refresh(owner, 2, 6), 0, "another job's entries were refreshed");
	cr_assert_eq(tr_rcache_refresh(owner, 1, 5), 0, "an entry of the same generation was refreshed");
	cr_assert_eq(tr_rcache_refresh(owner, 1, 6), 1, "only the polled entry is refreshed");
	cr_assert_eq(atomic_load(&refresh_calls), 1);
	/* Asked under the new generation: the refreshed answer, no computation. */
	polled.gen = 6;
	cr_assert_eq(tr_rcache_get_refreshable(&polled, count_refresh, 100, steered_answer, &sc, &body, &len), 0);
	cr_assert_eq(len, strlen("polled"));
	cr_assert(memcmp(body, "polled", len) == 0, "not the refreshed answer");
	free(body);
	cr_assert_eq(atomic_load(&sc.calls), 2, "the refreshed answer was computed again");
	tr_rcache_forget(owner);
}
