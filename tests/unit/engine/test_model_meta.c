/* A model file's self-description (engine/model_meta.h) and the figures of
 * an evaluation (engine/infer.h): the description round-trips, rebuilt
 * transforms give the same inputs as the fitted ones, bad descriptions are
 * named, and eval figures match a direct computation. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/infer.h"
#include "engine/model_meta.h"

static const char *const spec_text =
	"{\"name\": \"meta\", \"seed\": 3,"
	" \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 8}, {\"type\": \"relu\"},"
	"   {\"type\": \"dropout\", \"rate\": 0.2}, {\"type\": \"dense\", \"units\": 3}]},"
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 200, \"features\": 5, \"classes\": 3},"
	"   \"transforms\": [{\"type\": \"scale\", \"factor\": 0.5}, {\"type\": \"standardize\"},"
	"                   {\"type\": \"gaussian_noise\", \"std\": 0.3}]},"
	" \"batch_size\": 16, \"epochs\": 1, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}";

struct fixture {
	struct tr_spec spec;
	tr_reader_t *train;
	tr_transforms_t *tf;
	tr_model_t model;
	json_t *meta;
};

static void build(struct fixture *f)
{
	struct tr_error serr;
	struct tr_error err;
	cr_assert_eq(tr_spec_parse_text(spec_text, &f->spec, &serr), 0, "%s", serr.message);
	cr_assert_eq(tr_reader_open(&f->spec.train, f->spec.seed, NULL, NULL, &f->train, &err), 0, "%s", err.message);
	cr_assert_eq(tr_transforms_create(&f->spec, f->train, &f->tf, &err), 0, "%s", err.message);
	cr_assert_eq(tr_model_init(&f->model, &f->spec, f->train->info.features, &err), 0, "%s", err.message);
	f->meta = json_object();
	cr_assert_eq(tr_model_meta_describe(f->meta, &f->spec, &f->model, f->tf, f->train, &err), 0, "%s", err.message);
}

static void teardown(struct fixture *f)
{
	json_decref(f->meta);
	tr_transforms_destroy(f->tf);
	tr_reader_destroy(f->train);
	tr_spec_finish(&f->spec);
}

Test(model_meta, round_trip)
{
	struct fixture f;
	build(&f);
	/* Every value is a string (safetensors' rule). */
	const char *key;
	json_t *v;
	json_object_foreach(f.meta, key, v)
		cr_assert(json_is_string(v), "%s is not a string", key);
	cr_assert_str_eq(json_string_value(json_object_get(f.meta, "trainerd_model_format")), "1");
	cr_assert_str_eq(json_string_value(json_object_get(f.meta, "trainerd_version")), TR_VERSION);

	struct tr_model_desc d;
	struct tr_error err;
	cr_assert_eq(tr_model_desc_from_meta(f.meta, &d, &err), 0, "%s", err.message);
	cr_assert_eq(d.model.inputs, 5, "inputs taken from the data are recorded");
	cr_assert_eq(d.model.n_params, f.model.n_params);
	cr_assert_eq(d.model.n_layers, 4);
	cr_assert(d.classification);
	cr_assert_eq(d.outputs, 3);
	cr_assert_null(d.class_names);
	cr_assert_eq(d.spec.n_transforms, 3);
	cr_assert_str_eq(d.version, TR_VERSION);

	/* The rebuilt transforms give every sample exactly the fitted ones'
	 * inference input (noise skipped on both sides). */
	for (int64_t i = 0; i < f.train->info.samples; i++) {
		float x[5], y[1], a[5], b[5];
		cr_assert_eq(tr_reader_get(f.train, i, x, y, &err), 0);
		memcpy(a, x, sizeof x);
		memcpy(b, x, sizeof x);
		tr_transforms_apply(f.tf, a, 5, 3, 0, i, 0);
		tr_transforms_apply(d.transforms, b, 5, 3, 0, i, 0);
		cr_assert_eq(memcmp(a, b, sizeof a), 0, "sample %lld differs", (long long)i);
	}
	/* The recorded preprocessing says which transform is for training only. */
	json_t *pre = json_loads(json_string_value(json_object_get(f.meta, "preprocessing")), 0, NULL);
	json_t *tfs = json_object_get(pre, "transforms");
	cr_assert_eq(json_array_size(tfs), 3);
	cr_assert(json_is_true(json_object_get(json_array_get(tfs, 2), "train_only")));
	cr_assert_null(json_object_get(json_array_get(tfs, 0), "train_only"));
	json_t *fitted = json_object_get(json_array_get(tfs, 1), "fitted");
	cr_assert_eq(json_array_size(json_object_get(fitted, "mean")), 5);
	cr_assert_eq(json_array_size(json_object_get(fitted, "std")), 5);
	json_decref(pre);
	tr_model_desc_finish(&d);
	teardown(&f);
}

