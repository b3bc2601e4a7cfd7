/* A main() for the fuzz targets without libFuzzer: runs the target once
 * on every file named on the command line (directories: every file in
 * them).  Built with the normal compiler, it replays the seed corpora in
 * the ordinary test suite, so an input that once crashed stays a test. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL;
	long size;

	if (!f) {
		perror(path);
		return -1;
	}
	if (fseek(f, 0, SEEK_END) < 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) < 0 ||
	    !(buf = malloc((size_t)size + 1)) || fread(buf, 1, (size_t)size, f) != (size_t)size) {
		fprintf(stderr, "%s: cannot read\n", path);
		free(buf);
		fclose(f);
		return -1;
	}
	fclose(f);
	LLVMFuzzerTestOneInput(buf, (size_t)size);
	free(buf);
	return 0;
}

int main(int argc, char **argv)
{
	int files = 0, failed = 0;

	for (int i = 1; i < argc; i++) {
		struct stat st;
		if (stat(argv[i], &st) < 0) {
			perror(argv[i]);
			failed++;
			continue;
		}
		if (!S_ISDIR(st.st_mode)) {
			failed += run_file(argv[i]) < 0;
			files++;
			continue;
		}
		DIR *d = opendir(argv[i]);
		struct dirent *e;
		while (d && (e = readdir(d))) {
			char path[4096];
			if (e->d_name[0] == '.')
				continue;
			snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
			failed += run_file(path) < 0;
			files++;
		}
		if (d)
			closedir(d);
	}
	printf("replayed %d inputs\n", files);
	printf("RESULT: %d passed, %d failed\n", files - failed, failed);
	return failed ? 1 : 0;
}
