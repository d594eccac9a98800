/* status.c — status strings and the thread-local last-error buffer.
 * The buffer is a fixed static array so recording an error can never fail. */
#include <stdarg.h>
#include <stdio.h>

#include "../internal.h"

static _Thread_local char fl__last_error[1024];

const char* fl_status_string(fl_status status) {
    switch (status) {
        case FL_OK: return "ok";
        case FL_ERR_INVALID_ARGUMENT: return "invalid argument";
        case FL_ERR_UNSUPPORTED: return "unsupported";
        case FL_ERR_OUT_OF_MEMORY: return "out of memory";
        case FL_ERR_CUDA: return "CUDA error";
        case FL_ERR_NOT_BUILT: return "not built (library compiled without CUDA)";
        case FL_ERR_TARGET_OUT_OF_RANGE: return "target out of range";
        case FL_ERR_INTERNAL: return "internal error";
        case FL_ERR_INSUFFICIENT_WORKSPACE: return "insufficient workspace";
    }
    return "unknown status";
}

const char* fl_last_error(void) { return fl__last_error; }

void fl__clear_error(void) { fl__last_error[0] = '\0'; }

fl_status fl__fail(fl_status status, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fl__last_error, sizeof fl__last_error, fmt, ap);
    va_end(ap);
    return status;
}
