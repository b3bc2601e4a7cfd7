/* The label check run once when a job's data is opened.
 *
 * A class index out of range or a regression target that is not finite
 * used to surface at the first step that drew it, in the loss, as "row 0:
 * label 16 is not an integer class": no file, no line, and possibly hours
 * in.  Reading only the label rows is cheap (csv labels are in memory,
 * npy and idx label files are a small fraction of the features), so every
 * label is checked up front and the first bad one is named with the
 * spec's JSON pointer and its file and line (docs/design.md, "Label
 * checks").  The same pass notices a label column holding a single value,
 * which trains a model that learns nothing and usually means the wrong
 * column was named.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/data/reader_internal.h"

/* Label rows read per call: bounds the buffer whatever the file size. */
#define CHUNK_ROWS 4096

static int bad_label(tr_reader_t *r, const char *pointer, int64_t index, int k, float v, int classes,
		     struct tr_error *err)
{
	char where[512];
	int dim = r->info.label_dim;

	r->i->where(r, index, where, sizeof where);
	if (classes > 0 && isfinite(v) && v == floorf(v))
		tr_error_set(err, 0, 0, NULL, "%s: %s: label %.0f is out of range: the model has %d classes, 0 to %d",
			     pointer, where, (double)v, classes, classes - 1);
	else if (classes > 0)
		tr_error_set(err, 0, 0, NULL,
			     "%s: %s: label %g is not an integer class index (the model has %d classes, 0 to %d)",
			     pointer, where, (double)v, classes, classes - 1);
	else if (dim > 1)
		tr_error_set(err, 0, 0, NULL, "%s: %s: target %d of %d is %g, not a finite number", pointer, where,
			     k + 1, dim, (double)v);
	else
		tr_error_set(err, 0, 0, NULL, "%s: %s: target %g is not a finite number", pointer, where, (double)v);
	return -EINVAL;
}

int tr_data_check_labels(tr_reader_t *r, const char *pointer, int classes, char *warn, size_t warnlen,
			 struct tr_error *err)
{
	int64_t n = r->info.samples;
	int dim = r->info.label_dim;
	float *y, *first;
	int *same, ret = 0;

	if (warn && warnlen)
		warn[0] = '\0';
	if (!r->i->labels || !r->i->where || n <= 0 || dim <= 0)
		return 0;
	y = malloc((size_t)CHUNK_ROWS * (size_t)dim * sizeof(float));
	first = malloc((size_t)dim * sizeof(float));
	same = malloc((size_t)dim * sizeof(int));
	if (!y || !first || !same) {
		tr_error_set(err, 0, 0, NULL, "%s: out of memory", pointer);
		ret = -ENOMEM;
		goto out;
	}
	for (int64_t b = 0; b < n; b += CHUNK_ROWS) {
		int64_t cnt = n - b < CHUNK_ROWS ? n - b : CHUNK_ROWS;

		ret = r->i->labels(r, b, cnt, y, err);
		if (ret < 0)
			goto out;
		if (b == 0)
			for (int k = 0; k < dim; k++) {
				first[k] = y[k];
				same[k] = 1;
			}
		for (int64_t i = 0; i < cnt; i++) {
			const float *row = y + (size_t)i * (size_t)dim;

			for (int k = 0; k < dim; k++) {
				float v = row[k];

				if (classes > 0 ? !(v >= 0 && v < (float)classes && v == floorf(v)) : !isfinite(v)) {
					ret = bad_label(r, pointer, b + i, k, v, classes, err);
					goto out;
				}
				same[k] &= v == first[k];
			}
		}
	}
	for (int k = 0; k < dim && n > 1 && warn && warnlen; k++) {
		if (!same[k])
			continue;
		if (dim == 1)
			snprintf(warn, warnlen,
				 "%s: all %lld labels are %g: a label column with a single value teaches nothing; "
				 "is it the right column?",
				 pointer, (long long)n, (double)first[k]);
		else
			snprintf(warn, warnlen,
				 "%s: target %d of %d is %g in all %lld samples: a label column with a single value "
				 "teaches nothing; is it the right column?",
				 pointer, k + 1, dim, (double)first[k], (long long)n);
		break;
	}
out:
	free(y);
	free(first);
	free(same);
	return ret;
}
