"""hetflow's version, in a module of its own: what reports and traces name, importable from
any layer."""
__version__ = "0.1.0"
