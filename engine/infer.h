/* Batched inference over a data set, and the figures of an evaluation.
 *
 * tr_infer_run feeds a reader through a model in batches: the prefetch
 * pool loads and preprocesses batches in the background (transforms as at
 * inference: noise skipped), every device gets an even share of each
 * batch, as in training, and the outputs come back to a callback on the
 * calling thread, in sample order.  Used by `trainerd eval`, `trainerd
 * predict`, the daemon's evaluate jobs and a job's test source.
 *
 * tr_eval_acc collects the figures of an evaluation from outputs and
 * labels, in double: classification: loss (mean softmax cross-entropy),
 * accuracy and the confusion matrix (rows the true class, columns the
 * predicted one); regression: loss (= mse, the mean over samples and
 * outputs), mae and r2 (scikit-learn's r2_score: per output
 * 1 - SS_res/SS_tot, averaged over outputs).
 */
#ifndef TR_INFER_H
#define TR_INFER_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"
#include "engine/backend.h"
#include "engine/data/reader.h"
#include "engine/model/model.h"

struct tr_infer_options {
	const tr_model_t *model; /* borrowed */
	const float *params;     /* host weights, model->n_params floats; borrowed */
	tr_backend_t *backend;   /* borrowed */
	/* Devices to run on: ids[0..n) when n > 0, else the first `count`
	 * (0: all the backend has). */
	const int *device_ids;
	int n_device_ids;
	int count;
	tr_reader_t *reader;               /* borrowed; its features must equal the model's inputs */
	const tr_transforms_t *transforms; /* borrowed, may be NULL */
	int batch;                         /* rows per batch; 0 = 256 */
	int workers, depth;                /* loader threads (0 = 2), ring slots (0 = 4) */
	const atomic_bool *cancel;         /* may be NULL */
	/* Called on the calling thread for each batch in order: rows samples
	 * from sample index `first`, outputs rows x model->outputs floats,
	 * labels rows x label_dim (NULL when the reader has none).  A
	 * non-zero return ends the run with that code (err set by the
	 * callback through its own means). */
	int (*on_batch)(void *ctx, int64_t first, int rows, const float *outputs, const float *labels, int label_dim);
	void *ctx;
};

/* Runs the whole reader once.  Returns 0, -ECANCELED, -EINVAL with err
 * naming the file and sample for bad data (a feature count the model does
 * not take, a sample the loader could not read: a file truncated, changed
 * or unreadable), or another negative code naming the device. */
int tr_infer_run(const struct tr_infer_options *o, struct tr_error *err);

struct tr_eval_acc {
	bool classification;
	int outputs;
	int64_t n;
	double loss_sum, correct;
	int64_t *confusion; /* outputs x outputs, classification */
	/* regression, per output: sums of y - shift, its square, the error
	 * squared and absolute (shift: the first label, against cancellation) */
	double *shift, *s1, *s2, *se, *ae;
};

int tr_eval_acc_init(struct tr_eval_acc *a, bool classification, int outputs);
void tr_eval_acc_finish(struct tr_eval_acc *a);
/* Adds rows of outputs (logits or predictions) and labels.  A class label
 * outside [0, outputs) or not an integer is an error naming its sample. */
int tr_eval_acc_add(struct tr_eval_acc *a, int64_t first, int rows, const float *outputs, const float *labels,
		    struct tr_error *err);
/* The figures as a new object: {"samples", "loss", "accuracy",
 * "confusion_matrix"} or {"samples", "loss", "mse", "mae", "r2"}, with
 * `prefix` before each name but "samples" and "confusion_matrix" (e.g.
 * "test_"). r2 is null where a target is constant. */
json_t *tr_eval_acc_json(const struct tr_eval_acc *a, const char *prefix);

#endif
