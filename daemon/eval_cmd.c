/* `trainerd eval MODEL DATA_SPEC` and `trainerd predict MODEL INPUT`.
 *
 * Both read a model file (model.safetensors or a checkpoint) with its
 * self-description (docs/model-format.md), apply the preprocessing it
 * records, and run the data through tr_infer_run: batched, loaders in the
 * background, the batch split across the chosen devices.  eval prints the
 * figures (tr_eval_acc) as text or, with --json, as one JSON object;
 * predict writes one row per input sample, CSV with a header row or .npy.
 * Exit status: 0 done, 1 a run-time failure (a device, a write), 2 bad
 * command line, model file or data (a missing file, a wrong feature
 * count, a bad label).
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/backend_open.h"
#include "daemon/cli.h"
#include "engine/backend.h"
#include "engine/infer.h"
#include "engine/model_meta.h"

struct common_opts {
	const char *cmd;
	const char *model, *input, *out, *format, *backend;
	int devices, workers, batch, tile;
	bool json, header, quiet, degrade;
};

static int parse_int(const char *cmd, const char *flag, const char *v, int lo, int hi, int *out)
{
	char *end;
	long n = v ? strtol(v, &end, 10) : 0;
	if (!v || *end || n < lo || n > hi) {
		fprintf(stderr, "trainerd %s: %s needs an integer in [%d, %d], got '%s'\n", cmd, flag, lo, hi,
			v ? v : "");
		return -1;
	}
	*out = (int)n;
	return 0;
}

/* Returns 0 parsed, 1 --help shown, -1 a usage error (printed). */
static int parse_opts(int argc, char **argv, struct common_opts *o, void (*help)(FILE *))
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			help(stdout);
			return 1;
		} else if (strcmp(a, "--devices") == 0) {
			if (parse_int(o->cmd, a, v, 1, 64, &o->devices) < 0)
				return -1;
			i++;
		} else if (strcmp(a, "--workers") == 0) {
			if (parse_int(o->cmd, a, v, 1, 64, &o->workers) < 0)
				return -1;
			i++;
		} else if (strcmp(a, "--batch") == 0) {
			if (parse_int(o->cmd, a, v, 1, 1 << 20, &o->batch) < 0)
				return -1;
			i++;
		} else if (strcmp(a, "--backend") == 0 && v) {
			o->backend = v;
			i++;
		} else if (strcmp(a, "--out") == 0 && v && strcmp(o->cmd, "predict") == 0) {
			o->out = v;
			i++;
		} else if (strcmp(a, "--format") == 0 && v && strcmp(o->cmd, "predict") == 0) {
			o->format = v;
			i++;
		} else if (strcmp(a, "--tile") == 0 && strcmp(o->cmd, "predict") == 0) {
			if (parse_int(o->cmd, a, v, 16, 8192, &o->tile) < 0)
				return -1;
			i++;
		} else if (strcmp(a, "--degrade") == 0 && strcmp(o->cmd, "predict") == 0) {
			o->degrade = true;
		} else if (strcmp(a, "--header") == 0 && strcmp(o->cmd, "predict") == 0) {
			o->header = true;
		} else if (strcmp(a, "--json") == 0 && strcmp(o->cmd, "eval") == 0) {
			o->json = true;
		} else if (strcmp(a, "--quiet") == 0 || strcmp(a, "-q") == 0) {
			o->quiet = true;
		} else if (a[0] == '-' && a[1] != '\0') {
			fprintf(stderr, "trainerd %s: unexpected argument '%s' (trainerd %s --help)\n", o->cmd, a,
				o->cmd);
			return -1;
		} else if (!o->model) {
			o->model = a;
		} else if (!o->input) {
			o->input = a;
		} else {
			fprintf(stderr, "trainerd %s: unexpected argument '%s'\n", o->cmd, a);
			return -1;
		}
	}
	if (!o->model || !o->input) {
		help(stderr);
		return -1;
	}
	return 0;
}

/* The devices as `trainerd run` and the daemon open them
 * (tr_daemon_backend_open): a GPU when there is one (or --backend cuda
 * insists), else CPU devices, --devices of them or one per core up to the
 * CPU backend's cap, with the same warning when a GPU was wanted and
 * none is usable.  --devices counts CPU devices only, so it is the CPU
 * count and not a GPU limit. */
