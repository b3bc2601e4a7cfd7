/* The self-description every model file and checkpoint carries.
 *
 * A weights file alone is not enough to use a model: the layers, the loss,
 * the preprocessing it was trained with (scale factors, standardisation
 * statistics fitted on the training data) and what its outputs mean. These
 * go into the safetensors `__metadata__` (an object of strings, so the
 * structured parts are JSON text) under the keys of docs/model-format.md:
 *
 *   "trainerd_model_format"  "1"
 *   "trainerd_version"       the build that wrote it
 *   "model"                  {"inputs": N, "layers": [...], "loss": "..."}
 *   "preprocessing"          {"features": N, "transforms": [...],
 *                             "pixels": {...}} (image data: pixel scale,
 *                             channels, degradation, response)
 *   "labels"                 {"task": "classification", "classes": K,
 *                             "class_names": [...] | null} or
 *                            {"task": "regression", "outputs": K}
 *
 * trainerd's own readers (eval, predict, the daemon's evaluate jobs) and
 * the examples in examples/ read the same keys back.
 */
#ifndef TR_MODEL_META_H
#define TR_MODEL_META_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "core/error.h"
#include "engine/data/degrade.h"
#include "engine/data/reader.h"
#include "engine/model/model.h"
#include "engine/spec.h"

#define TR_MODEL_FORMAT_VERSION "1"

/* Adds the description keys to `meta` (an object, borrowed and modified):
 * the model section of `spec` with the input width `m` was built for, the
 * transforms with what `tf` fitted (may be NULL when the spec has none),
 * and the label meaning, with class names when `train` (may be NULL) has
 * them.  Returns 0 or -ENOMEM with err set. */
int tr_model_meta_describe(json_t *meta, const struct tr_spec *spec, const tr_model_t *m, const tr_transforms_t *tf,
			   tr_reader_t *train, struct tr_error *err);

/* What a model trained on image files expects of an image
 * (preprocessing.pixels): a decoded image's 0..255 samples times `scale`,
 * `channels` of them, and for image-to-image models (patches) the
 * degradation its inputs had and whether its output is the residual, to
 * be added back to its input. */
struct tr_pixels {
	bool present;
	float scale;
	int channels;
	bool image_to_image;       /* trained on patches: the output is an image */
	struct tr_degrade degrade; /* TR_DEGRADE_NONE: paired folders, none built in */
	bool residual;
};

/* A model read back from its description and weights. */
struct tr_model_desc {
	struct tr_spec spec;         /* the model section and transforms; no data */
	tr_model_t model;            /* the layout */
	tr_transforms_t *transforms; /* with the recorded values; NULL when none */
	bool classification;         /* softmax_cross_entropy: outputs are class logits */
	int outputs;                 /* classes, or regression outputs */
	char **class_names;          /* NULL, or `outputs` strings */
	char version[64];            /* trainerd_version, "" when absent */
	struct tr_pixels pixels;     /* present = false when not recorded */
	/* Fully convolutional (tr_model_fully_conv): runs on any H x W of at
	 * least 2 * radius + 1, in tiles. */
	bool free_hw;
	int radius;
	float *params; /* host weights, model.n_params floats; NULL until loaded */
};

/* Whether the layers of spec (and transforms) allow any spatial size with
 * an output of the input's H x W: only convolutions of stride 1 that keep
 * the size, pointwise layers (activations, dropout, batchnorm2d) and
 * residual blocks of them, and no standardize (fitted per feature).  Sets
 * *radius to how far an output pixel sees on each side. */
bool tr_model_fully_conv(const struct tr_spec *spec, int *radius);

/* Refuses (-EINVAL, err saying what is missing) a model that cannot be run
 * on image files without guessing: one taking [C, H, W] without a
 * recorded "pixels" entry. */
int tr_model_desc_need_pixels(const struct tr_model_desc *d, struct tr_error *err);

/* Fills d from a file's metadata (borrowed).  Errors name the key
 * ("model file: preprocessing: transforms/0: ...").  Release with
 * tr_model_desc_finish, also after an error. */
int tr_model_desc_from_meta(const json_t *meta, struct tr_model_desc *d, struct tr_error *err);
void tr_model_desc_finish(struct tr_model_desc *d);

/* Parses a data source (borrowed, as a job's data.train: csv, npy, idx,
 * synthetic) for the model d describes, through the job spec parser, so it
 * is checked exactly as a job's is; `model` (borrowed, may be NULL: d's
 * own) is the model section to check it against.  The source lands in
 * out->train (release with tr_spec_finish).  Errors name the pointer inside
 * the source ("/path: is required", "" for the source itself). */
int tr_model_source_parse(const json_t *model, const struct tr_model_desc *d, const json_t *src, struct tr_spec *out,
			  struct tr_error *err);

/* For an image folder source (format images) and a model taking
 * [C, H, W]: sets src->want_shape to it, so that the reader refuses at
 * open, naming the file and both shapes, an image that would not come out
 * as the model's input (the model file records no resize or crop). */
void tr_model_desc_want_shape(const struct tr_model_desc *d, struct tr_source_spec *src);

/* Prepares a data source for the model: tr_model_desc_want_shape, and for
 * image files (images, idx, patches) the recorded pixels: refused without
 * them (tr_model_desc_need_pixels), the images reader set to the recorded
 * pixel scale, an IDX file refused for a scale other than 1, patches
 * refused unless their degradation and response are the model's.
 * Returns 0 or -EINVAL with the reason in err. */
int tr_model_desc_source(const struct tr_model_desc *d, struct tr_source_spec *src, struct tr_error *err);

/* Whether the class names of rd (an image folder's subfolders) are the
 * model's, class k for class k, when the model recorded names: returns 0,
 * or -EINVAL with "the class folders do not match the model's classes:
 * class 1 is 'dots' in the data, 'down' in the model" in err.  Data
 * lacking the model's last classes passes. */
int tr_model_desc_check_classes(const struct tr_model_desc *d, tr_reader_t *rd, struct tr_error *err);

/* Reads a model file (model.safetensors or a checkpoint: the parameters
 * under their PyTorch names; optimizer state is ignored) into d,
 * description and weights.  `label` names the image in messages. */
int tr_model_desc_load_mem(const void *data, size_t len, const char *label, struct tr_model_desc *d,
			   struct tr_error *err);
/* The same from a path, opened as written (a person's own file). */
int tr_model_desc_load(const char *path, struct tr_model_desc *d, struct tr_error *err);

#endif