/* Replaces key's JSON text in meta by what edit makes of it. */
static void edit_key(json_t *meta, const char *key, void (*edit)(json_t *))
{
	json_t *v = json_loads(json_string_value(json_object_get(meta, key)), 0, NULL);
	cr_assert_not_null(v);
	edit(v);
	char *text = json_dumps(v, JSON_COMPACT);
	json_object_set_new(meta, key, json_string(text));
	free(text);
	json_decref(v);
}

static void short_mean(json_t *pre)
{
	json_t *mean = json_object_get(json_object_get(json_array_get(json_object_get(pre, "transforms"), 1), "fitted"),
				       "mean");
	json_array_remove(mean, 0);
}

static void bad_layer(json_t *model)
{
	json_object_set_new(json_array_get(json_object_get(model, "layers"), 0), "units", json_integer(-4));
}

Test(model_meta, bad_descriptions_are_named)
{
	struct fixture f;
	struct tr_model_desc d;
	struct tr_error err;
	build(&f);

	json_t *m = json_deep_copy(f.meta);
	json_object_del(m, "preprocessing");
	cr_assert_lt(tr_model_desc_from_meta(m, &d, &err), 0);
	cr_assert(strstr(err.message, "\"preprocessing\""), "%s", err.message);
	tr_model_desc_finish(&d);
	json_decref(m);

	m = json_deep_copy(f.meta);
	json_object_set_new(m, "trainerd_model_format", json_string("2"));
	cr_assert_lt(tr_model_desc_from_meta(m, &d, &err), 0);
	cr_assert(strstr(err.message, "trainerd_model_format 2"), "%s", err.message);
	tr_model_desc_finish(&d);
	json_decref(m);

	m = json_deep_copy(f.meta);
	edit_key(m, "preprocessing", short_mean);
	cr_assert_lt(tr_model_desc_from_meta(m, &d, &err), 0);
	cr_assert(strstr(err.message, "transforms/1: standardize needs \"fitted\": {\"mean\": [5 numbers]}"), "%s",
		  err.message);
	tr_model_desc_finish(&d);
	json_decref(m);

	m = json_deep_copy(f.meta);
	edit_key(m, "model", bad_layer);
	cr_assert_lt(tr_model_desc_from_meta(m, &d, &err), 0);
	cr_assert(strstr(err.message, "/model/layers/0/units"), "%s", err.message);
	tr_model_desc_finish(&d);
	json_decref(m);
	teardown(&f);
}