static tr_backend_t *make_backend(const struct common_opts *o)
{
	struct tr_error err = {0};
	struct tr_backend_options bopt = {
		.kind = TR_BACKEND_KIND_AUTO,
		.cpu_devices = o->devices,
		.cpu_conv = TR_CPU_CONV_AUTO,
	};
	if (o->backend && (strcmp(o->backend, "auto") == 0 || tr_backend_kind_parse(o->backend, &bopt.kind) < 0)) {
		fprintf(stderr, "trainerd %s: --backend must be cpu or cuda, got '%s'\n", o->cmd, o->backend);
		return NULL;
	}
	tr_backend_t *be = tr_daemon_backend_open(&bopt, o->quiet, NULL, 0, &err);
	if (!be)
		fprintf(stderr, "trainerd %s: %s\n", o->cmd, err.message);
	return be;
}

static int load_model(const struct common_opts *o, struct tr_model_desc *d)
{
	struct tr_error err;
	if (tr_model_desc_load(o->model, d, &err) < 0) {
		fprintf(stderr, "trainerd %s: %s: %s\n", o->cmd, o->model, err.message);
		return -1;
	}
	return 0;
}

/* ---- eval ---------------------------------------------------------------- */

static void eval_help(FILE *out)
{
	fputs("usage: trainerd eval MODEL DATA_SPEC [--json] [--devices N] [--backend cpu|cuda]\n"
	      "                     [--workers W] [--batch B]\n",
	      out);
	if (out != stdout)
		return;
	fputs("\n"
	      "Evaluates MODEL (a model.safetensors or checkpoint written by trainerd) on\n"
	      "labelled data, applying the preprocessing the model records.  DATA_SPEC is a\n"
	      "data source as in a job's data.train, given inline as JSON or as a file\n"
	      "holding it:\n"
	      "  '{\"format\": \"csv\", \"path\": \"test.csv\", \"label\": -1}'\n"
	      "  '{\"format\": \"npy\", \"x\": \"x.npy\", \"y\": \"y.npy\"}'\n"
	      "  '{\"format\": \"idx\", \"images\": \"t10k-images-idx3-ubyte.gz\", \"labels\": ...}'\n"
	      "  '{\"format\": \"images\", \"path\": \"test/\", \"labels\": \"folders\"}'\n"
	      "An image folder's class subfolders must carry the class names the model\n"
	      "recorded, in the same order; every image must come out as the model's\n"
	      "[C, H, W] after the source's resize and center_crop (by default the\n"
	      "ones the model was trained with).  A patches source must have the model's\n"
	      "degrade and response; image files need the pixels a model file records.\n"
	      "Prints loss, accuracy and the confusion matrix (rows: true class, columns:\n"
	      "predicted) for a classifier; loss (= mse), mse, mae and r2 for regression.\n"
	      "\n"
	      "  --json             one JSON object: {\"samples\", \"loss\", \"accuracy\",\n"
	      "                     \"confusion_matrix\"} or {\"samples\", \"loss\", \"mse\", \"mae\", \"r2\"}\n"
	      "  --devices N        CPU devices (default: one per core, at most 64)\n"
	      "  --backend cpu|cuda default: a GPU when there is one\n"
	      "  --workers W        data loader threads (default 2)\n"
	      "  --batch B          samples per batch (default 256)\n"
	      "\n"
	      "Relative paths resolve against the working directory.\n"
	      "Exit status: 0 done, 1 a run-time failure, 2 bad command line, model or data.\n",
	      out);
}

/* Parses a data spec (inline JSON or a file) through the job spec parser,
 * as data.train of a job with the model's own section, so it is checked
 * exactly as a job's is.  Errors name the pointer inside the data spec. */
static int parse_source(const struct common_opts *o, const struct tr_model_desc *d, struct tr_spec *spec)
{
	json_error_t jerr;
	const char *text = o->input;
	while (*text == ' ' || *text == '\t' || *text == '\n')
		text++;
	json_t *src = *text == '{' ? json_loads(text, 0, &jerr) : json_load_file(o->input, 0, &jerr);
	if (!src) {
		if (*text == '{')
			fprintf(stderr, "trainerd %s: DATA_SPEC: column %d: %s\n", o->cmd, jerr.column, jerr.text);
		else
			fprintf(stderr, "trainerd %s: DATA_SPEC %s: %s\n", o->cmd, o->input,
				jerr.line > 0 ? jerr.text : "no such file or not readable");
		return -1;
	}
	struct tr_error serr;
	int rc = tr_model_source_parse(NULL, d, src, spec, &serr);
	if (rc < 0)
		fprintf(stderr, "trainerd %s: DATA_SPEC: %s%s\n", o->cmd, serr.message[0] == ':' ? "(the source)" : "",
			serr.message);
	json_decref(src);
	return rc < 0 ? -1 : 0;
}

