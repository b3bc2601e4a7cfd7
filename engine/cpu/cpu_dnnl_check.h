/* DN(call, what): a oneDNN call checked in the CPU backend's oneDNN files
 * (cpu_dnnl_conv.c, cpu_dnnl_gemm.c).  On a status other than success it
 * sets `err` (a struct tr_error * in scope) to name the call and its
 * status, and jumps to the function's `fail` label. */
#ifndef TR_CPU_DNNL_CHECK_H
#define TR_CPU_DNNL_CHECK_H

#define DN(call, what)                                                                                  \
	do {                                                                                            \
		dnnl_status_t st_ = (call);                                                             \
		if (st_ != dnnl_success) {                                                              \
			tr_error_set(err, 0, 0, NULL, "oneDNN: %s failed (status %d)", what, (int)st_); \
			goto fail;                                                                      \
		}                                                                                       \
	} while (0)

#endif