Test(eval_acc, classification_against_direct_computation)
{
	/* Three classes, four samples: argmax 0, 2, 1, 1 (a tie goes to the lower
	 * class, as numpy's argmax) against labels 0, 2, 2, 1. */
	const float z[] = {2, 1, 0, 0, 0, 3, 1, 4, 2, -1, 0.5f, 0.5f};
	const float y[] = {0, 2, 2, 1};
	struct tr_eval_acc a;
	struct tr_error err;
	cr_assert_eq(tr_eval_acc_init(&a, true, 3), 0);
	cr_assert_eq(tr_eval_acc_add(&a, 0, 2, z, y, &err), 0, "%s", err.message);
	cr_assert_eq(tr_eval_acc_add(&a, 2, 2, z + 6, y + 2, &err), 0, "%s", err.message);
	json_t *r = tr_eval_acc_json(&a, "test_");
	double want = 0;
	for (int i = 0; i < 4; i++) {
		double s = 0;
		for (int c = 0; c < 3; c++)
			s += exp(z[i * 3 + c]);
		want += log(s) - z[i * 3 + (int)y[i]];
	}
	want /= 4;
	cr_assert_float_eq(json_real_value(json_object_get(r, "test_loss")), want, 1e-12);
	cr_assert_float_eq(json_real_value(json_object_get(r, "test_accuracy")), 0.75, 1e-15);
	cr_assert_eq(json_integer_value(json_object_get(r, "samples")), 4);
	json_t *cm = json_object_get(r, "confusion_matrix");
	/* rows: true class; columns: predicted */
	const int want_cm[3][3] = {{1, 0, 0}, {0, 1, 0}, {0, 1, 1}};
	for (int i = 0; i < 3; i++)
		for (int j = 0; j < 3; j++)
			cr_assert_eq(json_integer_value(json_array_get(json_array_get(cm, i), j)), want_cm[i][j],
				     "cell %d,%d", i, j);
	json_decref(r);

	/* A label that is no class of the model names its sample. */
	const float bad[] = {3};
	cr_assert_lt(tr_eval_acc_add(&a, 7, 1, z, bad, &err), 0);
	cr_assert(strstr(err.message, "sample 7: label 3 is not a class of this model (0 to 2)"), "%s", err.message);
	tr_eval_acc_finish(&a);
}

Test(eval_acc, regression_against_direct_computation)
{
	/* Two outputs, five samples; targets far from 0 test the shifted sums. */
	const float p[] = {1000.5f, 1, 1001, 2, 999.5f, 2.5f, 1002, 4, 1000, 6};
	const float t[] = {1000, 1.5f, 1001.5f, 2, 999, 3, 1002.5f, 5, 1000, 5};
	struct tr_eval_acc a;
	struct tr_error err;
	cr_assert_eq(tr_eval_acc_init(&a, false, 2), 0);
	cr_assert_eq(tr_eval_acc_add(&a, 0, 5, p, t, &err), 0, "%s", err.message);
	json_t *r = tr_eval_acc_json(&a, NULL);
	double se = 0, ae = 0, r2 = 0;
	for (int c = 0; c < 2; c++) {
		double mean = 0, res = 0, tot = 0;
		for (int i = 0; i < 5; i++)
			mean += t[i * 2 + c] / 5.0;
		for (int i = 0; i < 5; i++) {
			double d = (double)p[i * 2 + c] - t[i * 2 + c];
			res += d * d;
			tot += (t[i * 2 + c] - mean) * (t[i * 2 + c] - mean);
			ae += fabs(d);
		}
		se += res;
		r2 += (1 - res / tot) / 2;
	}
	cr_assert_float_eq(json_real_value(json_object_get(r, "mse")), se / 10, 1e-12);
	cr_assert_float_eq(json_real_value(json_object_get(r, "loss")), se / 10, 1e-12);
	cr_assert_float_eq(json_real_value(json_object_get(r, "mae")), ae / 10, 1e-12);
	cr_assert_float_eq(json_real_value(json_object_get(r, "r2")), r2, 1e-9);
	cr_assert_null(json_object_get(r, "accuracy"));
	json_decref(r);
	tr_eval_acc_finish(&a);
}

/* Prediction inputs: every csv column a feature, npy without y, idx
 * without labels; label_dim 0.  Enough csv rows to grow the arrays twice
 * (a zero-width label array used to be freed by realloc, then again). */
