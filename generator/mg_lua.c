/* mg_lua.c: stub, being written. */
