/* The job spec: parsing, validation and the normalized form.
 *
 * A spec arrives as JSON (docs/design.md §5).  tr_spec_parse checks every field
 * and, on the first problem, fills the caller's struct tr_error (core/error.h)
 * with the JSON pointer of the offending value and a message
 * ("/optimizer/lr: must be > 0"; the message starts with the pointer).  Unknown
 * keys are errors.  The parsed struct owns all its strings; free it with
 * tr_spec_finish.  Paths are stored as written; resolving them against data
 * roots is the caller's job (tr_spec_resolve_paths).
 */
#ifndef TR_SPEC_H
#define TR_SPEC_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"
#include "engine/comm.h"

#define TR_SPEC_MAX_LAYERS 64
#define TR_SPEC_MAX_TRANSFORMS 16
#define TR_SPEC_MAX_MONITORS 32
#define TR_SPEC_MAX_DEVICES 64
/* Virtual shards of a step in exact mode ("exact": {"shards": S}, or
 * true for the default count); each device keeps one gradient buffer per
 * shard it computes. */
#define TR_SPEC_MAX_SHARDS 64
#define TR_SPEC_DEFAULT_SHARDS 8
#define TR_SPEC_DEFAULT_MAX_RESTARTS 2
#define TR_SPEC_MAX_RESTARTS 100
#define TR_SPEC_MAX_LABEL_COLS 64

/* Upper bounds on every size in a spec, so that no index, product or
 * memory estimate the engine forms from them can overflow, and no set-up
 * loop runs unbounded (docs/design.md, "Bounds on a spec").  A larger value
 * is refused at submit with its JSON pointer.
 *   samples x epochs <= 2^60 and max_steps x batch_size <= 2^60: sample
 *     positions and step counts stay far inside int64, and steps inside the
 *     metric store's +-2^62;
 *   widths (features, inputs, units, classes, outputs) <= 2^24: labels are
 *     floats, exact integers only up to 2^24, and a layer's weight count
 *     (<= 2^48) times 4 bytes times the optimizer's buffers fits size_t;
 *   parameters <= 2^36 (256 GiB per FP32 buffer), checked where the input
 *     width is known. */
#define TR_SPEC_MAX_SAMPLES (INT64_C(1) << 40)
#define TR_SPEC_MAX_EPOCHS (1 << 20)
#define TR_SPEC_MAX_STEPS (INT64_C(1) << 40)
#define TR_SPEC_MAX_BATCH (1 << 20)
#define TR_SPEC_MAX_WIDTH (1 << 24)
#define TR_SPEC_MAX_PARAMS (INT64_C(1) << 36)
#define TR_SPEC_MAX_SYNTH_WEIGHTS (1 << 28) /* synthetic regression: outputs x features */
#define TR_SPEC_MAX_LOAD_COST_US 1000000    /* one second per sample */
#define TR_SPEC_MAX_CHECKPOINT_KEEP 10000
#define TR_SPEC_MAX_PATIENCE 1000000
/* Free strings: a job name is echoed in every listing and log line. */
#define TR_SPEC_MAX_NAME 256  /* bytes */
#define TR_SPEC_MAX_PATH 4096 /* bytes, PATH_MAX */

enum tr_layer_type {
	TR_LAYER_DENSE,
	TR_LAYER_RELU,
	TR_LAYER_GELU,
	TR_LAYER_TANH,
	TR_LAYER_SIGMOID,
	TR_LAYER_DROPOUT,
	TR_LAYER_LAYERNORM,
	TR_LAYER_CONV2D,
	TR_LAYER_MAXPOOL2D,
	TR_LAYER_AVGPOOL2D,
	TR_LAYER_GLOBAL_AVG_POOL,
	TR_LAYER_FLATTEN,
	TR_LAYER_RESIDUAL,
	TR_LAYER_GROUPNORM,
	TR_LAYER_BATCHNORM2D,
};

/* Residual blocks nest at most this deep. */
#define TR_SPEC_MAX_DEPTH 8
/* Kernel, stride, padding and dilation of image layers are at most this;
 * image sides (model.inputs, synthetic shape) too. */
#define TR_SPEC_MAX_SIDE 65536

/* One layer as written; which fields apply depends on the type (its
 * registry entry, engine/model/layer.h).  Pairs are [h, w]. */
