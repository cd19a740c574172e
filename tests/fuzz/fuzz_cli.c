/* fuzz_cli.c: libFuzzer harness for the CLI's options parser (cli_parse) and the two
 * subcommands that only read and print: `plan` (the planner, memory layout, --explain's
 * kernel choice) and `info`. The input's NUL-separated fields are the arguments after
 * the subcommand; the first byte picks the subcommand. stdout goes to /dev/null (run with
 * -close_fd_mask=2 to silence the error messages too). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define MAX_ARGS 64

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  return freopen("/dev/null", "w", stdout) ? 0 : -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 4096) return 0;
  int which = data[0] % 3;
  char *buf = malloc(size);
  if (!buf) return 0;
  memcpy(buf, data + 1, size - 1);
  buf[size - 1] = '\0';
  char *argv[MAX_ARGS + 3];
  int argc = 0;
  argv[argc++] = "mlagen";
  argv[argc++] = which == 2 ? "info" : "plan";
  for (char *p = buf; p < buf + size - 1 && argc < MAX_ARGS + 2; p += strlen(p) + 1)
    argv[argc++] = p;
  argv[argc] = NULL;
  if (which == 0) {
    cli_opts o;
    cli_parse(argc, argv, "model templates dtype sp set out arch cache-dir no-cache backend form "
              "inputs dump check seed batch seq causal no-causal json steps explain device "
              "dry-run family min-warps head-groups cp-head-groups", "help\n", &o);
  } else if (which == 1) {
    cli_plan(argc, argv);
  } else {
    cli_info(argc, argv);
  }
  fflush(stdout);
  free(buf);
  return 0;
}
