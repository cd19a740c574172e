/*
 * mlagen.h: the public C interface of mlagen, shape-specialized CUDA kernels for
 * Multi-head Latent Attention (MLA) training.
 *
 * Every function that can fail returns an int status: 0 (MLAGEN_OK) on success or a
 * negative MLAGEN_E* code. mlagen_strerror() names a code; the detailed message (NVRTC
 * log, Lua traceback, config file and key) is kept by the object that failed.
 */
#ifndef MLAGEN_H
#define MLAGEN_H

#ifdef __cplusplus
extern "C" {
#endif

#define MLAGEN_VERSION_MAJOR 0
#define MLAGEN_VERSION_MINOR 1
#define MLAGEN_VERSION_PATCH 0

/* X(name, value, description): the one table of status codes. */
#define MLAGEN_STATUS_MAP(X)                                                        \
  X(OK, 0, "success")                                                               \
  X(EINVAL, -1, "invalid argument")                                                 \
  X(ENOMEM, -2, "out of memory")                                                    \
  X(EIO, -3, "file system error")                                                   \
  X(ECONFIG, -4, "invalid model config")                                            \
  X(EUNSUPPORTED, -5, "shape not supported by the kernels")                         \
  X(ETEMPLATE, -6, "template error")                                                \
  X(ECOMPILE, -7, "NVRTC compilation failed")                                       \
  X(ECACHE, -8, "JIT cache error")                                                  \
  X(ENODRIVER, -9, "no CUDA driver")                                                \
  X(ENONCCL, -10, "mlagen was built without NCCL")                                  \
  X(ELIMIT, -11, "resource limit exceeded")

enum mlagen_status {
#define MLAGEN__ENUM(name, value, text) MLAGEN_##name = value,
  MLAGEN_STATUS_MAP(MLAGEN__ENUM)
#undef MLAGEN__ENUM
};

/* Short English description of a status code; "unknown status" for other values.
 * The returned string is static. */
const char *mlagen_strerror(int status);

/* Name of a status code ("MLAGEN_EINVAL"); "MLAGEN_UNKNOWN" for other values. */
const char *mlagen_status_name(int status);

#ifdef __cplusplus
}
#endif
#endif /* MLAGEN_H */