struct tr_layer_spec {
	enum tr_layer_type type;
	int units;       /* dense */
	bool bias;       /* dense, conv2d: default true */
	bool gelu_tanh;  /* gelu "approximate": "tanh" */
	float rate;      /* dropout, [0, 1) */
	float eps;       /* layernorm, groupnorm, batchnorm2d: default 1e-5 */
	float momentum;  /* batchnorm2d: running statistics' update, default 0.1 */
	int filters;     /* conv2d */
	int kernel[2];   /* conv2d, pools */
	int stride[2];   /* conv2d: default 1; pools: default = kernel (0 = not given) */
	int padding[2];  /* default 0 */
	bool pad_same;   /* conv2d "padding": "same" */
	int dilation[2]; /* conv2d, default 1 */
	int groups;      /* conv2d, default 1; groupnorm, required */
	/* residual: its layers, owned (tr_spec_finish frees them) */
	struct tr_layer_spec *inner;
	int n_inner;
};

enum tr_loss { TR_LOSS_SOFTMAX_CE, TR_LOSS_MSE };

enum tr_data_format { TR_DATA_CSV, TR_DATA_NPY, TR_DATA_IDX, TR_DATA_SYNTHETIC, TR_DATA_IMAGES, TR_DATA_PATCHES };

/* A built-in degradation of patches from one folder (engine/data/degrade.h). */
enum tr_degrade_type { TR_DEGRADE_NONE, TR_DEGRADE_DOWNSCALE, TR_DEGRADE_NOISE };
#define TR_DEGRADE_MAX_FACTOR 16
struct tr_degrade {
	enum tr_degrade_type type;
	int factor;  /* downscale, [2, 16] */
	float sigma; /* noise, on the 0..1 scale */
};

enum tr_synth_task { TR_SYNTH_CLASSIFICATION, TR_SYNTH_REGRESSION };

/* One data source ("train" or "validation"). */
struct tr_source_spec {
	bool present;
	enum tr_data_format format;
	/* csv */
	char *path;
	int label_cols[TR_SPEC_MAX_LABEL_COLS]; /* as written; negative from the end */
	int n_label_cols;                       /* default 1 column: -1 */
	bool header;                            /* csv: skip first line */
	/* npy */
	char *x_path, *y_path;
	/* idx */
	char *images_path, *labels_path;
	/* synthetic */
	enum tr_synth_task task;
	int64_t samples;
	int features; /* given, or C x H x W of shape */
	int shape[3]; /* "shape": [C, H, W] instead of features; shape_ndim 0 when absent */
	int shape_ndim;
	int classes;          /* classification */
	int outputs;          /* regression, default 1 */
	float noise;          /* default 0.1 */
	int64_t load_cost_us; /* default 0 */
	uint64_t data_seed;   /* "seed" inside the source; default = job seed */
	/* images ("path": a folder, one subfolder per class; "labels":
	 * "folders", the only way so far) and patches
	 * ("path", or "input_path" + "response_path": folders of images) */
	char *input_path, *response_path;
	int resize[2];             /* images: [h, w]; resize[1] == 0: shorter side to resize[0]; 0 = none */
	int center_crop[2];        /* images: [h, w]; 0 = none */
	int patch_size[2];         /* patches: [h, w] */
	int patches_per_image;     /* patches, default 1 */
	struct tr_degrade degrade; /* patches with "path" (default downscale by 2) */
	bool residual;             /* patches: "response": "residual" (response minus input) */
	/* Not from a spec: inputs for prediction, without labels (csv: every
	 * column is a feature; npy: no y; idx: no labels file).  The reader's
	 * label_dim is then 0.  images: a flat folder of image files is
	 * accepted too, and class subfolders' labels are dropped. */
	bool unlabeled;
	/* Not from a spec: the [C, H, W] every image must come out as (after
	 * resize and center_crop), the model's input when a model file is used
	 * (eval, predict); all 0: the first image's. */
	int want_shape[3];
	/* Not from a spec: images: the decoded 0..255 samples times this (a
	 * model's recorded pixel scale); 0 = 1. */
	float pixel_scale;
};

enum tr_transform_type {
	TR_TF_SCALE,
	TR_TF_STANDARDIZE,
	TR_TF_GAUSSIAN_NOISE,
	TR_TF_NORMALIZE,   /* per channel (mean, std) of an image */
	TR_TF_RANDOM_CROP, /* pad by `padding` zeros, crop back at a random offset */
	TR_TF_FLIP,        /* mirror left-right (and up-down with `vertical`), each with p = 1/2 */
	TR_TF_ROT90,       /* rotate by a random multiple of 90 degrees (square images) */
};

#define TR_SPEC_MAX_CHANNELS 4

