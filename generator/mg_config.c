/* mg_config.c: stub, being written. */
