/* mg_errors.c: names and descriptions of status codes, from MLAGEN_STATUS_MAP. */
#include "mlagen.h"

const char *mlagen_strerror(int status) {
  switch (status) {
#define MLAGEN__TEXT(name, value, text) case value: return text;
    MLAGEN_STATUS_MAP(MLAGEN__TEXT)
#undef MLAGEN__TEXT
  }
  return "unknown status";
}

const char *mlagen_status_name(int status) {
  switch (status) {
#define MLAGEN__NAME(name, value, text) case value: return "MLAGEN_" #name;
    MLAGEN_STATUS_MAP(MLAGEN__NAME)
#undef MLAGEN__NAME
  }
  return "MLAGEN_UNKNOWN";
}
