/* A test-only fault switch for the state's storage: when the environment
 * variable TRAINERD_TEST_STORE_FAULT names a path at the first store open,
 * every SQLite file the process opens goes through a thin VFS that fails
 * each write (and sync) while a file exists at that path, as a full disk
 * would (SQLITE_FULL).  The file's first word picks the failure:
 * "readonly" answers SQLITE_READONLY (a read-only state directory), "ioerr"
 * SQLITE_IOERR_WRITE, anything else SQLITE_FULL.  Removing the file
 * "frees" the disk.
 *
 * Why a VFS: tests run as root, for whom chmod does not make a directory
 * read-only, and mounting a small file system needs privileges; this works
 * for any user and fails the very calls a full disk fails, so the store's
 * real error paths run.  It costs one stat() per write while enabled and
 * nothing otherwise (the default VFS is used unchanged).  Operators never
 * set it; docs/design.md ("Storage failures") says so.
 */
#include "storage/internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct fault_file {
	sqlite3_file base;
	sqlite3_file *real; /* allocated right after this struct */
};

static sqlite3_vfs *real_vfs;
static char *fault_path;
static sqlite3_io_methods fault_methods;

/* SQLite's error for a write now, or SQLITE_OK. */
static int fault_now(void)
{
	struct stat sb;
	if (stat(fault_path, &sb) != 0)
		return SQLITE_OK;
	char word[16] = "";
	FILE *f = fopen(fault_path, "r");
	if (f) {
		if (!fgets(word, sizeof word, f))
			word[0] = '\0';
		fclose(f);
	}
	if (strncmp(word, "readonly", 8) == 0)
		return SQLITE_READONLY;
	if (strncmp(word, "ioerr", 5) == 0)
		return SQLITE_IOERR_WRITE;
	return SQLITE_FULL;
}

#define REAL(f) (((struct fault_file *)(f))->real)

static int f_close(sqlite3_file *f)
{
	int rc = REAL(f)->pMethods ? REAL(f)->pMethods->xClose(REAL(f)) : SQLITE_OK;
	return rc;
}
static int f_read(sqlite3_file *f, void *p, int n, sqlite3_int64 off)
{
	return REAL(f)->pMethods->xRead(REAL(f), p, n, off);
}
/* SQLite reads errno for an I/O error's cause (sqlite3_system_errno). */
static int failed(int rc)
{
	errno = rc == SQLITE_FULL ? ENOSPC : rc == SQLITE_READONLY ? EROFS : EIO;
	return rc;
}

static int f_write(sqlite3_file *f, const void *p, int n, sqlite3_int64 off)
{
	int rc = fault_now();
	return rc != SQLITE_OK ? failed(rc) : REAL(f)->pMethods->xWrite(REAL(f), p, n, off);
}
static int f_truncate(sqlite3_file *f, sqlite3_int64 size)
{
	int rc = fault_now();
	return rc != SQLITE_OK ? failed(rc) : REAL(f)->pMethods->xTruncate(REAL(f), size);
}
static int f_sync(sqlite3_file *f, int flags)
{
	int rc = fault_now();
	return rc != SQLITE_OK ? failed(SQLITE_IOERR_FSYNC) : REAL(f)->pMethods->xSync(REAL(f), flags);
}
static int f_size(sqlite3_file *f, sqlite3_int64 *size)
{
	return REAL(f)->pMethods->xFileSize(REAL(f), size);
}
static int f_lock(sqlite3_file *f, int l)
{
	return REAL(f)->pMethods->xLock(REAL(f), l);
}
static int f_unlock(sqlite3_file *f, int l)
{
	return REAL(f)->pMethods->xUnlock(REAL(f), l);
}
static int f_reserved(sqlite3_file *f, int *out)
{
	return REAL(f)->pMethods->xCheckReservedLock(REAL(f), out);
}
static int f_control(sqlite3_file *f, int op, void *arg)
{
	return REAL(f)->pMethods->xFileControl(REAL(f), op, arg);
}
static int f_sector(sqlite3_file *f)
{
	return REAL(f)->pMethods->xSectorSize(REAL(f));
}
static int f_devchar(sqlite3_file *f)
{
	return REAL(f)->pMethods->xDeviceCharacteristics(REAL(f));
}
static int f_shm_map(sqlite3_file *f, int pg, int sz, int extend, void volatile **pp)
{
	return REAL(f)->pMethods->xShmMap(REAL(f), pg, sz, extend, pp);
}
static int f_shm_lock(sqlite3_file *f, int off, int n, int flags)
{
	return REAL(f)->pMethods->xShmLock(REAL(f), off, n, flags);
}
static void f_shm_barrier(sqlite3_file *f)
{
	REAL(f)->pMethods->xShmBarrier(REAL(f));
}
static int f_shm_unmap(sqlite3_file *f, int del)
{
	return REAL(f)->pMethods->xShmUnmap(REAL(f), del);
}

