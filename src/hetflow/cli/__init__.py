"""The ``hetflow`` command line."""
