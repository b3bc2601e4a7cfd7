/* Random-access sample readers and the transforms applied after reading.
 *
 * A reader is opened once per job (files are parsed or memory-mapped at
 * open, so format errors surface before training starts, naming file and
 * line) and then read concurrently by the loader threads: `get` must be
 * thread-safe and must not depend on call order.  Files are opened through
 * tr_data_open (roots.h) and read only through those descriptors.  Samples are returned as
 * float features plus a float label row (a class index for classification,
 * target values for regression).  Readers are a small vtable so tests can
 * supply their own (for example one that fails at a given sample).
 */
#ifndef TR_DATA_READER_H
#define TR_DATA_READER_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "engine/data/roots.h"
#include "engine/spec.h"

typedef struct tr_reader tr_reader_t;

struct tr_reader_info {
	int64_t samples;
	int features;
	int label_dim; /* floats per label row (1 for a class index) */
	/* [C, H, W] of an image sample (features == C * H * W), or all 0 for
	 * a flat vector; image layers and the spatial transforms need it. */
	int shape[3];
	/* The same for an image-shaped label row (patches), else all 0. */
	int label_shape[3];
};

struct tr_reader_i {
	/* x receives info.features floats, y info.label_dim floats.  On error
	 * returns a negative code and writes a message naming the file and the
	 * sample (or line) into err. */
	int (*get)(tr_reader_t *r, int64_t index, float *x, float *y, struct tr_error *err);
	void (*destroy)(tr_reader_t *r);
	/* Optional: 0 while the files read so far are as they were at open,
	 * else an error naming the changed file.  Called after each run of
	 * gets whose samples are about to be used, so that nothing read from a
	 * file rewritten under the job is trained on. */
	int (*check)(tr_reader_t *r, struct tr_error *err);
	/* Optional, for tr_data_check_labels: the label rows of samples
	 * [begin, begin + count) into y (count * label_dim floats), without
	 * the features; and where sample `index` lives, for messages
	 * ("file.csv:17", "y.npy: record 16").  A reader without them (a
	 * synthetic or test reader) has its labels left unchecked. */
	int (*labels)(tr_reader_t *r, int64_t begin, int64_t count, float *y, struct tr_error *err);
	void (*where)(tr_reader_t *r, int64_t index, char *buf, size_t len);
	/* Optional: `get` for a reader whose samples are drawn afresh each
	 * epoch (patches: where a patch sits), a pure function of (its seed,
	 * epoch, index).  `get` is this with epoch 0, which evaluation and
	 * statistics use so they see the same samples every time. */
	int (*get_epoch)(tr_reader_t *r, int64_t index, int64_t epoch, float *x, float *y, struct tr_error *err);
	/* Optional: the name of class `cls` (an image folder's name), NULL
	 * when the data has none.  Recorded in the model file's "labels"
	 * (docs/model-format.md). */
	const char *(*class_name)(tr_reader_t *r, int cls);
	/* Optional: sample `index`'s name relative to the source (an image's
	 * path under its folder, "cat/001.png"), for prediction output.
	 * Returns 0, or -1 for samples without names. */
	int (*sample_name)(tr_reader_t *r, int64_t index, char *buf, size_t len);
};

struct tr_reader {
	const struct tr_reader_i *i;
	struct tr_reader_info info;
	char name[256]; /* file name or "synthetic", for messages */
	/* For the job's memory estimate (engine/memory.h), set at open: the
	 * bytes the reader holds (parsed CSV, inflated gzip IDX, decoded
	 * patches images; 0 for mapped or generated data), and the most one
	 * get allocates while it runs (an image decoded and resized). */
	int64_t resident_bytes, get_scratch_bytes;
};

/* Opens `src`, its files through tr_data_open(roots, ...) (roots NULL: as
 * written, relative to the working directory).  job_seed seeds synthetic
 * data when the source has no seed of its own.  `cancel` (may be NULL)
 * interrupts a long open: it returns -ECANCELED once *cancel is set.
 * Returns 0 and *out, or a negative code with a message in err. */
int tr_reader_open(const struct tr_source_spec *src, uint64_t job_seed, const tr_data_roots_t *roots,
		   const atomic_bool *cancel, tr_reader_t **out, struct tr_error *err);

static inline int tr_reader_get(tr_reader_t *r, int64_t index, float *x, float *y, struct tr_error *err)
{
	return r->i->get(r, index, x, y, err);
}

/* The loader threads' read: sample `index` as drawn in `epoch`. */
static inline int tr_reader_get_epoch(tr_reader_t *r, int64_t index, int64_t epoch, float *x, float *y,
				      struct tr_error *err)
{
	if (r->i->get_epoch)
		return r->i->get_epoch(r, index, epoch, x, y, err);
	return r->i->get(r, index, x, y, err);
}

