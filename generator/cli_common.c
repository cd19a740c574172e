/* cli_common.c: stub, being written. */
