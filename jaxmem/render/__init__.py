"""Turning results into text: ``units`` (the display unit), ``tables`` (rows in every format),
``explain`` and ``inference`` (those commands' output). The library never prints; these build
strings the CLI writes."""
