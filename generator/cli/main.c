/* main.c: `mlagen` subcommand dispatch. */
#include <stdio.h>
#include <string.h>

#include "cli.h"


static const char usage[] =
    "usage: mlagen <command> [options]\n"
    "\n"
    "Shape-specialized CUDA kernels for Multi-head Latent Attention training.\n"
    "\n"
    "commands:\n"
    "  info      print a model's attention shape and softmax scale\n"
    "  generate  render the kernels for a model into .cu files and a manifest.json\n"
    "  compile   JIT-compile the kernels with NVRTC (cached) and print what ptxas reports\n"
    "  plan      communication, memory and FLOPs of each form under sequence parallelism\n"
    "  run       execute a form on the CPU (mpirun for P ranks): memory vs plan, checks\n"
    "  tune      sweep the kernels' tunables: prune by ptxas, time on a GPU, keep the winners\n"
    "\n"
    "`mlagen <command> --help` describes a command. Models: a config.json path or a\n"
    "shipped name (deepseek-v3 (default), deepseek-v2-lite, kimi-k2).\n"
    "Exit status: 0 ok, 1 failure, 2 usage error.\n";

int main(int argc, char **argv) {
  if (argc < 2) {
    fputs(usage, stderr);
    return CLI_USAGE;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
    fputs(usage, stdout);
    return CLI_OK;
  }
  if (strcmp(cmd, "--version") == 0) {
    printf("mlagen %s\n", MLAGEN_VERSION);
    return CLI_OK;
  }
  if (strcmp(cmd, "info") == 0) return cli_info(argc, argv);
  if (strcmp(cmd, "generate") == 0) return cli_generate(argc, argv);
  if (strcmp(cmd, "compile") == 0) return cli_compile(argc, argv);
  if (strcmp(cmd, "plan") == 0) return cli_plan(argc, argv);
  if (strcmp(cmd, "run") == 0) return cli_run(argc, argv);
  if (strcmp(cmd, "tune") == 0) return cli_tune(argc, argv);
  fprintf(stderr, "mlagen: unknown command '%s'\n\n%s", cmd, usage);
  return CLI_USAGE;
}
