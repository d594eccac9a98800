/* version.c — version queries. The number comes from the header macros, set once there. */
#include "../internal.h"

#define FL_STR2(x) #x
#define FL_STR(x) FL_STR2(x)

unsigned fl_version_number(void) { return FL_VERSION_NUMBER; }

const char* fl_version_string(void) {
#ifdef FL_WITH_CUDA
    return FL_STR(FL_VERSION_MAJOR) "." FL_STR(FL_VERSION_MINOR) "." FL_STR(FL_VERSION_PATCH) " (cuda)";
#else
    return FL_STR(FL_VERSION_MAJOR) "." FL_STR(FL_VERSION_MINOR) "." FL_STR(FL_VERSION_PATCH) " (cpu only)";
#endif
}

int fl_cuda_built(void) {
#ifdef FL_WITH_CUDA
    return 1;
#else
    return 0;
#endif
}