struct eval_ctx {
	const struct tr_model_desc *d;
	struct tr_eval_acc acc;
	char err[768]; /* a struct tr_error message fits */
};

static int eval_batch(void *ctx, int64_t first, int rows, const float *out, const float *labels, int label_dim)
{
	struct eval_ctx *e = ctx;
	if (!labels || label_dim != (e->acc.classification ? 1 : e->acc.outputs)) {
		snprintf(e->err, sizeof e->err, "the data has %d label column(s), the model needs %d", label_dim,
			 e->acc.classification ? 1 : e->acc.outputs);
		return -EINVAL;
	}
	struct tr_error why;
	int rc = tr_eval_acc_add(&e->acc, first, rows, out, labels, &why);
	if (rc < 0)
		snprintf(e->err, sizeof e->err, "%s", why.message);
	return rc;
}

static void print_text(const struct tr_model_desc *d, const json_t *r)
{
	printf("samples   %lld\n", (long long)json_integer_value(json_object_get(r, "samples")));
	const char *keys[] = {"loss", "accuracy", "mse", "mae", "r2"};
	for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
		const json_t *v = json_object_get(r, keys[i]);
		if (json_is_number(v))
			printf("%-9s %.6f\n", keys[i], json_number_value(v));
		else if (json_is_null(v))
			printf("%-9s n/a (a constant target)\n", keys[i]);
	}
	const json_t *cm = json_object_get(r, "confusion_matrix");
	if (!cm)
		return;
	printf("confusion matrix (rows: true class, columns: predicted)\n%8s", "");
	for (size_t j = 0; j < json_array_size(cm); j++)
		printf(" %7zu", j);
	printf("\n");
	for (size_t i = 0; i < json_array_size(cm); i++) {
		const char *name = d->class_names ? d->class_names[i] : NULL;
		if (name)
			printf("%8.8s", name);
		else
			printf("%8zu", i);
		const json_t *row = json_array_get(cm, i);
		for (size_t j = 0; j < json_array_size(row); j++)
			printf(" %7lld", (long long)json_integer_value(json_array_get(row, j)));
		printf("\n");
	}
}

/* Opens the data and runs the model over it; shared by eval and predict.
 * Returns the exit status. */
static int run_model(const struct common_opts *o, struct tr_model_desc *d, const struct tr_source_spec *src,
		     int (*on_batch)(void *, int64_t, int, const float *, const float *, int), void *ctx,
		     const char *cb_err, tr_reader_t **reader_out, int (*before)(void *, tr_reader_t *))
{
	struct tr_error err;
	tr_reader_t *rd = NULL;
	int rc = tr_reader_open(src, d->spec.seed, NULL, NULL, &rd, &err);
	if (rc < 0) {
		fprintf(stderr, "trainerd %s: %s\n", o->cmd, err.message);
		return 2;
	}
	if (rd->info.features != d->model.inputs) {
		fprintf(stderr, "trainerd %s: %s: %d features per sample, the model takes %d\n", o->cmd, rd->name,
			rd->info.features, d->model.inputs);
		tr_reader_destroy(rd);
		return 2;
	}
	if (before && (rc = before(ctx, rd)) != 0) {
		tr_reader_destroy(rd);
		return rc;
	}
	tr_backend_t *be = make_backend(o);
	if (!be) {
		tr_reader_destroy(rd);
		return o->backend ? 2 : 1;
	}
	struct tr_infer_options io = {
		.model = &d->model,
		.params = d->params,
		.backend = be,
		.count = o->devices,
		.reader = rd,
		.transforms = d->transforms,
		.batch = o->batch,
		.workers = o->workers,
		.on_batch = on_batch,
		.ctx = ctx,
	};
	rc = tr_infer_run(&io, &err);
	int status = 0;
	if (rc == -EINVAL && cb_err[0]) {
		fprintf(stderr, "trainerd %s: %s: %s\n", o->cmd, rd->name, cb_err);
		status = 2;
	} else if (rc != 0) {
		fprintf(stderr, "trainerd %s: %s\n", o->cmd, cb_err[0] ? cb_err : err.message);
		status = rc == -EINVAL ? 2 : 1;
	}
	tr_backend_destroy(be);
	if (reader_out && status == 0)
		*reader_out = rd;
	else
		tr_reader_destroy(rd);
	return status;
}

