/* mg_jit.c: stub, being written. */
