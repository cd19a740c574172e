/* mg_render.c: stub, being written. */
