/* cli_generate.c: stub, being written. */
