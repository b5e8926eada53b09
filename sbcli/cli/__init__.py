"""The Typer command line. Importing it does not import torch (``sb --help`` stays fast)."""
