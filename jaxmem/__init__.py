"""jaxmem."""
