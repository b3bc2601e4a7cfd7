/* Fuzz target: the daemon's config file reader and the token file reader
 * (trainerd serve --config, token-file).  Both read from a path, so the
 * input goes into a memory file opened through /proc/self/fd. */
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/config.h"
#include "daemon/tokens.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int fd = -1;
	char path[64];
	struct tr_config c;
	struct tr_token_list tokens;

	if (fd < 0 && (fd = memfd_create("trainerd-fuzz", 0)) < 0)
		return 0;
	/* The token file must be private to its owner. */
	fchmod(fd, 0600);
	if (ftruncate(fd, 0) < 0 || pwrite(fd, data, size, 0) != (ssize_t)size)
		return 0;
	snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
	tr_config_defaults(&c);
	struct tr_error cerr;
	(void)tr_config_load_file(&c, path, &cerr);
	tr_config_finish(&c);
	if (tr_tokens_load(path, &tokens, &cerr) == 0)
		tr_tokens_finish(&tokens);
	return 0;
}
