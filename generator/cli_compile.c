/* cli_compile.c: stub, being written. */