static inline int tr_reader_check(tr_reader_t *r, struct tr_error *err)
{
	return r->i->check ? r->i->check(r, err) : 0;
}

void tr_reader_destroy(tr_reader_t *r); /* accepts NULL */

/* Whether a model taking [C, H, W] = shape can read r's samples: r's own
 * shape must be the same, or r must be flat with C * H * W features
 * (then read as [C, H, W] in row-major order, as a reshape would).
 * Returns 0, or -EINVAL with "/model/inputs: [1, 28, 28] does not match
 * the [3, 32, 32] images of NAME" (or "the 100 features of NAME") in err.
 * For the trainer's check of the model against its data. */
int tr_reader_check_shape(const tr_reader_t *r, const int shape[3], struct tr_error *err);

/* The name of class k (an "images" reader's k-th subfolder) through the
 * reader's class_name, or NULL for a reader without names or a k out of
 * range. */
const char *tr_images_class_name(const tr_reader_t *r, int k);

/* Sleeps whatever simulated storage latency (synthetic load_cost_us) the
 * calling thread's reads have owed but not yet slept; call it after a run
 * of tr_reader_get calls whose result is about to be used, so the run is
 * ready no earlier than its samples' full cost.  Cheap when nothing is owed. */
void tr_data_pay_deferred_wait(void);

/* Checks every label of `r` once, when the data is opened, so that a bad
 * label fails the job before its first step and names its file and line
 * (docs/design.md, "Label checks").  With `classes` > 0 (a classification
 * loss) each label must be an integer in [0, classes); otherwise (a
 * regression loss) each target must be finite.  `pointer` is the spec's
 * JSON pointer of the source ("/data/train"), put first in the message.
 * Returns 0, -EINVAL with the message in err, or a reader's error.  When
 * every label has the same value, *warn (warnlen > 0) receives a warning
 * for the job's log; else it is set to "". */
int tr_data_check_labels(tr_reader_t *r, const char *pointer, int classes, char *warn, size_t warnlen,
			 struct tr_error *err);

/* A reader over samples [begin, end) of `base`, which it borrows (base
 * must outlive it).  Used for validation_split. */
tr_reader_t *tr_reader_slice(tr_reader_t *base, int64_t begin, int64_t end);

/* Transforms, in spec order.  standardize computes per-feature mean and
 * std from `train` at create time (std 0 becomes 1). */
typedef struct tr_transforms tr_transforms_t;

int tr_transforms_create(const struct tr_spec *spec, tr_reader_t *train, tr_transforms_t **out, struct tr_error *err);
/* The same, giving up with -ECANCELED once *cancel is set (NULL: never):
 * standardize reads the whole training set, which may be huge. */
int tr_transforms_create_cancellable(const struct tr_spec *spec, tr_reader_t *train, const atomic_bool *cancel,
				     tr_transforms_t **out, struct tr_error *err);
/* Applies to one sample's features in place.  Noise and augmentations
 * (random_crop, flip, rot90) are applied only when `training`; they are
 * keyed by (seed, epoch, sample index) so they are the same whichever
 * thread loads the sample. */
void tr_transforms_apply(const tr_transforms_t *t, float *x, int features, uint64_t seed, int64_t epoch,
			 int64_t sample_index, int training);
/* The same for a sample whose label row y is an image of the features'
 * height and width (patches): the spatial augmentations move y's pixels
 * exactly as x's, so input and response stay aligned; the value
 * transforms leave y alone.  y may be NULL. */
void tr_transforms_apply_pair(const tr_transforms_t *t, float *x, int features, float *y, uint64_t seed, int64_t epoch,
			      int64_t sample_index, int training);
void tr_transforms_destroy(tr_transforms_t *t);

/* What a model file records of the transforms (docs/model-format.md).
 * tr_transforms_fitted: a new reference to the values transform k learned
 * from the training data ({"mean": [...], "std": [...]} for standardize,
 * std being the divisor used, 1 where the data's was 0), or NULL for a
 * transform that learns nothing. */
json_t *tr_transforms_fitted(const tr_transforms_t *t, int k);
/* Whether a transform type only applies while training (noise): a model's
 * user skips it. */
bool tr_transforms_train_only(enum tr_transform_type type);
/* Rebuilds the transforms of spec->transforms for `features` inputs from
 * recorded values instead of training data: fitted[k] (borrowed, may be
 * NULL, as may the array) is what tr_transforms_fitted gave for transform
 * k.  Returns 0 or -EINVAL naming "transforms/<k>/..." in err. */
int tr_transforms_create_recorded(const struct tr_spec *spec, const json_t *const *fitted, int features,
				  tr_transforms_t **out, struct tr_error *err);

#endif