struct tr_transform_spec {
	enum tr_transform_type type;
	float factor;                                                    /* scale */
	float std;                                                       /* gaussian_noise */
	float mean_c[TR_SPEC_MAX_CHANNELS], std_c[TR_SPEC_MAX_CHANNELS]; /* normalize */
	int n_channels;                                                  /* normalize: entries given */
	int padding;                                                     /* random_crop */
	bool vertical;                                                   /* flip */
};

enum tr_last_batch { TR_LAST_PARTIAL, TR_LAST_DROP, TR_LAST_PAD, TR_LAST_ROLLOVER };

enum tr_optim_type { TR_OPT_SGD, TR_OPT_ADAM, TR_OPT_ADAMW };

enum tr_sched_type { TR_SCHED_CONSTANT, TR_SCHED_STEP, TR_SCHED_COSINE, TR_SCHED_LINEAR };

enum tr_backend_choice { TR_BACKEND_AUTO, TR_BACKEND_CPU, TR_BACKEND_CUDA };

struct tr_monitor_spec {
	char name[64]; /* grad_norm, weight_norm, device_step_ms, update_ratio, activation_stats,
			* lr, samples_per_sec, data_wait_ms */
	int every_steps;
	bool per_layer; /* grad_norm, weight_norm: also "<name>.<layer index>" per layer with parameters */
};

/* "early_stopping": stop once `metric` has not improved by more than
 * min_delta for `patience` evaluations (engine/early_stop.h). */
struct tr_early_stop_spec {
	bool enabled;    /* the section was given */
	char metric[16]; /* loss, val_loss, val_accuracy */
	bool mode_max;   /* "max"; default: max for val_accuracy, else min */
	int patience;    /* default 5 */
	float min_delta; /* default 0 */
};

