/* cli_compile.c: `mlagen compile`: NVRTC-compile a model's kernels, print ptxas figures. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "mg_arch.h"
#include "mg_generate.h"
#include "mg_jit.h"
#include "mlagen.h"

static const char help[] =
    "usage: mlagen compile [--model M] [--arch LIST] [--sp P] [--dtype bf16|fp16]\n"
    "                      [--set tunable=value]... [--family F]... [--templates DIR]\n"
    "                      [--cache-dir DIR] [--no-cache] [--varlen]\n"
    "\n"
    "Generates the model's kernels (as `mlagen generate --arch` does for each\n"
    "architecture: on sm_90a attn_fwd_sm90, attn_bwd_dkdv_sm90, attn_bwd_dq_sm90 in place\n"
    "of attn_fwd, attn_bwd_dkdv, attn_bwd_dq, unless MLAGEN_MMA_SYNC=1), compiles each with\n"
    "NVRTC to a cubin for its architecture, and prints one row per kernel and arch: registers\n"
    "per thread, spill bytes (stores + loads), static and dynamic shared memory per CTA\n"
    "(bytes; the dynamic size is the launch's, from the template), the wall time of\n"
    "the call (NVRTC on a miss, the cache read on a hit) and whether the cubin came\n"
    "from the cache, then \"wgmma-serialized (C75xx)\" when ptxas serialized the\n"
    "kernel's wgmma (correct, but several times slower). No GPU is needed. Run with the\n"
    "trainer's MLAGEN_CACHE_DIR and --arch of its GPU (and --varlen for packed plans)\n"
    "before training, it compiles ahead the kernels whose configuration is the\n"
    "template's default, which the plans' first calls then read from the cache.\n"
    "\n"
    "  --arch LIST      comma-separated real targets (default sm_80,sm_90a)\n"
    "  --cache-dir DIR  JIT cache (default $MLAGEN_CACHE_DIR or ~/.cache/mlagen)\n"
    "  --no-cache       neither read nor write the cache\n"
    "  --family F       also compile F beside the family it stands in for on each arch\n"
    "                   (attn_fwd_sm90, mqa_fwd_sm90, attn_bwd_dkdv_sm90, attn_bwd_dq_sm90,\n"
    "                   mqa_bwd_dkv_sm90, mqa_bwd_dq_sm90 on sm_90a only; attn_fwd,\n"
    "                   attn_bwd_dkdv, attn_bwd_dq beside their sm_90a kernels there: see\n"
    "                   `mlagen generate --help`)\n"
    "  other options as for `mlagen generate`\n";

#define MAX_ARCH 8

int cli_compile(int argc, char **argv) {
  cli_opts o;
  int rc = cli_parse(argc, argv, "model sp dtype set family templates arch cache-dir no-cache varlen", help, &o);
  if (rc) return rc == CLI_HELP ? CLI_OK : rc;
  if ((rc = cli_kernel_dtype(&o))) return rc;
  const char *list = o.arch ? o.arch : "sm_80,sm_90a";
  char archbuf[MAX_ARCH][8];
  const char *archs[MAX_ARCH];
  int n_arch = 0;
  for (const char *p = list;; p++) {
    size_t len = strcspn(p, ",");
    if (n_arch == MAX_ARCH) {
      cli_error("--arch: at most %d architectures", MAX_ARCH);
      return CLI_USAGE;
    }
    if (len < sizeof archbuf[0]) snprintf(archbuf[n_arch], sizeof archbuf[0], "%.*s", (int)len, p);
    /* a real target NVRTC can emit a cubin for (mg_arch_sm's rule: sm_90a, sm_100f, ...) */
    if (len >= sizeof archbuf[0] || mg_arch_sm(archbuf[n_arch]) < 0) {
      cli_error("--arch: '%.*s' is not a real GPU target such as sm_80 or sm_90a (\"a\" from "
                "sm_90, \"f\" from sm_100)",
                len > 32 ? 32 : (int)len, p);
      return CLI_USAGE;
    }
    const int sm = mg_arch_sm(archbuf[n_arch]);
    if (sm >= 0 && sm < MG_ARCH_MIN_SM) {
      cli_error("--arch: " MG_ARCH_TOO_OLD_FMT, archbuf[n_arch], MG_ARCH_MIN_SM);
      return CLI_USAGE;
    }
    archs[n_arch] = archbuf[n_arch];
    n_arch++;
    p += len;
    if (*p == '\0') break;
  }

  mg_shape shape;
  mg_kernel_spec all[MG_SPEC_MAX_KERNELS];
  int n_all = 0;
  mg_gen *g;
  if ((rc = cli_prepare(&o, &shape, all, MG_SPEC_MAX_KERNELS, &n_all, &g))) return rc;

  mg_diag d = MG_DIAG_INIT;
  int n_hdr = 0;
  const mg_jit_header *hdr = mg_gen_headers(g, &n_hdr);
  int failed = 0, compiled = 0, hits = 0, usage = 0;
  /* per arch, the families its executor runs (cli_arch_specs); an invalid argument (a
   * rejected tunable, an unknown arch) would fail every kernel alike: reported once, then
   * stop. Each arch's kernels are rendered first, then compiled, so its table's kernel
   * column is as wide as its longest name (the sm_90a backward's reach 92 characters). */
  static mg_kernel ks[MG_SPEC_MAX_KERNELS]; /* ~2.5 MiB: not on the stack */
  for (int a = 0; a < n_arch && !usage; a++) {
    mg_kernel_spec specs[MG_SPEC_MAX_KERNELS];
    int n = n_all, nk = 0, width = 62;
    memcpy(specs, all, sizeof specs);
    if ((rc = cli_arch_specs(&o, archs[a], 1, specs, MG_SPEC_MAX_KERNELS, &n))) {
      mg_gen_close(g);
      return rc;
    }
    static cli_seen seen; /* ~56 KiB */
    seen.n = 0, seen.n_notes = 0;
    for (int i = 0; i < n && !usage; i++) {
      mg_kernel *k = &ks[nk];
      if ((rc = cli_render(&o, g, &specs[i], k, &seen, &d))) {
        /* named: the causal and non-causal kernels of a family fail alike */
        cli_error("%s (%s, heads %d): %s", specs[i].family,
                  specs[i].causal ? "causal" : "non-causal", specs[i].heads, mg_diag_msg(&d));
        failed++;
        usage = rc == MLAGEN_EINVAL;
        continue;
      }
      if (cli_kernel_seen(&seen, k)) { /* an arch family's fallback to a kernel already listed */
        mg_kernel_free(k);
        continue;
      }
      if ((int)strlen(k->name) > width) width = (int)strlen(k->name);
      nk++;
    }
    int header = 0; /* the arch's table header, printed before its first row (not before a refusal) */
    for (int i = 0; i < nk; i++) {
      mg_kernel *k = &ks[i];
      mg_jit_opts jo = {.arch = archs[a], .cache_dir = o.cache_dir, .no_cache = o.no_cache,
                        .template_hash = mg_gen_template_hash(g), .headers = hdr,
                        .n_headers = n_hdr};
      mg_cubin c;
      if (usage) { /* a refusal among the renders: nothing of this arch is compiled */
        mg_kernel_free(k);
        continue;
      }
      if ((rc = mg_jit_compile(k->source, k->source_len, k->file, k->name, &jo, &c, &d))) {
        cli_error("%s", mg_diag_msg(&d));
        failed++;
        usage = rc == MLAGEN_EINVAL;
      } else {
        const mg_jit_report *r = &c.report;
        if (!header++)
          printf("%-*s %-7s %5s %6s %7s %7s %8s %s\n", width, "kernel", "arch", "regs", "spill",
                 "smem", "dynsmem", "ms", "cache");
        char ser[48] = ""; /* ptxas serialized the wgmma: correct, several times slower */
        if (r->wgmma_serialized > 1)
          snprintf(ser, sizeof ser, "  wgmma-serialized (C%d)", r->wgmma_serialized);
        else if (r->wgmma_serialized)
          snprintf(ser, sizeof ser, "  wgmma-serialized");
        printf("%-*s %-7s %5d %6ld %7ld %7ld %8.1f %s%s\n", width, k->name, archs[a], r->registers,
               r->spill_stores + r->spill_loads, r->smem_bytes, (long)k->info.launch.smem,
               r->elapsed_ms, r->cache_hit ? "hit" : "miss", ser);
        if (c.warning) fprintf(stderr, "mlagen: warning: %s\n", c.warning);
        compiled++;
        hits += r->cache_hit;
        mg_cubin_free(&c);
      }
      mg_kernel_free(k);
    }
  }
  printf("%d compiled (%d from cache), %d failed\n", compiled, hits, failed);
  mg_gen_close(g);
  mg_diag_clear(&d);
  return usage ? CLI_USAGE : failed ? CLI_FAIL : CLI_OK;
}
