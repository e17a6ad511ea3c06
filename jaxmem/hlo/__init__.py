"""Reading XLA's optimized HLO and its dumps: ``comms`` (collective bytes) and ``dump``
(buffer assignment, live ranges, the HLO text with its metadata)."""
