"""Turning results into text and figures: ``units`` (the display unit), ``tables`` (rows in every
format), ``explain`` and ``inference`` (those commands' output), ``timeline``, ``infer_plot``,
``scale_plot`` and ``plan`` (the plots). The library never prints; these build strings and files
the CLI writes."""