struct tr_spec {
	char *name;
	uint64_t seed; /* default 0 */
	/* model */
	int inputs;         /* elements per sample; 0 = from the data */
	int input_shape[3]; /* "inputs": [C, H, W]; input_ndim 0 when a number or absent */
	int input_ndim;
	struct tr_layer_spec layers[TR_SPEC_MAX_LAYERS];
	int n_layers;
	enum tr_loss loss;
	/* data */
	struct tr_source_spec train, validation;
	struct tr_source_spec test; /* data.test: evaluated once at the end; present = given */
	float validation_split;     /* 0 = none; in (0, 1) */
	bool shuffle;               /* default true */
	enum tr_last_batch last_batch;
	struct tr_transform_spec transforms[TR_SPEC_MAX_TRANSFORMS];
	int n_transforms;
	/* training */
	int batch_size;
	int epochs;        /* 0 = not given */
	int64_t max_steps; /* 0 = not given; at least one of the two is set */
	struct {
		enum tr_optim_type type;
		float lr;
		float momentum, dampening; /* sgd */
		bool nesterov;
		float weight_decay;      /* default 0, adamw 0.01 as torch */
		float beta1, beta2, eps; /* default 0.9, 0.999, 1e-8 */
	} optimizer;
	struct {
		enum tr_sched_type type;
		int64_t warmup_steps; /* linear warmup from 0, all types */
		int64_t step_size;    /* step: decay every step_size steps */
		float gamma;          /* step: factor, default 0.1 */
		float min_lr;         /* cosine/linear: final lr, default 0 */
	} schedule;
	float clip_grad_norm; /* 0 = off */
	bool stop_on_nan;     /* default true: a non-finite loss or gradient fails the job */
	/* "exact": the step's batch is cut into this many virtual shards,
	 * whose gradients are summed in shard order, so the result is the
	 * same bits on any device count (docs/design.md, "Exact mode");
	 * 0 = "exact": false, the float allreduce of the devices' shares. */
	int exact_shards;
	/* "exact": {"overlap": false}: with several processes, the shards'
	 * gather waits for the whole backward pass instead of going layer by
	 * layer beside it (docs/design.md, "Processes and the communicator");
	 * for comparison.  Default false: overlapped. */
	bool exact_no_overlap;
	/* "processes": ranks of `devices` devices each that run the job
	 * together (`trainerd run --processes`, docs/design.md, "Processes");
	 * more than 1 needs exact mode.  0 = not given: 1. */
	int processes;
	/* "collective_timeout_s": with several processes, the longest a
	 * process waits for the next step to finish (a rank that hangs or
	 * died) before it ends the group.  0 = not given: 300. */
	int collective_timeout_s;
	/* "max_restarts": a multi-process job the daemon runs
	 * (docs/design.md, "Multi-process jobs") whose group fails (a rank
	 * died, was killed or hung) restarts from its last checkpoint at most
	 * this many times, then fails; 0 = never.  Not given:
	 * TR_SPEC_DEFAULT_MAX_RESTARTS (max_restarts_given false). */
	int max_restarts;
	bool max_restarts_given;
	/* devices */
	int device_count; /* 0 = "all" */
	int device_ids[TR_SPEC_MAX_DEVICES];
	int n_device_ids; /* > 0 when a list was given */
	enum tr_backend_choice backend;
	bool tf32; /* "precision": "tf32" */
	/* "cpu_conv": CPU devices' conv2d route; DEFAULT = the daemon's */
	enum tr_spec_cpu_conv {
		TR_SPEC_CONV_DEFAULT,
		TR_SPEC_CONV_AUTO,
		TR_SPEC_CONV_IM2COL,
		TR_SPEC_CONV_ONEDNN
	} cpu_conv;
	/* "cpu_dense": CPU devices' dense route, the order of enum
	 * tr_cpu_gemm; AUTO (measured) unless the spec names one */
	enum tr_spec_cpu_dense { TR_SPEC_DENSE_AUTO, TR_SPEC_DENSE_OPENBLAS, TR_SPEC_DENSE_ONEDNN } cpu_dense;
	int prefetch_workers;       /* default 2 */
	int prefetch_depth;         /* default 4 */
	int log_every_steps;        /* default 1 */
	int eval_every_epochs;      /* default 1 */
	int eval_every_steps;       /* 0 = not given: also every this many steps */
	int checkpoint_every_steps; /* 0 = off */
	int checkpoint_every_seconds;
	int checkpoint_keep; /* default 3 */
	struct tr_monitor_spec monitors[TR_SPEC_MAX_MONITORS];
	int n_monitors;
	struct tr_early_stop_spec early_stopping;
	char *init_from;   /* safetensors path or NULL */
	int64_t init_job;  /* > 0: initialise from this job's checkpoint */
	int64_t init_step; /* that checkpoint's step; -1 = the newest */
	/* "resources": where the job runs (engine/spec_resources.c).  The
	 * local allocator (the default, left out of the normalized form) is
	 * this daemon's own devices; slurm submits the job to a Slurm
	 * cluster (daemon/slurm.h, docs/design.md "Slurm allocator"). */
	struct tr_resources {
		enum tr_allocator { TR_ALLOC_DEFAULT, TR_ALLOC_LOCAL, TR_ALLOC_SLURM } allocator;
		int nodes;          /* slurm: default 1 */
		int tasks_per_node; /* slurm: default 1 */
		int time_limit_s;   /* slurm: 0 = the partition's limit */
		char partition[64]; /* slurm: "" = the cluster's default */
	} resources;
};

/* Parses and validates `doc` (borrowed).  Returns 0, or -EINVAL with *err
 * filled.  On success *spec must be released with tr_spec_finish. */
int tr_spec_parse(const json_t *doc, struct tr_spec *spec, struct tr_error *err);
/* The same, recording in *all (may be NULL) every problem found, not only
 * the first, which *err holds as tr_spec_parse's does.  A field whose
 * meaning depends on a bad one (the keys of an object whose type is wrong,
 * the checks across fields) is left unchecked. */
int tr_spec_parse_all(const json_t *doc, struct tr_spec *spec, struct tr_error *err, struct tr_error_list *all);

/* Convenience: parse from text; JSON syntax errors name line and column. */
int tr_spec_parse_text(const char *text, struct tr_spec *spec, struct tr_error *err);

void tr_spec_finish(struct tr_spec *spec);

/* Returns a new reference: the spec with every default filled in. */
json_t *tr_spec_to_json(const struct tr_spec *spec);

/* Output width of the model (units of the last dense layer). */
int tr_spec_output_dim(const struct tr_spec *spec);

/* The files and folders the data sources name (not init.from), each with
 * its JSON pointer ("/data/train/path"); field points into the spec, so
 * a resolver may replace the path.  Returns how many (engine/spec_paths.c). */
#define TR_SPEC_MAX_PATHS 21 /* 3 sources x 7 keys */
struct tr_spec_path {
	char **field;
	char pointer[32];
	bool dir; /* image sources name folders */
};
int tr_spec_paths(struct tr_spec *spec, struct tr_spec_path out[TR_SPEC_MAX_PATHS]);

#endif
