"""sbcli: class-incremental learning with Split-and-Bridge from the terminal."""

__version__ = "0.1.0"