/* An image folder's class k must be the model's class k. */
static int eval_check_classes(void *ctx, tr_reader_t *rd)
{
	struct tr_error err;
	if (tr_model_desc_check_classes(((struct eval_ctx *)ctx)->d, rd, &err) == 0)
		return 0;
	fprintf(stderr, "trainerd eval: %s: %s\n", rd->name, err.message);
	return 2;
}

int tr_cmd_eval(int argc, char **argv)
{
	struct common_opts o = {.cmd = "eval"};
	int rc = parse_opts(argc, argv, &o, eval_help);
	if (rc != 0)
		return rc > 0 ? 0 : 2;
	struct tr_model_desc d;
	if (load_model(&o, &d) < 0) {
		tr_model_desc_finish(&d);
		return 2;
	}
	struct tr_spec spec;
	if (parse_source(&o, &d, &spec) < 0) {
		tr_model_desc_finish(&d);
		return 2;
	}
	struct eval_ctx e = {.d = &d, .err = ""};
	struct tr_error serr;
	int status = 2;
	if (tr_model_desc_source(&d, &spec.train, &serr) < 0) {
		fprintf(stderr, "trainerd eval: %s%s\n", serr.message[0] == '/' ? "DATA_SPEC: " : "", serr.message);
		goto out;
	}
	status = 1;
	if (tr_eval_acc_init(&e.acc, d.classification, d.outputs) < 0) {
		fprintf(stderr, "trainerd eval: out of memory\n");
		goto out;
	}
	status = run_model(&o, &d, &spec.train, eval_batch, &e, e.err, NULL, eval_check_classes);
	if (status == 0) {
		json_t *r = tr_eval_acc_json(&e.acc, NULL);
		if (o.json) {
			json_dumpf(r, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER);
			printf("\n");
		} else {
			print_text(&d, r);
		}
		json_decref(r);
		if (fflush(stdout) != 0)
			status = 1;
	}
out:
	tr_eval_acc_finish(&e.acc);
	tr_spec_finish(&spec);
	tr_model_desc_finish(&d);
	return status;
}

/* ---- predict ------------------------------------------------------------- */

static void predict_help(FILE *out)
{
	fputs("usage: trainerd predict MODEL INPUT --out FILE [--format csv|npy|idx|images] [--header]\n"
	      "                        [--devices N] [--backend cpu|cuda] [--workers W] [--batch B]\n"
	      "       trainerd predict MODEL IMAGES --out DIR/ [--format png|npy] [--degrade] [--tile T]\n",
	      out);
	if (out != stdout)
		return;
	fputs("\n"
	      "Runs MODEL (a model.safetensors or checkpoint written by trainerd) on INPUT,\n"
	      "inputs without labels, applying the preprocessing the model records, and\n"
	      "writes one row per sample to FILE.\n"
	      "\n"
	      "INPUT, by its extension or --format:\n"
	      "  .csv      every column a feature (--header: skip the first line)\n"
	      "  .npy      an array of N samples (N x features, or N x C x H x W)\n"
	      "  idx       an IDX images file (MNIST's format, .gz accepted)\n"
	      "  images    a folder (the default for a directory) of PNG/JPEG files, in\n"
	      "            sorted name order, or of class subfolders holding them (the\n"
	      "            labels are ignored); the resize and center_crop the model was\n"
	      "            trained with apply, and every image must come out as the\n"
	      "            model's [C, H, W]\n"
	      "FILE, by its extension:\n"
	      "  .csv      a header row, then per sample: for a classifier the predicted class\n"
	      "            and one probability per class (class,prob_0,prob_1,...); for\n"
	      "            regression the outputs (output_0,output_1,...); probabilities are\n"
	      "            named by class (prob_cat,...) when the model recorded class names;\n"
	      "            for an image folder a first column \"file\" holds each image's path\n"
	      "            under the folder\n"
	      "  .npy      the same table as float32, N x (1 + classes) or N x outputs\n"
	      "  DIR/      for an image-to-image model (trained on patches, fully\n"
	      "            convolutional): IMAGES is a folder of PNG/JPEG files or one\n"
	      "            file, run whole (in tiles) whatever their size; one output\n"
	      "            image per input, of the same name (.png) and size, the residual\n"
	      "            added back, rounded and clipped to 8 bits; --format npy writes\n"
	      "            float32 [C, H, W] arrays on the model's scale instead\n"
	      "  --degrade          DIR/: degrade each image as the model's training inputs\n"
	      "                     were first (the recorded downscale or noise)\n"
	      "  --tile T           DIR/: tile side in pixels, overlap included (default 128)\n"
	      "\n"
	      "  --devices N        CPU devices (default: one per core, at most 64)\n"
	      "  --backend cpu|cuda default: a GPU when there is one\n"
	      "  --workers W        data loader threads (default 2)\n"
	      "  --batch B          samples per batch (default 256)\n"
	      "\n"
	      "Exit status: 0 done, 1 a run-time failure, 2 bad command line, model or input.\n",
	      out);
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);
	return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* One CSV field, quoted (RFC 4180) when it holds a comma, a quote or a
 * line break: file and class names are a person's. */
