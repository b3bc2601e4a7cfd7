/* trainerd serve's configuration (daemon/config.c): defaults, the command
 * line and the config file read through the one option table, the messages
 * that name the flag or the file and line, and the reload diff. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/config.h"

/* The message arrives through struct tr_error (core/error.h). */
static int parse(struct tr_config *c, char *err, size_t errlen, int argc, char **argv)
{
	struct tr_error e = {0};

	tr_config_defaults(c);
	int rc = tr_config_parse_args(c, argc, argv, &e);
	snprintf(err, errlen, "%s", e.message);
	return rc;
}

static int load(struct tr_config *c, const char *path, char *err, size_t errlen)
{
	struct tr_error e = {0};
	int rc = tr_config_load_file(c, path, &e);

	snprintf(err, errlen, "%s", e.message);
	return rc;
}

Test(config, defaults)
{
	struct tr_config c;

	tr_config_defaults(&c);
	cr_assert_str_eq(c.listen_host, "127.0.0.1");
	cr_assert_eq(c.listen_port, 8080);
	cr_assert_str_eq(c.state_dir, "./var");
	cr_assert_str_eq(c.backend, "auto");
	cr_assert_eq(c.max_body, 1048576);
	cr_assert_eq(c.log_level, 6);
	cr_assert_eq(c.sse_buffer, 262144);
	cr_assert_eq(c.metrics_queue, 1000000);
	cr_assert_eq(c.max_queued_jobs, 10000);
	cr_assert_eq(c.n_data_roots, 0);
	cr_assert_null(c.data_roots[0]);
	cr_assert_str_eq(c.openapi_path, "openapi/openapi.yaml");
	cr_assert_str_eq(c.token_file, "");
	tr_config_finish(&c);
}

Test(config, flags_set_every_kind)
{
	struct tr_config c;
	char err[1024] = "";
	char *argv[] = {"--listen",       "[::1]:9000",   "--data-root", "/a",
			"--data-root=/b", "--backend",    "cpu",         "--max-body",
			"2048",           "--log-level",  "debug",       "--state-max-bytes",
			"5000000000",     "--token-file", "/etc/t"};

	cr_assert_eq(parse(&c, err, sizeof err, 15, argv), 0, "%s", err);
	cr_assert_str_eq(c.listen_host, "::1");
	cr_assert_eq(c.listen_port, 9000);
	cr_assert_eq(c.n_data_roots, 2);
	cr_assert_str_eq(c.data_roots[0], "/a");
	cr_assert_str_eq(c.data_roots[1], "/b");
	cr_assert_null(c.data_roots[2]);
	cr_assert_str_eq(c.backend, "cpu");
	cr_assert_eq(c.max_body, 2048);
	cr_assert_eq(c.log_level, 7);
	cr_assert_eq(c.state_max_bytes, 5000000000LL);
	cr_assert_str_eq(c.token_file, "/etc/t");
	tr_config_finish(&c);
}

struct bad_case {
	const char *flag, *value, *want;
};

Test(config, bad_values_name_the_flag)
{
	static const struct bad_case cases[] = {
		{"--max-body", "abc", "--max-body: must be an integer, got 'abc'"},
		{"--max-body", "10", "--max-body: must be in [1024, 67108864], got '10'"},
		{"--max-body", "2048 ", "--max-body: must be an integer, got '2048 '"},
		{"--cpu-devices", "-1", "--cpu-devices: must be in [0, 64], got '-1'"},
		{"--backend", "gpu", "--backend: must be one of \"auto\", \"cpu\", \"cuda\", got 'gpu'"},
		{"--listen", "foo", "--listen: expected HOST:PORT, got 'foo'"},
		{"--listen", "h:70000", "--listen: expected HOST:PORT with a port in [0, 65535], got 'h:70000'"},
		{"--data-root", "", "--data-root: must not be empty, got ''"},
		{"--log-level", "loud", "--log-level: must be one of"},
		{"--state-max-bytes", "-5", "--state-max-bytes: must be >= 0, got '-5'"},
		{"--max-job-crashes", "-1", "--max-job-crashes: must be in [0, 1000], got '-1'"},
		{"--image-max-pixels", "0", "--image-max-pixels: must be in [1, 268435456], got '0'"},
		{"--memory-available", "-1", "--memory-available: must be >= 0, got '-1'"},
	};

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		struct tr_config c;
		char err[1024] = "";
		char *argv[] = {(char *)cases[i].flag, (char *)cases[i].value};

		cr_assert_eq(parse(&c, err, sizeof err, 2, argv), -EINVAL, "%s %s accepted", cases[i].flag,
			     cases[i].value);
		cr_assert(strncmp(err, cases[i].want, strlen(cases[i].want)) == 0, "%s %s: got \"%s\"", cases[i].flag,
			  cases[i].value, err);
		tr_config_finish(&c);
	}
}

Test(config, unknown_option_and_missing_value)
{
	struct tr_config c;
	char err[1024] = "";
	char *a1[] = {"--nope", "1"};
	char *a2[] = {"--max-body"};

	cr_assert_eq(parse(&c, err, sizeof err, 2, a1), -EINVAL);
	cr_assert_str_eq(err, "unknown option '--nope' (see trainerd serve --help)");
	tr_config_finish(&c);
	cr_assert_eq(parse(&c, err, sizeof err, 1, a2), -EINVAL);
	cr_assert_str_eq(err, "--max-body needs a value");
	tr_config_finish(&c);
}

