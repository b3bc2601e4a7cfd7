/* The image examples train to what they promise: examples/fashion-cnn.json
 * reaches at least 89% accuracy on Fashion-MNIST's test set (Debian's
 * dataset-fashion-mnist), and examples/superres.json beats bicubic
 * upscaling in PSNR on an image it never trained on (Debian's
 * python3-skimage: camera.png held back, other 512x512 grey images to
 * train on).  Both take minutes on a CPU, so they are their own suite.
 *
 * They need the conv2d/pooling layers and [C, H, W] model inputs; until
 * the engine accepts them, each test skips with the parser's message
 * instead of failing, and so does a machine without the data packages.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/backend.h"
#include "engine/data/reader.h"
#include "engine/spec.h"
#include "engine/trainer.h"
#include "tests/unit/engine/fixtures.h"

#define FASHION "/usr/share/datasets/fashion-mnist"
#define SKIMAGE "/usr/lib/python3/dist-packages/skimage/data"

TestSuite(examples_images, .init = fixture_setup, .fini = fixture_teardown, .timeout = 3600);

static json_t *load_example(const char *name)
{
	const char *data = getenv("TR_TEST_DATA");
	char path[4096];
	json_error_t e;
	json_t *doc;

	cr_assert(data, "TR_TEST_DATA is not set (run through meson test)");
	snprintf(path, sizeof path, "%s/../../examples/%s", data, name);
	doc = json_load_file(path, 0, &e);
	cr_assert_not_null(doc, "%s: %s", path, e.text);
	return doc;
}

/* Parses the example; skips (visibly) when the engine does not know its
 * layers or input shape yet, which is the only refusal expected. */
static void parse_or_skip(const char *name, json_t *doc, struct tr_spec *spec)
{
	struct tr_error err;
	regex_t re;
	int waiting;

	if (tr_spec_parse(doc, spec, &err) == 0)
		return;
	cr_assert_eq(regcomp(&re, "^/model/(inputs|layers/[0-9]+/type)$", REG_EXTENDED | REG_NOSUB), 0);
	waiting = regexec(&re, err.pointer, 0, NULL, 0) == 0;
	regfree(&re);
	cr_assert(waiting, "examples/%s is refused: %s", name, err.message);
	fprintf(stderr, "SKIP examples/%s: the engine does not take its model yet (%s)\n", name, err.message);
	cr_skip_test("examples/%s waits for image layers: %s", name, err.message);
}

static int copy_file(const char *from, const char *to)
{
	FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
	char buf[65536];
	size_t n;

	if (!a || !b) {
		if (a)
			fclose(a);
		if (b)
			fclose(b);
		return -1;
	}
	while ((n = fread(buf, 1, sizeof buf, a)) > 0)
		fwrite(buf, 1, n, b);
	fclose(a);
	return fclose(b);
}

static void run(const struct tr_spec *spec, int devices, struct tr_summary *sum)
{
	tr_backend_t *be = tr_cpu_backend_create(devices, 1);
	tr_trainer_t *t = NULL;
	struct tr_error err;
	struct tr_trainer_options opt = {.spec = spec, .backend = be, .devices = devices, .workers = 2};

	cr_assert_not_null(be);
	/* The route `trainerd run` and the daemon take by default (a backend
	 * created directly starts on im2col): the examples are checked as
	 * users run them, and oneDNN's convolutions take about half im2col's
	 * CPU time on these nets. */
	cr_assert_eq(tr_cpu_backend_set_conv(be, TR_CPU_CONV_AUTO, &err), 0, "%s", err.message);
	cr_assert_eq(tr_trainer_create(&opt, &t, &err), 0, "%s", err.message);
	cr_assert_eq(tr_trainer_run(t, &err), 0, "%s", err.message);
	tr_trainer_summary(t, sum);
	tr_trainer_destroy(t);
	tr_backend_destroy(be);
}

