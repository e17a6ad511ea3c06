"""What fills the memory, buffer by buffer, read from XLA's dumps of a compiled step.

- :mod:`.explain`: ``jaxmem.explain``, for any jittable function or a preset train step.
- :mod:`.analyse`: consumers, the live set at the peak and the timeline's data, from the dump.
- :mod:`.sources`: which line and module of the user's code made a buffer.
- :mod:`.residuals`: what each remat policy saves for the backward pass, from JAX's listing.
- :mod:`.xprof`: the compiled module as an XProf logdir for its Memory Viewer.

The memory timeline (a plot file and text) is :mod:`jaxmem.render.timeline`.
"""
