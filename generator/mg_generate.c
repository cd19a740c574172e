/* mg_generate.c: stub, being written. */
