/* main.c: the consumer of an installed mlagen (tests/consumer/). */
#include <mlagen.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  if (strcmp(mlagen_strerror(MLAGEN_ENODRIVER), "no CUDA driver") != 0) return 1;
  mlagen_context *ctx = NULL;
  if (mlagen_context_create(&ctx) != MLAGEN_OK || !ctx) {
    fprintf(stderr, "consumer: %s\n", mlagen_last_message(NULL));
    return 1;
  }
  mlagen_model *m = NULL;
  int rc = mlagen_model_from_config(ctx, "deepseek-v2-lite", &m);
  if (rc) fprintf(stderr, "consumer: %s\n", mlagen_last_message(ctx));
  mlagen_model_destroy(m);
  mlagen_context_destroy(ctx);
  if (rc) return 1;
  printf("consumer: linked mlagen %d.%d.%d: %s\n", MLAGEN_VERSION_MAJOR, MLAGEN_VERSION_MINOR,
         MLAGEN_VERSION_PATCH, mlagen_strerror(MLAGEN_OK));
  return 0;
}