Test(unlabeled, readers_without_labels)
{
	char dir[] = "/tmp/unlabeled-XXXXXX", path[128];
	struct tr_error err;
	cr_assert_not_null(mkdtemp(dir));
	snprintf(path, sizeof path, "%s/x.csv", dir);
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	for (int r = 0; r < 3000; r++)
		fprintf(f, "%d,%d.5,%d\n", r, r % 7, -r);
	cr_assert_eq(fclose(f), 0);
	struct tr_source_spec src = {.present = true, .format = TR_DATA_CSV, .path = path, .unlabeled = true};
	tr_reader_t *rd;
	cr_assert_eq(tr_reader_open(&src, 0, NULL, NULL, &rd, &err), 0, "%s", err.message);
	cr_assert_eq(rd->info.samples, 3000);
	cr_assert_eq(rd->info.features, 3);
	cr_assert_eq(rd->info.label_dim, 0);
	float x[3];
	cr_assert_eq(tr_reader_get(rd, 2999, x, NULL, &err), 0, "%s", err.message);
	cr_assert(x[0] == 2999 && x[1] == 3.5f && x[2] == -2999);
	tr_reader_destroy(rd);

	/* npy: an x file alone. */
	snprintf(path, sizeof path, "%s/x.npy", dir);
	f = fopen(path, "wb");
	cr_assert_not_null(f);
	char dict[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (5, 2), }";
	int hl = (int)strlen(dict), pad = (64 - (10 + hl + 1) % 64) % 64;
	unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hl + pad + 1), 0};
	fwrite(pre, 1, 10, f);
	fwrite(dict, 1, (size_t)hl, f);
	for (int i = 0; i < pad; i++)
		fputc(' ', f);
	fputc('\n', f);
	for (int i = 0; i < 10; i++) {
		float v = (float)i;
		fwrite(&v, sizeof v, 1, f);
	}
	cr_assert_eq(fclose(f), 0);
	struct tr_source_spec nsrc = {.present = true, .format = TR_DATA_NPY, .x_path = path, .unlabeled = true};
	cr_assert_eq(tr_reader_open(&nsrc, 0, NULL, NULL, &rd, &err), 0, "%s", err.message);
	cr_assert_eq(rd->info.samples, 5);
	cr_assert_eq(rd->info.label_dim, 0);
	cr_assert_eq(tr_reader_get(rd, 4, x, NULL, &err), 0, "%s", err.message);
	cr_assert(x[0] == 8 && x[1] == 9);
	tr_reader_destroy(rd);
	/* idx: an images file alone (3 images of 2x2 bytes). */
	snprintf(path, sizeof path, "%s/images-idx3-ubyte", dir);
	f = fopen(path, "wb");
	cr_assert_not_null(f);
	const unsigned char idx[] = {0, 0, 8, 3, 0, 0, 0, 3, 0, 0, 0, 2,  0,  0,
				     0, 2, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 255};
	fwrite(idx, 1, sizeof idx, f);
	cr_assert_eq(fclose(f), 0);
	struct tr_source_spec isrc = {.present = true, .format = TR_DATA_IDX, .images_path = path, .unlabeled = true};
	cr_assert_eq(tr_reader_open(&isrc, 0, NULL, NULL, &rd, &err), 0, "%s", err.message);
	cr_assert_eq(rd->info.samples, 3);
	cr_assert_eq(rd->info.features, 4);
	cr_assert_eq(rd->info.label_dim, 0);
	float px[4];
	cr_assert_eq(tr_reader_get(rd, 2, px, NULL, &err), 0, "%s", err.message);
	cr_assert(px[0] == 9 && px[3] == 255);
	tr_reader_destroy(rd);
	char cmd[160];
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	cr_assert_eq(system(cmd), 0);
}

/* A reader that names its classes (as an image folder reader does): the
 * names are recorded under labels.class_names and read back. */
