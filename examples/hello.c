/* hello.c — the 10-line C example: fused cross-entropy on the CPU backend.
 * Build against an installed fusedloss:  cc hello.c $(pkg-config --cflags --libs fusedloss) */
#include <stdio.h>
#include <stdlib.h>
#include <fusedloss.h>

int main(void) {
    float logits[2][3] = {{2.0f, 1.0f, 0.1f}, {0.5f, 2.5f, -1.0f}}, dlogits[2][3], loss;
    long long targets[2] = {0, 1};
    fl_ce_options opts = FL_CE_OPTIONS_INIT;          /* mean over rows, ignore_index -100 */
    size_t ws_bytes;                                   /* scratch: the caller owns all memory */
    fl_cross_entropy_workspace_size(&ws_bytes, 2, 3, FL_DTYPE_F32, &opts);
    void* ws = malloc(ws_bytes);
    fl_status st = fl_cross_entropy_fused_cpu(&loss, NULL, dlogits, logits, targets, NULL, 1.0f,
                                              2, 3, 3, FL_DTYPE_F32, FL_INDEX_I64, &opts, ws, ws_bytes);
    if (st != FL_OK) { fprintf(stderr, "%s: %s\n", fl_status_string(st), fl_last_error()); return 1; }
    printf("loss = %.6f  dlogits[0] = %.4f %.4f %.4f\n", loss, dlogits[0][0], dlogits[0][1], dlogits[0][2]);
    free(ws);
    return 0;
}