static int write_csv_field(FILE *f, const char *s)
{
	if (!strpbrk(s, ",\"\r\n"))
		return fputs(s, f) < 0 ? -1 : 0;
	if (fputc('"', f) == EOF)
		return -1;
	for (; *s; s++)
		if ((*s == '"' && fputc('"', f) == EOF) || fputc(*s, f) == EOF)
			return -1;
	return fputc('"', f) == EOF ? -1 : 0;
}

struct predict_ctx {
	const struct tr_model_desc *d;
	tr_reader_t *rd; /* set by predict_begin */
	bool names;      /* a first column with each sample's name */
	FILE *f;
	bool npy;
	int cols;
	float *row; /* cols floats */
	char err[512];
};

static int predict_batch(void *ctx, int64_t first, int rows, const float *out, const float *labels, int label_dim)
{
	(void)labels;
	(void)label_dim;
	struct predict_ctx *p = ctx;
	const int K = p->d->outputs;
	for (int r = 0; r < rows; r++) {
		if (p->names) {
			char name[4096];
			if (p->rd->i->sample_name(p->rd, first + r, name, sizeof name) < 0)
				name[0] = '\0';
			if (write_csv_field(p->f, name) < 0 || fputc(',', p->f) == EOF)
				goto fail;
		}
		const float *z = out + (size_t)r * K;
		if (p->d->classification) {
			int arg = 0;
			for (int c = 1; c < K; c++)
				if (z[c] > z[arg])
					arg = c;
			double sum = 0.0;
			for (int c = 0; c < K; c++)
				sum += exp((double)z[c] - (double)z[arg]);
			p->row[0] = (float)arg;
			for (int c = 0; c < K; c++)
				p->row[1 + c] = (float)(exp((double)z[c] - (double)z[arg]) / sum);
		} else {
			memcpy(p->row, z, (size_t)K * sizeof(float));
		}
		if (p->npy) {
			if (fwrite(p->row, sizeof(float), (size_t)p->cols, p->f) != (size_t)p->cols)
				goto fail;
			continue;
		}
		int c0 = 0;
		if (p->d->classification) {
			if (fprintf(p->f, "%d", (int)p->row[0]) < 0)
				goto fail;
			c0 = 1;
		}
		for (int c = c0; c < p->cols; c++)
			if (fprintf(p->f, c ? ",%.9g" : "%.9g", (double)p->row[c]) < 0)
				goto fail;
		if (fputc('\n', p->f) == EOF)
			goto fail;
	}
	return 0;
fail:
	snprintf(p->err, sizeof p->err, "writing the predictions failed: %s", strerror(errno));
	return -EIO;
}

int tr_npy_write_header(FILE *f, const int64_t *shape, int ndim)
{
	char dict[192], dims[128] = "";
	size_t used = 0;
	for (int i = 0; i < ndim && used < sizeof dims; i++)
		used += (size_t)snprintf(dims + used, sizeof dims - used, "%lld, ", (long long)shape[i]);
	if (ndim > 1 && used >= 2) /* "(3, 4)": the trailing comma only for one dimension */
		dims[used - 2] = '\0';
	int n = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }", dims);
	size_t total = 10 + (size_t)n + 1, pad = (64 - total % 64) % 64;
	uint16_t hlen = (uint16_t)((size_t)n + pad + 1);
	unsigned char pre[10] = {
		0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff), (unsigned char)(hlen >> 8)};
	if (fwrite(pre, 1, sizeof pre, f) != sizeof pre || fwrite(dict, 1, (size_t)n, f) != (size_t)n)
		return -1;
	for (size_t i = 0; i < pad; i++)
		if (fputc(' ', f) == EOF)
			return -1;
	return fputc('\n', f) == EOF ? -1 : 0;
}