static int named_get(tr_reader_t *r, int64_t i, float *x, float *y, struct tr_error *err)
{
	(void)r, (void)i, (void)err;
	memset(x, 0, 5 * sizeof(float));
	y[0] = 0;
	return 0;
}

static void named_destroy(tr_reader_t *r)
{
	(void)r;
}

static const char *named_class(tr_reader_t *r, int cls)
{
	(void)r;
	static const char *const names[] = {"cat", "dog", "bird, small"};
	return cls >= 0 && cls < 3 ? names[cls] : NULL;
}

Test(model_meta, class_names_from_the_reader)
{
	static const struct tr_reader_i named_i = {.get = named_get,
						   .destroy = named_destroy,
						   .class_name = named_class};
	tr_reader_t named = {.i = &named_i, .info = {.samples = 1, .features = 5, .label_dim = 1}, .name = "named"};
	struct tr_spec spec;
	struct tr_error serr;
	struct tr_error err;
	cr_assert_eq(tr_spec_parse_text(
			     "{\"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 3}]},"
			     " \"data\": {\"train\": {\"format\": \"csv\", \"path\": \"x.csv\"}},"
			     " \"batch_size\": 4, \"epochs\": 1, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}",
			     &spec, &serr),
		     0, "%s", serr.message);
	tr_model_t m;
	cr_assert_eq(tr_model_init(&m, &spec, 5, &err), 0, "%s", err.message);
	json_t *meta = json_object();
	cr_assert_eq(tr_model_meta_describe(meta, &spec, &m, NULL, &named, &err), 0, "%s", err.message);
	struct tr_model_desc d;
	cr_assert_eq(tr_model_desc_from_meta(meta, &d, &err), 0, "%s", err.message);
	cr_assert_not_null(d.class_names);
	cr_assert_str_eq(d.class_names[0], "cat");
	cr_assert_str_eq(d.class_names[2], "bird, small");
	cr_assert_null(d.transforms);
	tr_model_desc_finish(&d);
	json_decref(meta);
	tr_spec_finish(&spec);
}

/* ---- tr_infer_run ---------------------------------------------------------- */

struct collect {
	float *out; /* samples x outputs */
	int outputs;
	int64_t next; /* the first sample the next batch must start at */
	int label_dim;
};

static int collect_batch(void *ctx, int64_t first, int rows, const float *out, const float *labels, int label_dim)
{
	struct collect *c = ctx;
	cr_assert_eq(first, c->next, "batches come in sample order");
	cr_assert_eq(label_dim, c->label_dim);
	cr_assert(label_dim == 0 ? labels == NULL : labels != NULL);
	memcpy(c->out + (size_t)first * c->outputs, out, (size_t)rows * c->outputs * sizeof(float));
	c->next = first + rows;
	return 0;
}

static void infer_all(struct fixture *f, const float *params, tr_backend_t *be, int devices, int batch, int workers,
		      const tr_transforms_t *tf, float *out)
{
	struct collect c = {.out = out, .outputs = f->model.outputs, .label_dim = 1};
	struct tr_infer_options o = {.model = &f->model,
				     .params = params,
				     .backend = be,
				     .count = devices,
				     .reader = f->train,
				     .transforms = tf,
				     .batch = batch,
				     .workers = workers,
				     .on_batch = collect_batch,
				     .ctx = &c};
	struct tr_error err;
	cr_assert_eq(tr_infer_run(&o, &err), 0, "%s", err.message);
	cr_assert_eq(c.next, f->train->info.samples);
}