static int v_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *file, int flags, int *out_flags)
{
	struct fault_file *ff = (struct fault_file *)file;
	(void)vfs;
	ff->real = (sqlite3_file *)(ff + 1);
	int rc = real_vfs->xOpen(real_vfs, name, ff->real, flags, out_flags);
	/* SQLite calls xClose only when pMethods is set. */
	ff->base.pMethods = ff->real->pMethods ? &fault_methods : NULL;
	return rc;
}
static int v_delete(sqlite3_vfs *vfs, const char *name, int sync)
{
	(void)vfs;
	return real_vfs->xDelete(real_vfs, name, sync);
}
static int v_access(sqlite3_vfs *vfs, const char *name, int flags, int *out)
{
	(void)vfs;
	return real_vfs->xAccess(real_vfs, name, flags, out);
}
static int v_fullname(sqlite3_vfs *vfs, const char *name, int n, char *out)
{
	(void)vfs;
	return real_vfs->xFullPathname(real_vfs, name, n, out);
}
static void *v_dlopen(sqlite3_vfs *vfs, const char *name)
{
	(void)vfs;
	return real_vfs->xDlOpen(real_vfs, name);
}
static void v_dlerror(sqlite3_vfs *vfs, int n, char *msg)
{
	(void)vfs;
	real_vfs->xDlError(real_vfs, n, msg);
}
static void (*v_dlsym(sqlite3_vfs *vfs, void *h, const char *sym))(void)
{
	(void)vfs;
	return real_vfs->xDlSym(real_vfs, h, sym);
}
static void v_dlclose(sqlite3_vfs *vfs, void *h)
{
	(void)vfs;
	real_vfs->xDlClose(real_vfs, h);
}
static int v_random(sqlite3_vfs *vfs, int n, char *out)
{
	(void)vfs;
	return real_vfs->xRandomness(real_vfs, n, out);
}
static int v_sleep(sqlite3_vfs *vfs, int us)
{
	(void)vfs;
	return real_vfs->xSleep(real_vfs, us);
}
static int v_time(sqlite3_vfs *vfs, double *out)
{
	(void)vfs;
	return real_vfs->xCurrentTime(real_vfs, out);
}
static int v_lasterr(sqlite3_vfs *vfs, int n, char *out)
{
	(void)vfs;
	return real_vfs->xGetLastError(real_vfs, n, out);
}
static int v_time64(sqlite3_vfs *vfs, sqlite3_int64 *out)
{
	(void)vfs;
	return real_vfs->xCurrentTimeInt64(real_vfs, out);
}

static sqlite3_vfs fault_vfs;

static void install(void)
{
	const char *path = getenv("TRAINERD_TEST_STORE_FAULT");
	if (!path || !*path)
		return;
	real_vfs = sqlite3_vfs_find(NULL);
	fault_path = strdup(path);
	if (!real_vfs || !fault_path)
		return;
	/* Version 2: no xFetch/xUnfetch, so SQLite never reads through a
	 * memory map that would bypass the switch's file. */
	fault_methods = (sqlite3_io_methods){
		.iVersion = 2,
		.xClose = f_close,
		.xRead = f_read,
		.xWrite = f_write,
		.xTruncate = f_truncate,
		.xSync = f_sync,
		.xFileSize = f_size,
		.xLock = f_lock,
		.xUnlock = f_unlock,
		.xCheckReservedLock = f_reserved,
		.xFileControl = f_control,
		.xSectorSize = f_sector,
		.xDeviceCharacteristics = f_devchar,
		.xShmMap = f_shm_map,
		.xShmLock = f_shm_lock,
		.xShmBarrier = f_shm_barrier,
		.xShmUnmap = f_shm_unmap,
	};
	fault_vfs = (sqlite3_vfs){
		.iVersion = 2,
		.szOsFile = (int)sizeof(struct fault_file) + real_vfs->szOsFile,
		.mxPathname = real_vfs->mxPathname,
		.zName = "trainerd-test-fault",
		.xOpen = v_open,
		.xDelete = v_delete,
		.xAccess = v_access,
		.xFullPathname = v_fullname,
		.xDlOpen = v_dlopen,
		.xDlError = v_dlerror,
		.xDlSym = v_dlsym,
		.xDlClose = v_dlclose,
		.xRandomness = v_random,
		.xSleep = v_sleep,
		.xCurrentTime = v_time,
		.xGetLastError = v_lasterr,
		.xCurrentTimeInt64 = v_time64,
	};
	sqlite3_vfs_register(&fault_vfs, 1);
}

void tr_store_fault_install(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_once(&once, install);
}