/* Once the input is open (its sample count known): the output's header. */
static int predict_begin(void *ctx, tr_reader_t *rd)
{
	struct predict_ctx *p = ctx;
	const struct tr_model_desc *d = p->d;
	p->rd = rd;
	if (p->npy) {
		int64_t shape[2] = {rd->info.samples, p->cols};
		return tr_npy_write_header(p->f, shape, 2) < 0 ? 1 : 0;
	}
	p->names = rd->i->sample_name != NULL;
	int ok = !p->names || fputs("file,", p->f) >= 0;
	if (d->classification) {
		ok = ok && fputs("class", p->f) >= 0;
		for (int c = 0; ok && c < d->outputs; c++) {
			char h[512];
			if (d->class_names && d->class_names[c][0])
				snprintf(h, sizeof h, "prob_%s", d->class_names[c]);
			else
				snprintf(h, sizeof h, "prob_%d", c);
			ok = fputc(',', p->f) != EOF && write_csv_field(p->f, h) == 0;
		}
	} else {
		for (int c = 0; ok && c < d->outputs; c++)
			ok = fprintf(p->f, c ? ",output_%d" : "output_%d", c) >= 0;
	}
	ok = ok && fputc('\n', p->f) != EOF;
	return ok ? 0 : 1;
}

/* --out DIR/: an image-to-image model's outputs as images
 * (predict_images.c). */
static int predict_to_dir(const struct common_opts *o)
{
	bool npy = o->format && strcmp(o->format, "npy") == 0;
	if (o->format && !npy && strcmp(o->format, "png") != 0) {
		fprintf(stderr,
			"trainerd predict: with --out DIR/, --format is the outputs' format: png or npy, got '%s'\n",
			o->format);
		return 2;
	}
	struct stat st;
	if (stat(o->input, &st) < 0) {
		fprintf(stderr, "trainerd predict: %s: %s\n", o->input, strerror(errno));
		return 2;
	}
	struct tr_model_desc d;
	struct tr_error err;
	int status = 2;
	if (load_model(o, &d) < 0)
		goto out;
	if (tr_model_desc_need_pixels(&d, &err) < 0) {
		fprintf(stderr, "trainerd predict: %s: %s\n", o->model, err.message);
		goto out;
	}
	if (!d.pixels.image_to_image) {
		fprintf(stderr, "trainerd predict: --out DIR/ writes images, and the model's outputs are not images "
				"(it was not trained on patches): use --out FILE.csv or FILE.npy\n");
		goto out;
	}
	if (!d.free_hw) {
		fprintf(stderr,
			"trainerd predict: the model is not fully convolutional (a layer or transform needs "
			"its [%d, %d, %d] input), so it does not run on whole images\n",
			d.model.in_shape.d[0], d.model.in_shape.d[1], d.model.in_shape.d[2]);
		goto out;
	}
	/* A folder of images, or one image file in its folder. */
	char dir[4096], file[4096];
	bool one = !S_ISDIR(st.st_mode);
	snprintf(dir, sizeof dir, "%s", o->input);
	if (one) {
		char *slash = strrchr(dir, '/');
		snprintf(file, sizeof file, "%s", slash ? slash + 1 : dir);
		if (slash)
			slash[slash == dir] = '\0'; /* "/x.png" is "x.png" in "/" */
		else
			snprintf(dir, sizeof dir, ".");
	}
	tr_backend_t *be = make_backend(o);
	if (!be) {
		status = o->backend ? 2 : 1;
		goto out;
	}
	struct tr_predict_images pi = {
		.desc = &d,
		.backend = be,
		.devices = o->devices,
		.tile = o->tile,
		.batch = o->batch,
		.workers = o->workers,
		.in_dir = dir,
		.one_file = one ? file : NULL,
		.out_dir = o->out,
		.npy = npy,
		.degrade = o->degrade,
	};
	status = tr_predict_images_run(&pi);
	tr_backend_destroy(be);
out:
	tr_model_desc_finish(&d);
	return status;
}