Test(examples_images, fashion_cnn_reaches_89_percent)
{
	struct stat st;
	struct tr_spec spec;
	struct tr_summary sum;
	json_t *doc = load_example("fashion-cnn.json");

	if (stat(FASHION "/train-images-idx3-ubyte.gz", &st) != 0) {
		fprintf(stderr,
			"SKIP: Fashion-MNIST is not installed (Debian package dataset-fashion-mnist): skipped\n");
		cr_skip_test("Fashion-MNIST is not installed (Debian package dataset-fashion-mnist): skipped");
	}
	parse_or_skip("fashion-cnn.json", doc, &spec);
	json_decref(doc);
	run(&spec, 2, &sum);
	fprintf(stderr, "fashion-cnn: test accuracy %.4f, test loss %.4f after %lld steps (%.0f samples/s)\n",
		sum.val_accuracy, sum.val_loss, (long long)sum.steps, sum.samples_per_sec);
	cr_assert_geq(sum.val_accuracy, 0.89, "test accuracy %.4f", sum.val_accuracy);
	tr_spec_finish(&spec);
}

Test(examples_images, superres_beats_bicubic_on_a_held_back_image)
{
	static const char *train[] = {"brick.png", "grass.png",        "gravel.png",
				      "moon.png",  "clock_motion.png", "coins.png"};
	char from[512], to[512], tdir[300], vdir[300];
	struct stat st;
	struct tr_spec spec;
	struct tr_summary sum;
	json_t *doc = load_example("superres.json");
	tr_reader_t *val;
	struct tr_error err;
	double base = 0;

	if (stat(SKIMAGE "/camera.png", &st) != 0) {
		fprintf(stderr, "SKIP: python3-skimage's images are not installed: skipped\n");
		cr_skip_test("python3-skimage's images are not installed: skipped");
	}
	snprintf(tdir, sizeof tdir, "%s/train", tmp_dir);
	snprintf(vdir, sizeof vdir, "%s/val", tmp_dir);
	cr_assert_eq(mkdir(tdir, 0755), 0);
	cr_assert_eq(mkdir(vdir, 0755), 0);
	for (size_t i = 0; i < sizeof train / sizeof train[0]; i++) {
		snprintf(from, sizeof from, SKIMAGE "/%s", train[i]);
		snprintf(to, sizeof to, "%s/%s", tdir, train[i]);
		cr_assert_eq(copy_file(from, to), 0, "%s", from);
	}
	snprintf(to, sizeof to, "%s/camera.png", vdir);
	cr_assert_eq(copy_file(SKIMAGE "/camera.png", to), 0);
	json_object_set_new(json_object_get(json_object_get(doc, "data"), "train"), "path", json_string(tdir));
	json_object_set_new(json_object_get(json_object_get(doc, "data"), "validation"), "path", json_string(vdir));
	parse_or_skip("superres.json", doc, &spec);
	json_decref(doc);

	/* Bicubic's error on the validation patches: the residual target
	 * itself (bicubic predicts a zero residual). */
	cr_assert_eq(tr_reader_open(&spec.validation, spec.seed, NULL, NULL, &val, &err), 0, "%s", err.message);
	{
		int L = val->info.label_dim;
		float *x = malloc((size_t)val->info.features * sizeof(float)), *y = malloc((size_t)L * sizeof(float));

		for (int64_t i = 0; i < val->info.samples; i++) {
			double s = 0;

			cr_assert_eq(tr_reader_get(val, i, x, y, &err), 0, "%s", err.message);
			for (int j = 0; j < L; j++)
				s += (double)y[j] * y[j];
			base += s / L;
		}
		base /= (double)val->info.samples;
		free(x);
		free(y);
	}
	tr_reader_destroy(val);
	run(&spec, 2, &sum);
	fprintf(stderr, "superres: PSNR on held-back camera.png patches %.2f dB, bicubic %.2f dB\n",
		10 * log10(1 / sum.val_loss), 10 * log10(1 / base));
	cr_assert_lt(sum.val_loss, base, "the net (MSE %g, %.2f dB) does not beat bicubic (MSE %g, %.2f dB)",
		     sum.val_loss, 10 * log10(1 / sum.val_loss), base, 10 * log10(1 / base));
	tr_spec_finish(&spec);
}