static char *write_file(const char *text)
{
	static char path[] = "/tmp/trainerd-config-XXXXXX";
	char *p = strdup(path);
	int fd = mkstemp(p);

	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	return p;
}

Test(config, file_lines_and_later_flags_win)
{
	struct tr_config c;
	char err[1024] = "";
	char *path = write_file("# comment\n\nmax-body = 4096\nlisten = 0.0.0.0:81\ntoken = abc\n");
	char *argv[] = {"--config", path, "--max-body", "8192"};

	cr_assert_eq(parse(&c, err, sizeof err, 4, argv), 0, "%s", err);
	cr_assert_eq(c.max_body, 8192);
	cr_assert_str_eq(c.listen_host, "0.0.0.0");
	cr_assert_eq(c.listen_port, 81);
	cr_assert_eq(c.n_tokens, 1);
	cr_assert_str_eq(c.tokens[0], "abc");
	tr_config_finish(&c);
	unlink(path);
	free(path);
}

Test(config, file_errors_name_file_and_line)
{
	struct tr_config c;
	char err[1024] = "", want[600];
	char *path = write_file("max-body = 4096\n\nsse-heartbeat = 0\n");

	tr_config_defaults(&c);
	cr_assert_eq(load(&c, path, err, sizeof err), -EINVAL);
	snprintf(want, sizeof want, "%s:3: sse-heartbeat: must be in [1, 3600], got '0'", path);
	cr_assert_str_eq(err, want);
	tr_config_finish(&c);
	unlink(path);
	free(path);

	path = write_file("bogus = 1\n");
	tr_config_defaults(&c);
	cr_assert_eq(load(&c, path, err, sizeof err), -EINVAL);
	snprintf(want, sizeof want, "%s:1: unknown option 'bogus'", path);
	cr_assert_str_eq(err, want);
	tr_config_finish(&c);
	unlink(path);
	free(path);

	path = write_file("just words\n");
	tr_config_defaults(&c);
	cr_assert_eq(load(&c, path, err, sizeof err), -EINVAL);
	snprintf(want, sizeof want, "%s:1: expected 'name = value'", path);
	cr_assert_str_eq(err, want);
	tr_config_finish(&c);
	unlink(path);
	free(path);
}

struct diff_seen {
	char names[512];
	int reloadable;
};

static void on_diff(const char *name, int reloadable, void *ud)
{
	struct diff_seen *d = ud;

	strcat(d->names, name);
	strcat(d->names, " ");
	d->reloadable += reloadable;
}

Test(config, diff_names_changed_options_and_reloadability)
{
	struct tr_config a, b;
	char err[1024] = "";
	char *argv[] = {"--max-body", "4096", "--listen", "127.0.0.1:9", "--token", "t1", "--log-level", "info"};
	struct diff_seen d = {0};

	tr_config_defaults(&a);
	cr_assert_eq(parse(&b, err, sizeof err, 8, argv), 0, "%s", err);
	cr_assert_eq(tr_config_diff(&a, &b, on_diff, &d), 3);
	cr_assert_str_eq(d.names, "listen max-body token ");
	cr_assert_eq(d.reloadable, 2); /* max-body and token; listen needs a restart */
	memset(&d, 0, sizeof d);
	cr_assert_eq(tr_config_diff(&a, &a, on_diff, &d), 0);
	tr_config_finish(&a);
	tr_config_finish(&b);
}

/* The [preemption] section: its keys are the preemption-KEY options, the
 * flags spell them out, and errors name the file, line and section. */
Test(config, preemption_section)
{
	struct tr_config c;
	char err[1024] = "", want[600];
	char *path = write_file("max-body = 4096\n[preemption]\nenabled = off\ngrace = 5\nmin-run = 0\n");
	char *argv[] = {"--config", path, "--preemption-grace", "7"};

	tr_config_defaults(&c);
	cr_assert(c.preemption_enabled);
	cr_assert_eq(c.preemption_grace_s, 60);
	cr_assert_eq(c.preemption_min_run_s, 60);
	tr_config_finish(&c);
	cr_assert_eq(parse(&c, err, sizeof err, 4, argv), 0, "%s", err);
	cr_assert_eq(c.max_body, 4096);
	cr_assert(!c.preemption_enabled);
	cr_assert_eq(c.preemption_grace_s, 7);
	cr_assert_eq(c.preemption_min_run_s, 0);
	tr_config_finish(&c);
	unlink(path);
	free(path);

	path = write_file("[preemption]\nmax-body = 4096\n");
	tr_config_defaults(&c);
	cr_assert_eq(load(&c, path, err, sizeof err), -EINVAL);
	snprintf(want, sizeof want, "%s:2: unknown option 'max-body' in section [preemption]", path);
	cr_assert_str_eq(err, want);
	tr_config_finish(&c);
	unlink(path);
	free(path);

	path = write_file("[preemption]\nenabled = maybe\n");
	tr_config_defaults(&c);
	cr_assert_eq(load(&c, path, err, sizeof err), -EINVAL);
	cr_assert(strstr(err, ":2: preemption-enabled: "), "%s", err);
	tr_config_finish(&c);
	unlink(path);
	free(path);

	path = write_file("[scheduling]\n");
	tr_config_defaults(&c);
	cr_assert_eq(load(&c, path, err, sizeof err), -EINVAL);
	snprintf(want, sizeof want, "%s:1: unknown section [scheduling] (the file has one: [preemption])", path);
	cr_assert_str_eq(err, want);
	tr_config_finish(&c);
	unlink(path);
	free(path);
}