int tr_cmd_predict(int argc, char **argv)
{
	struct common_opts o = {.cmd = "predict"};
	int rc = parse_opts(argc, argv, &o, predict_help);
	if (rc != 0)
		return rc > 0 ? 0 : 2;
	if (!o.out) {
		fprintf(stderr, "trainerd predict: --out FILE is required (.csv or .npy; DIR/ for image outputs)\n");
		return 2;
	}
	struct stat st;
	if (ends_with(o.out, "/") || (stat(o.out, &st) == 0 && S_ISDIR(st.st_mode)))
		return predict_to_dir(&o);
	if (o.degrade || o.tile) {
		fprintf(stderr, "trainerd predict: --degrade and --tile are for image outputs (--out DIR/)\n");
		return 2;
	}
	bool npy_out = ends_with(o.out, ".npy");
	if (!npy_out && !ends_with(o.out, ".csv")) {
		fprintf(stderr, "trainerd predict: --out %s: the name must end in .csv or .npy\n", o.out);
		return 2;
	}
	struct tr_source_spec src = {.present = true, .unlabeled = true, .header = o.header};
	const char *fmt = o.format;
	if (!fmt) {
		if (stat(o.input, &st) == 0 && S_ISDIR(st.st_mode))
			fmt = "images";
		else if (ends_with(o.input, ".csv"))
			fmt = "csv";
		else if (ends_with(o.input, ".npy"))
			fmt = "npy";
		else
			fmt = "idx";
	}
	if (strcmp(fmt, "csv") == 0) {
		src.format = TR_DATA_CSV;
		src.path = (char *)o.input;
	} else if (strcmp(fmt, "npy") == 0) {
		src.format = TR_DATA_NPY;
		src.x_path = (char *)o.input;
	} else if (strcmp(fmt, "idx") == 0) {
		src.format = TR_DATA_IDX;
		src.images_path = (char *)o.input;
	} else if (strcmp(fmt, "images") == 0) {
		/* A flat folder of images or one with class subfolders
		 * (labels dropped), in sorted name order (docs/design.md). */
		src.format = TR_DATA_IMAGES;
		src.path = (char *)o.input;
	} else {
		fprintf(stderr, "trainerd predict: --format must be csv, npy, idx or images, got '%s'\n", fmt);
		return 2;
	}
	struct tr_model_desc d;
	if (load_model(&o, &d) < 0) {
		tr_model_desc_finish(&d);
		return 2;
	}
	struct tr_error serr;
	struct predict_ctx p = {.d = &d, .npy = npy_out, .err = ""};
	int status = 2;
	if (tr_model_desc_source(&d, &src, &serr) < 0) {
		fprintf(stderr, "trainerd predict: %s: %s\n", o.model, serr.message);
		goto out;
	}
	if (d.pixels.image_to_image && d.free_hw) {
		fprintf(stderr, "trainerd predict: the model's outputs are images: write them with --out DIR/ (one PNG "
				"per input image; --format npy for floats)\n");
		goto out;
	}
	p.cols = d.classification ? 1 + d.outputs : d.outputs;
	p.row = malloc((size_t)p.cols * sizeof(float));
	/* A temporary name, renamed once complete: a failed run leaves no
	 * half-written predictions under the name asked for. */
	char tmp[4096];
	snprintf(tmp, sizeof tmp, "%s.tmp", o.out);
	p.f = p.row ? fopen(tmp, "wb") : NULL;
	if (!p.f) {
		fprintf(stderr, "trainerd predict: --out %s: %s\n", o.out, strerror(errno));
		status = 2;
		goto out;
	}
	status = run_model(&o, &d, &src, predict_batch, &p, p.err, NULL, predict_begin);
	if (fclose(p.f) != 0 && status == 0) {
		fprintf(stderr, "trainerd predict: %s: %s\n", o.out, strerror(errno));
		status = 1;
	}
	if (status == 0 && rename(tmp, o.out) < 0) {
		fprintf(stderr, "trainerd predict: %s: %s\n", o.out, strerror(errno));
		status = 1;
	}
	if (status != 0)
		unlink(tmp);
out:
	free(p.row);
	tr_model_desc_finish(&d);
	return status;
}