Test(infer, devices_batches_and_a_direct_forward_agree, .timeout = 60)
{
	struct fixture f;
	build(&f);
	const tr_model_t *m = &f.model;
	int64_t n = f.train->info.samples;
	float *params = malloc(m->n_params * sizeof(float));
	tr_model_init_params(m, params);
	tr_backend_t *be = tr_cpu_backend_create(3, 0);
	cr_assert_not_null(be);
	float *a = malloc((size_t)n * m->outputs * sizeof(float)), *b = malloc((size_t)n * m->outputs * sizeof(float));
	infer_all(&f, params, be, 1, 64, 1, f.tf, a);
	infer_all(&f, params, be, 3, 50, 3, f.tf, b);
	/* A direct forward in double: dense 5->8, relu, dropout (identity),
	 * dense 8->3, on the transformed inputs (noise skipped at inference). */
	struct tr_param_view w1, b1, w2, b2;
	tr_model_param_view(m, 0, &w1);
	tr_model_param_view(m, 1, &b1);
	tr_model_param_view(m, 2, &w2);
	tr_model_param_view(m, 3, &b2);
	struct tr_error err;
	for (int64_t i = 0; i < n; i++) {
		float x[5], y[1];
		cr_assert_eq(tr_reader_get(f.train, i, x, y, &err), 0);
		tr_transforms_apply(f.tf, x, 5, 3, 0, i, 0);
		double h[8], o[3];
		for (int u = 0; u < 8; u++) {
			h[u] = params[b1.offset + u];
			for (int k = 0; k < 5; k++)
				h[u] += (double)params[w1.offset + u * 5 + k] * x[k];
			h[u] = h[u] > 0 ? h[u] : 0;
		}
		for (int u = 0; u < 3; u++) {
			o[u] = params[b2.offset + u];
			for (int k = 0; k < 8; k++)
				o[u] += (double)params[w2.offset + u * 8 + k] * h[k];
			cr_assert(fabs(a[i * 3 + u] - o[u]) < 1e-4, "sample %lld output %d: %g vs %g", (long long)i, u,
				  a[i * 3 + u], o[u]);
			cr_assert(fabs(a[i * 3 + u] - b[i * 3 + u]) < 1e-5, "1 vs 3 devices differ at %lld",
				  (long long)i);
		}
	}
	/* A feature count the model does not take is refused, naming both. */
	tr_model_t wide = f.model;
	wide.inputs = 6;
	struct collect c = {.out = a, .outputs = 3, .label_dim = 1};
	struct tr_infer_options o = {.model = &wide,
				     .params = params,
				     .backend = be,
				     .reader = f.train,
				     .on_batch = collect_batch,
				     .ctx = &c};
	struct tr_error msg;
	cr_assert_eq(tr_infer_run(&o, &msg), -EINVAL);
	cr_assert(strstr(msg.message, "synthetic: 5 features per sample, the model takes 6"), "%s", msg.message);
	tr_backend_destroy(be);
	free(a);
	free(b);
	free(params);
	teardown(&f);
}

/* data.test: a source like validation, in the normalized spec, and a
 * synthetic one must match the train source. */
Test(spec_test_source, parsed_normalized_and_checked)
{
	struct tr_spec spec;
	struct tr_error serr;
	const char *fmt =
		"{\"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 3}]},"
		" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 50, \"features\": 4, \"classes\": 3},"
		"          \"test\": {\"format\": \"synthetic\", \"samples\": 20, \"features\": 4, \"classes\": %d}},"
		" \"batch_size\": 8, \"epochs\": 1, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}";
	char text[1024];
	snprintf(text, sizeof text, fmt, 3);
	cr_assert_eq(tr_spec_parse_text(text, &spec, &serr), 0, "%s", serr.message);
	cr_assert(spec.test.present);
	cr_assert_eq(spec.test.samples, 20);
	json_t *j = tr_spec_to_json(&spec);
	cr_assert_eq(json_integer_value(
			     json_object_get(json_object_get(json_object_get(j, "data"), "test"), "samples")),
		     20);
	json_decref(j);
	tr_spec_finish(&spec);
	snprintf(text, sizeof text, fmt, 4);
	cr_assert_lt(tr_spec_parse_text(text, &spec, &serr), 0);
	cr_assert_str_eq(serr.pointer, "/data/test/classes");
	cr_assert(strstr(serr.message, "must match the train source"), "%s", serr.message);
}
