/* mg_spec.c: stub, being written. */
