"""Serving an exported model: preprocessing defined by the ONNX metadata alone, onnxruntime
providers, ``sb predict`` and the ``sb serve`` server (HTTP, and gRPC with ``--grpc-port``) for
ONNX files, learner directories and Triton model repositories.

Nothing here imports torch when the model is an ``.onnx`` file: only numpy, Pillow and
onnxruntime (plus Starlette and uvicorn for the server, and grpcio only for gRPC). A learner
directory is run in PyTorch (``sb predict``) or exported to a cached ONNX file first
(``sb serve``), and only that path imports torch.
"""
