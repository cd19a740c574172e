/* example_embed.c: embedding mlagen in a trainer, through include/mlagen.h only.
 *
 * Plans DeepSeek-V3's attention for rank 0 of a LAGA group of 8 ranks (S = 16384, bf16,
 * causal), prints what the trainer must allocate, then tries the forward with placeholder
 * addresses and no NCCL communicator. Without a CUDA driver the forward says so
 * (MLAGEN_ENODRIVER); with one it asks for the communicator a plan of 8 ranks needs
 * (MLAGEN_EINVAL naming mlagen_plan_set_comm): a trainer calls mlagen_plan_set_comm with
 * its ncclComm_t first. Both are the expected outcomes here; anything else exits 1.
 *
 * Build against an installed mlagen (CMake):
 *   find_package(mlagen REQUIRED)
 *   target_link_libraries(trainer PRIVATE mlagen::mlagen)
 * or by hand: cc example_embed.c -I<prefix>/include -L<prefix>/lib -Wl,-rpath,<prefix>/lib
 *   -lmlagen (the rpath, or LD_LIBRARY_PATH, lets the program find libmlagen.so.0.1) */
#include <stdio.h>
#include <string.h>

#include "mlagen.h"

static void print_tensor(const mlagen_tensor_info *t) {
  printf("  %-8s %s [", t->name,
         t->dtype == MLAGEN_DTYPE_BF16 ? "bf16" : t->dtype == MLAGEN_DTYPE_F32 ? "f32" : "?");
  for (int i = 0; i < t->ndim; i++) printf("%s%lld", i ? ", " : "", (long long)t->dims[i]);
  printf("] %zu bytes%s%s\n", t->bytes, t->passes & MLAGEN_PASS_FORWARD ? " fwd" : "",
         t->passes & MLAGEN_PASS_BACKWARD ? " bwd" : "");
}

int main(void) {
  mlagen_context *ctx = NULL;
  mlagen_model *model = NULL;
  mlagen_plan *plan = NULL;
  int rc, ok = 0;

  if ((rc = mlagen_context_create(&ctx))) {
    fprintf(stderr, "context: %s\n", mlagen_last_message(NULL));
    return 1;
  }
  if ((rc = mlagen_model_from_config(ctx, "deepseek-v3", &model))) {
    fprintf(stderr, "model: %s: %s\n", mlagen_status_name(rc), mlagen_last_message(ctx));
    goto done;
  }
  const mlagen_plan_desc desc = {.form = MLAGEN_FORM_LAGA, .batch = 1, .seq = 16384,
                                 .sp_rank = 0, .sp_size = 8, .causal = 1,
                                 .dtype = MLAGEN_DTYPE_BF16};
  if ((rc = mlagen_plan_create(ctx, model, &desc, &plan))) {
    fprintf(stderr, "plan: %s: %s\n", mlagen_status_name(rc), mlagen_last_message(ctx));
    goto done;
  }
  mlagen_sizes z;
  if ((rc = mlagen_plan_sizes(plan, &z))) {
    fprintf(stderr, "sizes: %s\n", mlagen_last_message(ctx));
    goto done;
  }
  printf("DeepSeek-V3, LAGA, S = 16384, P = 8, rank 0, bf16, causal (one layer, one rank):\n");
  printf("  workspace  %zu bytes (%.1f MiB)\n", z.workspace_bytes, z.workspace_bytes / 1048576.0);
  printf("  saved      %zu bytes (%.1f MiB), kept from forward to backward\n", z.saved_bytes,
         z.saved_bytes / 1048576.0);
  printf("  sent       %zu bytes forward, %zu backward\n", z.sent_fwd_bytes, z.sent_bwd_bytes);
  const mlagen_tensor_info *all[] = {&z.q, &z.c_kv, &z.k_rope, &z.w_kv_b, &z.o,
                                     &z.d_o, &z.dq, &z.dc_kv, &z.dk_rope, &z.dw_kv_b};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) print_tensor(all[i]);

  /* The tensors a trainer would pass: device pointers with the plan's shapes, no two
   * sharing a byte (no call works in place). Here the addresses are placeholders, laid
   * out one after another; the call checks them and stops before touching memory. */
  mlagen_tensors t = {0};
  mlagen_tensor *slots[] = {&t.q, &t.c_kv, &t.k_rope, &t.w_kv_b, &t.o,
                            &t.d_o, &t.dq, &t.dc_kv, &t.dk_rope, &t.dw_kv_b};
  size_t at = 0x10000000; /* the next free placeholder address, 256-byte aligned */
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    slots[i]->data = (void *)at;
    at += (all[i]->bytes + 255) / 256 * 256;
    slots[i]->dtype = all[i]->dtype;
    slots[i]->ndim = all[i]->ndim;
    for (int d = 0; d < all[i]->ndim; d++) slots[i]->dims[d] = all[i]->dims[d];
  }
  void *workspace = (void *)at, *saved = (void *)(at + (z.workspace_bytes + 255) / 256 * 256);
  rc = mlagen_forward(plan, &t, workspace, z.workspace_bytes, saved, z.saved_bytes, NULL);
  printf("forward: %s: %s\n", mlagen_status_name(rc), mlagen_last_message(ctx));
  ok = rc == MLAGEN_ENODRIVER ||
       (rc == MLAGEN_EINVAL && strstr(mlagen_last_message(ctx), "mlagen_plan_set_comm"));

done:
  mlagen_plan_destroy(plan);
  mlagen_model_destroy(model);
  mlagen_context_destroy(ctx);
  return ok ? 0 : 1;
}
