"""The package's version: read by the build (pyproject.toml) and by ``onednn_convt.__version__``."""

__version__ = "0.1.0"
