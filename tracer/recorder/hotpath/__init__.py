"""The hot path: what runs for every recorded op. The private dispatch mode (``_mode``), the C
extension ``_hotpath`` (built from ``csrc/hotpath/``; ``_native`` finds it) and the Python twins
that run where it is not built. The lowest room of the recorder: the others build on its types."""
