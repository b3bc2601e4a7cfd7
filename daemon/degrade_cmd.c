/* `trainerd degrade IN OUT --factor F | --noise SIGMA`: the built-in
 * degradation of patches training (engine/data/degrade.h) applied to whole
 * images, so test inputs are degraded exactly as training's were and a
 * model is compared with bicubic fairly.  IN is an image file (OUT: the
 * output file) or a folder of them (OUT: a folder, created, one PNG of the
 * same name per image).  Images are decoded to 0..1, degraded and written
 * as 8-bit PNGs, rounded and clipped.  Exit status: 0 done, 1 a write
 * failed, 2 bad command line or input.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/cli.h"
#include "engine/data/degrade.h"
#include "engine/data/image.h"
#include "engine/rng.h"

static void degrade_help(FILE *out)
{
	fputs("usage: trainerd degrade IN OUT (--factor F | --noise SIGMA) [--seed N]\n", out);
	if (out != stdout)
		return;
	fputs("\n"
	      "Degrades images as a patches job's \"degrade\" does, to make test inputs that\n"
	      "match training's.  IN is a PNG/JPEG file (OUT the file to write) or a folder\n"
	      "of them (OUT a folder, one PNG of the same name per image).\n"
	      "\n"
	      "  --factor F     {\"type\": \"downscale\", \"factor\": F}: bicubic down by F and\n"
	      "                 back up (MATLAB's imresize: Keys' cubic a = -0.5,\n"
	      "                 antialiased, mirrored edges)\n"
	      "  --noise SIGMA  {\"type\": \"noise\", \"sigma\": SIGMA}: Gaussian noise, SIGMA on\n"
	      "                 the 0..1 scale\n"
	      "  --seed N       the noise's seed (default 0)\n"
	      "\n"
	      "Outputs are 8-bit PNGs, rounded and clipped to 0..255.\n"
	      "Exit status: 0 done, 1 a write failed, 2 bad command line or input.\n",
	      out);
}

static int degrade_one(const struct tr_degrade *how, uint64_t key, int in_fd, const char *name, const char *shown,
		       const char *out_path)
{
	struct tr_error err;
	float *img = NULL, *deg = NULL;
	int w, h, c, status = 2;
	char tmp[PATH_MAX + 8];
	if (tr_image_load(in_fd, name, shown, 1.0f / 255.0f, &img, &w, &h, &c, &err) < 0) {
		fprintf(stderr, "trainerd degrade: %s\n", err.message);
		goto out;
	}
	status = 1;
	deg = malloc((size_t)c * h * w * sizeof(float));
	if (!deg || tr_degrade_apply(how, img, c, h, w, key, deg) < 0) {
		fprintf(stderr, "trainerd degrade: %s: out of memory\n", shown);
		goto out;
	}
	snprintf(tmp, sizeof tmp, "%s.tmp", out_path);
	FILE *f = fopen(tmp, "wb");
	if (!f) {
		fprintf(stderr, "trainerd degrade: %s: %s\n", out_path, strerror(errno));
		goto out;
	}
	int rc = tr_png_write(f, out_path, deg, c, h, w, 1.0f / 255.0f, &err);
	if (fclose(f) != 0 && rc == 0) {
		rc = -EIO;
		snprintf(err.message, sizeof err.message, "%s: %s", "write", strerror(errno));
	}
	if (rc == 0 && rename(tmp, out_path) < 0) {
		rc = -EIO;
		snprintf(err.message, sizeof err.message, "rename: %s", strerror(errno));
	}
	if (rc < 0) {
		unlink(tmp);
		fprintf(stderr, "trainerd degrade: %s: %s\n", out_path, err.message);
		goto out;
	}
	status = 0;
out:
	free(img);
	free(deg);
	return status;
}

int tr_cmd_degrade(int argc, char **argv)
{
	const char *in = NULL, *out = NULL;
	struct tr_degrade how = {0};
	unsigned long long seed = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
		char *end = NULL;
		if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			degrade_help(stdout);
			return 0;
		} else if (strcmp(a, "--factor") == 0) {
			long f = strtol(v, &end, 10);
			if (!*v || *end || f < 2 || f > TR_DEGRADE_MAX_FACTOR) {
				fprintf(stderr, "trainerd degrade: --factor needs an integer in [2, %d], got '%s'\n",
					TR_DEGRADE_MAX_FACTOR, v);
				return 2;
			}
			how = (struct tr_degrade){.type = TR_DEGRADE_DOWNSCALE, .factor = (int)f};
			i++;
		} else if (strcmp(a, "--noise") == 0) {
			double s = strtod(v, &end);
			if (!*v || *end || !(s > 0.0) || s > 1.0) {
				fprintf(stderr,
					"trainerd degrade: --noise needs a sigma in (0, 1] (the 0..1 scale), got '%s'\n",
					v);
				return 2;
			}
			how = (struct tr_degrade){.type = TR_DEGRADE_NOISE, .sigma = (float)s};
			i++;
		} else if (strcmp(a, "--seed") == 0) {
			seed = strtoull(v, &end, 10);
			if (!*v || *end) {
				fprintf(stderr, "trainerd degrade: --seed needs a non-negative integer, got '%s'\n", v);
				return 2;
			}
			i++;
		} else if (a[0] == '-' && a[1]) {
			fprintf(stderr, "trainerd degrade: unexpected argument '%s' (trainerd degrade --help)\n", a);
			return 2;
		} else if (!in) {
			in = a;
		} else if (!out) {
			out = a;
		} else {
			fprintf(stderr, "trainerd degrade: unexpected argument '%s'\n", a);
			return 2;
		}
	}
	if (!in || !out || how.type == TR_DEGRADE_NONE) {
		degrade_help(stderr);
		return 2;
	}
	struct stat st;
	if (stat(in, &st) < 0) {
		fprintf(stderr, "trainerd degrade: %s: %s\n", in, strerror(errno));
		return 2;
	}
	if (!S_ISDIR(st.st_mode)) { /* one file, in its folder */
		char dir[PATH_MAX], shown[PATH_MAX];
		snprintf(dir, sizeof dir, "%s", in);
		char *slash = strrchr(dir, '/');
		const char *name = slash ? in + (slash - dir) + 1 : in;
		if (slash)
			slash[slash == dir] = '\0';
		else
			snprintf(dir, sizeof dir, ".");
		snprintf(shown, sizeof shown, "%s", in);
		int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (fd < 0) {
			fprintf(stderr, "trainerd degrade: %s: %s\n", dir, strerror(errno));
			return 2;
		}
		int status = degrade_one(&how, tr_rng_key(seed, 0, 0, TR_RNG_NOISE), fd, name, shown, out);
		close(fd);
		return status;
	}
	int fd = open(in, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	char **names = NULL;
	int n = 0, status = 2;
	struct tr_error err;
	if (fd < 0 || tr_image_list(fd, in, 0, &names, &n, &err) < 0) {
		fprintf(stderr, "trainerd degrade: %s: %s\n", in, fd < 0 ? strerror(errno) : err.message);
		goto out;
	}
	if (n == 0) {
		fprintf(stderr, "trainerd degrade: %s: no .png or .jpg files\n", in);
		goto out;
	}
	if (mkdir(out, 0755) < 0 && errno != EEXIST) {
		fprintf(stderr, "trainerd degrade: %s: %s\n", out, strerror(errno));
		goto out;
	}
	status = 0;
	for (int i = 0; i < n && status == 0; i++) {
		char shown[2 * PATH_MAX], path[2 * PATH_MAX];
		const char *dot = strrchr(names[i], '.');
		snprintf(shown, sizeof shown, "%s/%s", in, names[i]);
		snprintf(path, sizeof path, "%s/%.*s.png", out, dot ? (int)(dot - names[i]) : (int)strlen(names[i]),
			 names[i]);
		status = degrade_one(&how, tr_rng_key(seed, 0, (uint64_t)i, TR_RNG_NOISE), fd, names[i], shown, path);
	}
out:
	tr_image_names_free(names, n);
	if (fd >= 0)
		close(fd);
	return status;
}
